"""The pool of loader worker processes, seen from the main process (their loop: ``_worker``).

Each worker has its own task pipe and result pipe (no lock shared between workers, so a worker
killed mid-message cannot wedge the others). The main process waits on the result pipes and the
workers' sentinels together, which is what turns a SIGKILLed worker into an error within one
wake-up rather than a hang. Small messages travel (see ``_messages``): a task with indices and a
seed one way, ``(batch, slot, rows)`` and the batch's non-array leaves the other; arrays are
written into the shared ring (``_ring``), whose slots and generations a ``SlotPool`` keeps.

Until the ring exists (its layout is learned from the first batch a worker makes) each worker has
at most one task out, without a slot; those few batches come back pickled.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from ... import cuda
from ...errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError  # noqa: F401 - old import paths
from .maker import BatchMaker, make_worker_error
from .messages import (
    NO_SLOT,
    BatchFailed,
    Exhausted,
    FromWorker,
    InitFailed,
    Ok,
    Restore,
    RingMsg,
    Stop,
    StreamState,
    Task,
    ToWorker,
    Whole,
)
from ..ring.ring import Ring
from ..ring.slots import HostBatch, SlotPool
from .._stats import Clock
from ..ring.tree import split
from .serve import WorkerInfo, WorkerSpec, get_worker_info, worker_main, worker_seed  # noqa: F401 - old import paths

# ---------------------------------------------------------------- the pool, seen from the main process


@dataclass
class _Worker:
    id: int
    process: Any
    tasks: Connection
    results: Connection
    outstanding: int = 0


@dataclass(frozen=True)
class Failed:
    """A batch a worker could not make: raise ``error`` when its turn to be delivered comes."""

    batch_index: int
    error: WorkerError


@dataclass(frozen=True)
class Ended:
    """Worker ``worker_id``'s stream ran out: task ``batch_index`` has no batch, and no later task of it will."""

    batch_index: int
    worker_id: int


@dataclass(frozen=True)
class Noted:
    """Worker ``worker_id``'s dataset state right after it made stream task ``batch_index``."""

    batch_index: int
    worker_id: int
    state: Any


Result = HostBatch | Failed | Ended | Noted
SHUTDOWN_GRACE_S = 1.0


def context_of(start_method: str | BaseContext) -> Any:
    """A concrete multiprocessing context (it has Process and Pipe) from a start method or a context."""
    return mp.get_context(start_method) if isinstance(start_method, str) else start_method


class Dispatch:
    """Which worker gets the next task, shared by the process and the thread pool.

    Only the first ``active`` workers get tasks (online tuning parks the others, alive and idle);
    ``slot_cap`` bounds the ring slots taken at once (None: the whole ring); before the ring exists
    a worker takes one task at a time, without a slot. Subclasses keep ``_workers`` (each with
    ``id`` and ``outstanding``), ``slots`` and ``prefetch_factor``.
    """

    slots: SlotPool
    prefetch_factor: int
    _workers: list[Any]
    _rr = 0
    _closed = False
    active = 0
    slot_cap: int | None = None
    clock: Clock | None = None  # the loader's figures: each answer's stage seconds (``_stats``)
    last_worker: int | None = None  # the worker ``_choose`` picked last: who has a task (stall warnings)

    def worker_label(self, worker_id: int) -> str:
        """How a stall warning names a worker."""
        return f"loader worker {worker_id}"

    def _clock(self, msg: FromWorker) -> None:
        if self.clock is not None and isinstance(msg, (Ok, Whole)):
            self.clock.add(msg.times)

    def _answer(self, w: Any, pid: int, msg: FromWorker) -> Result | None:
        """A worker's answer to a task, the same for processes and threads: a batch to deliver, a
        failure to raise in turn, an ended stream, a stream's state, or nothing (stale)."""
        if isinstance(msg, InitFailed):
            raise make_worker_error(msg.report, worker_id=w.id, pid=pid, batch_index=None)
        if isinstance(msg, StreamState):
            return Noted(msg.batch_index, w.id, msg.state) if self.slots.is_current(msg.generation) else None
        w.outstanding -= 1
        self._clock(msg)
        slots = self.slots
        if isinstance(msg, Ok):
            if not slots.accept(msg.generation, msg.slot):
                return None  # made for an abandoned epoch: its slot is free again
            return slots.batch(msg.batch_index, msg.slot, msg.rows, msg.objects)
        if msg.slot != NO_SLOT:
            slots.release(msg.slot)
        if not slots.is_current(msg.generation):
            return None
        if isinstance(msg, Whole):
            treedef, arrays, objects = split(msg.batch)
            return HostBatch(msg.batch_index, None, msg.rows, arrays, treedef, objects)
        if isinstance(msg, Exhausted):
            return Ended(msg.batch_index, w.id)
        if isinstance(msg, BatchFailed):
            error = make_worker_error(msg.report, worker_id=w.id, pid=pid, batch_index=msg.batch_index)
            return Failed(msg.batch_index, error)
        return None

    @property
    def size(self) -> int:
        return len(self._workers)

    def idle_workers(self) -> int:
        """Active workers with no task out."""
        return sum(w.outstanding == 0 for w in self._workers[:self.active])

    def submit(self, batch_index: int, indices: np.ndarray | None, tseed: int, worker: int | None = None) -> bool:
        """Queue a batch on ``worker`` (or the least busy one); False when no slot or capacity is free.

        Before the ring exists a worker takes one task at a time, without a slot.
        """
        if not self._workers or self._closed:
            return False
        w = self._choose(worker)
        if w is None:
            return False
        slot = self.slots.take() if self.slots.ring is not None else NO_SLOT
        assert slot is not None  # checked free by _choose
        try:
            self._deliver(w, Task(self.slots.generation, batch_index, slot, indices, tseed))
        except BaseException:
            if slot != NO_SLOT:
                self.slots.give_back(slot)
            raise
        w.outstanding += 1
        return True

    def _deliver(self, w: Any, task: Task) -> None:
        """Hand ``task`` to worker ``w`` (a pipe for a process, a queue for a thread)."""
        raise NotImplementedError

    def _choose(self, worker: int | None) -> Any:
        """The worker to take the next task (``worker`` if given), or None when no slot or capacity is free."""
        ring, cap = self.slots.ring, self.slot_cap
        if ring is not None and (not self.slots.free or (cap is not None and ring.slots - len(self.slots.free) >= cap)):
            return None
        n = min(self.active, len(self._workers))
        if worker is None:
            w = min((self._workers[(self._rr + k) % n] for k in range(n)), key=lambda x: x.outstanding)
        else:
            w = self._workers[worker]
        per_worker = max(self.prefetch_factor, -(-cap // n)) if cap is not None else self.prefetch_factor
        if w.outstanding >= (per_worker if ring is not None else 1):
            return None
        self._rr = (w.id + 1) % n
        self.last_worker = w.id
        return w


class WorkerPool(Dispatch):
    """``num_workers`` processes, and the slot pool of the ring they write into once it exists.

    ``maker`` (pickled to each worker with forkserver or spawn) makes the batches; ``seed`` is the
    loader's, each worker's own is drawn from it, the worker id and ``epoch``.
    """

    def __init__(self, *, maker: BatchMaker, num_workers: int, prefetch_factor: int, seed: int,
                 worker_init_fn: Callable | None, start_method: str | BaseContext, epoch: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        self.prefetch_factor = prefetch_factor
        self.slots = SlotPool(None)
        self._closed = False
        self._workers: list[_Worker] = []
        self._ctx = context_of(start_method)
        self._spec = (num_workers, seed, epoch, maker, worker_init_fn, rank, world_size)
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(["__main__", "cupy_nwt.loader.workers.process"])
        try:
            for w in range(num_workers):
                self._start(w)
        except BaseException:
            self.shutdown()
            raise
        self.active = num_workers  # workers given tasks; the others are parked (alive, idle)

    def _start(self, w: int) -> None:
        num_workers, seed, epoch, maker, worker_init_fn, rank, world_size = self._spec
        ctx, method = self._ctx, self._ctx.get_start_method()
        spec = WorkerSpec(w, max(num_workers, w + 1), worker_seed(seed, w, epoch), maker, worker_init_fn, rank,
                          world_size)
        task_r, task_w = ctx.Pipe(duplex=False)
        res_r, res_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=worker_main, args=(spec, task_r, res_w), name=f"cupy_nwt-worker-{w}", daemon=True)
        try:
            proc.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            for c in (task_r, task_w, res_r, res_w):
                c.close()
            raise LoaderError(
                f"start_method={method!r} sends the dataset, collate_fn, batch_transform and "
                f"worker_init_fn to each worker by pickling, and that failed: {exc}. Define them at module "
                "level, or use start_method='fork' where CUDA is not initialised in this process"
            ) from exc
        task_r.close()
        res_w.close()
        self._workers.append(_Worker(w, proc, task_w, res_r))

    def set_active(self, n: int) -> None:
        """Give tasks to the first ``n`` workers: un-park parked ones, start more processes if needed."""
        while self.size < n:
            self._start(self.size)
            ring = self.slots.ring
            if ring is not None and ring.name is not None:
                self._send(self._workers[-1], RingMsg(ring.name, ring.layout, ring.slots))
        self.active = max(1, n)

    # -- the ring

    def attach(self, ring: Ring) -> None:
        """Hand the workers the ring, once its layout is known; the pool's slots are then its slots."""
        if ring.name is None:
            raise LoaderError("internal error: workers can only attach to a ring in /dev/shm")
        self.slots.attach(ring)
        for w in self._workers:
            self._send(w, RingMsg(ring.name, ring.layout, ring.slots))

    # -- tasks and results

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.is_alive()]

    def worker_label(self, worker_id: int) -> str:
        return f"loader worker {worker_id} (pid {self._workers[worker_id].process.pid})"

    def _deliver(self, w: _Worker, task: Task) -> None:
        self._send(w, task)

    def restore(self, per_worker: dict[int, tuple[Any, int]]) -> None:
        """Before a resumed stream's tasks: each worker's dataset state (or batches to skip), by worker id."""
        for w in self._workers:
            if w.id in per_worker:
                self._send(w, Restore(*per_worker[w.id]))

    def _send(self, w: _Worker, msg: ToWorker) -> None:
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._raise_if_dead(timeout=1.0)
            raise LoaderError(f"could not reach loader worker {w.id} (pid {w.process.pid})") from None

    def collect(self, timeout: float | None) -> list[Result]:
        """Wait up to ``timeout`` s for results; raise at once if a worker died or failed to start."""
        conns = [w.results for w in self._workers]
        sentinels = [w.process.sentinel for w in self._workers]
        wait(conns + sentinels, timeout)
        out: list[Result] = []
        for w in self._workers:
            while True:
                try:
                    if not w.results.poll():
                        break
                    msg = w.results.recv()
                except (EOFError, OSError):
                    break
                item = self._absorb(w, msg)
                if item is not None:
                    out.append(item)
        self._raise_if_dead(timeout=0.0)
        return out

    def _absorb(self, w: _Worker, msg: FromWorker) -> Result | None:
        """A worker's answer (see ``Dispatch._answer``)."""
        return self._answer(w, w.process.pid, msg)

    def _raise_if_dead(self, timeout: float) -> None:
        for w in self._workers:
            if w.process.is_alive():
                continue
            w.process.join(timeout if timeout > 0 else 1.0)  # reap it so the exit code is known
            self._raise_init_error(w)
            code = w.process.exitcode
            if code is not None and code < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
                hint = " (SIGKILL often means the kernel's out-of-memory killer)" if code == -signal.SIGKILL else ""
            else:
                how, hint = f"exited unexpectedly with exit code {code}", ""
            raise WorkerDiedError(f"loader worker {w.id} (pid {w.process.pid}) {how}{hint}",
                                  worker_id=w.id, pid=w.process.pid, exitcode=code)

    def _raise_init_error(self, w: _Worker) -> None:
        """A worker whose worker_init_fn failed reported why before exiting: prefer that reason."""
        try:
            while w.results.poll():
                msg = w.results.recv()
                if isinstance(msg, InitFailed):
                    raise make_worker_error(msg.report, worker_id=w.id, pid=w.process.pid, batch_index=None)
        except (EOFError, OSError):
            pass

    # -- shutdown

    def shutdown(self) -> None:
        """Stop every worker: ask, wait up to SHUTDOWN_GRACE_S, then SIGTERM, then SIGKILL. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.slots.retire()  # queued tasks are skipped, not computed
        for w in self._workers:
            try:
                w.tasks.send(Stop())
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for w in self._workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self._workers:
            if w.process.is_alive():
                w.process.terminate()
        for w in self._workers:
            w.process.join(1.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        for w in self._workers:
            w.tasks.close()
            w.results.close()
            w.process.close()
        self._workers = []

    @property
    def closed(self) -> bool:
        return self._closed


def default_start_method(device: str) -> str:
    """``forkserver`` when CUDA is (or will be) live in this process, else ``fork``.

    A forked child of a process with a CUDA context must not use CUDA, and page-locked memory is
    mapped don't-fork; forkserver children come from a clean server process instead. The price is
    that the dataset and callables are pickled to each worker. Without CUDA, fork is the fastest to
    start and shares the dataset copy-on-write.
    """
    if device == "cuda" or cuda.cuda_may_be_initialized():
        return "forkserver"
    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"

