"""Loader worker processes: the loop that runs in each worker, and the pool that drives them.

Each worker has its own task pipe and result pipe (no lock shared between workers, so a worker
killed mid-message cannot wedge the others). The main process waits on the result pipes and the
workers' sentinels together, which is what turns a SIGKILLed worker into an error within one
wake-up rather than a hang. Only small messages travel (see ``messages``): a task with indices and a
seed one way, ``(batch, slot, rows)`` the other; batch payloads are written into the shared ring
(see ``shm``), whose slots and generations the main process keeps in a ``slots.SlotPool``.

Workers never touch CUDA: they import neither CuPy nor anything that does.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from .. import cuda
from ..errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError  # noqa: F401 - old import paths
from ._collate import BatchLayoutError, collate_into, default_collate, flatten
from ._messages import BatchFailed, ErrorReport, FromWorker, InitFailed, Ok, RingMsg, Skipped, Stop, Task, ToWorker
from ._ring import Ring, SlotLayout
from ._slots import HostBatch, SlotPool


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (``None`` in the main process)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's id, the number of workers, its seed and its dataset copy; ``None`` outside."""
    return _worker_info


# ---------------------------------------------------------------- making one batch (worker or main)


class BatchMaker:
    """Fetch -> collate -> transform for one batch; remembers which sample it was fetching."""

    def __init__(self, dataset: Any, collate_fn: Callable | None, batch_transform: Callable | None) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_transform = batch_transform
        self.current: int | None = None

    def fetch(self, indices: np.ndarray) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            self.current = None
            samples = getitems(indices.tolist())
            if len(samples) != len(indices):
                raise ValueError(f"__getitems__ returned {len(samples)} samples for {len(indices)} indices")
            return list(samples)
        out = []
        for i in indices.tolist():
            self.current = i
            out.append(self.dataset[i])
        self.current = None
        return out

    def make(self, indices: np.ndarray, seed: int) -> Any:
        """A new batch in fresh arrays (the first batch, and ``num_workers=0`` on the CPU)."""
        samples = self.fetch(indices)
        batch = self.collate_fn(samples) if self.collate_fn is not None else default_collate(samples, indices)
        if self.batch_transform is not None:
            batch = self.batch_transform(batch, seed)
        return batch

    def make_checked(self, indices: np.ndarray, seed: int, layout: SlotLayout, batch_index: int) -> list[np.ndarray]:
        leaves, treedef = flatten(self.make(indices, seed))
        return layout.check(leaves, treedef, len(indices), batch_index)

    def fill(self, indices: np.ndarray, seed: int, layout: SlotLayout, out: Sequence[np.ndarray], batch_index: int) -> None:
        """Write the batch into ``out`` (a slot's field views); default collation writes in place."""
        if self.collate_fn is None and self.batch_transform is None:
            collate_into(self.fetch(indices), indices, layout.treedef, out)
            return
        for dst, src in zip(out, self.make_checked(indices, seed, layout, batch_index)):
            np.copyto(dst, src)

    def failed_index(self, exc: BaseException) -> int | None:
        if isinstance(exc, BatchLayoutError):
            return exc.sample_index
        return self.current


def make_worker_error(report: ErrorReport, *, worker_id: int | None, pid: int, batch_index: int | None) -> WorkerError:
    where = "the main process" if worker_id is None else f"loader worker {worker_id} (pid {pid})"
    what = f"batch {batch_index}" if batch_index is not None else "worker_init_fn"
    at = f" at sample index {report.sample_index}" if report.sample_index is not None else ""
    msg = (f"{where} failed on {what}{at}: {report.exc_type}: {report.message}\n\n"
           f"Original traceback:\n{report.traceback}")
    err = WorkerError(msg, worker_id=worker_id, pid=pid, batch_index=batch_index,
                      sample_index=report.sample_index, exc_type=report.exc_type,
                      traceback_text=report.traceback)
    if report.pickled is not None:
        try:
            err.__cause__ = pickle.loads(report.pickled)
        except Exception:  # noqa: BLE001 - the text above is the contract, the object a bonus
            pass
    return err


# ---------------------------------------------------------------- the worker process


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    num_workers: int
    seed: int
    dataset: Any
    collate_fn: Callable | None
    batch_transform: Callable | None
    worker_init_fn: Callable | None


def worker_seed(seed: int, worker_id: int) -> int:
    return int(np.random.SeedSequence([seed, 0x776B72, worker_id]).generate_state(1)[0])


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Serve tasks until told to ``Stop``, the task pipe closes or the parent dies."""
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    seed = worker_seed(spec.seed, spec.worker_id)
    random.seed(seed)
    np.random.seed(seed)
    _worker_info = WorkerInfo(spec.worker_id, spec.num_workers, seed, spec.dataset)
    maker = BatchMaker(spec.dataset, spec.collate_fn, spec.batch_transform)
    parent = mp.parent_process()
    watch: list[Any] = [tasks] if parent is None else [tasks, parent.sentinel]
    ring: Ring | None = None
    try:
        if spec.worker_init_fn is not None:
            try:
                spec.worker_init_fn(spec.worker_id)
            except Exception as exc:  # noqa: BLE001 - reported to the main process
                results.send(InitFailed(ErrorReport.from_exception(exc, None)))
                return
        while True:
            if tasks not in wait(watch):
                return  # the parent is gone
            msg: ToWorker = tasks.recv()
            if isinstance(msg, Stop):
                return
            if isinstance(msg, RingMsg):
                if ring is not None:
                    ring.close()
                ring = Ring.attach(msg.name, msg.layout, msg.slots)
                continue
            results.send(_serve(maker, ring, msg))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the main process went away
    finally:
        if ring is not None:
            ring.close()


def _serve(maker: BatchMaker, ring: Ring | None, task: Task) -> Ok | Skipped | BatchFailed:
    """Fill the task's slot, unless its generation is no longer the ring's current one."""
    if ring is None or ring.generation != task.generation:
        return Skipped(task.generation, task.batch_index, task.slot)
    rows = len(task.indices)
    try:
        maker.fill(task.indices, task.transform_seed, ring.layout, ring.slot_views(task.slot, rows), task.batch_index)
    except Exception as exc:  # noqa: BLE001 - reported to the main process
        report = ErrorReport.from_exception(exc, maker.failed_index(exc))
        return BatchFailed(task.generation, task.batch_index, task.slot, report)
    return Ok(task.generation, task.batch_index, task.slot, rows)


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


SHUTDOWN_GRACE_S = 1.0


class WorkerPool:
    """``num_workers`` processes and the slot pool of the ring they write into."""

    def __init__(self, *, dataset: Any, num_workers: int, prefetch_factor: int, seed: int,
                 collate_fn: Callable | None, batch_transform: Callable | None,
                 worker_init_fn: Callable | None, start_method: str) -> None:
        self.prefetch_factor = prefetch_factor
        self.slots: SlotPool | None = None
        self._rr = 0
        self._closed = False
        self._workers: list[_Worker] = []
        ctx: Any = mp.get_context(start_method)  # a concrete context: it has Process and Pipe
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["__main__", "cupy_nwt.loader._workers"])
        try:
            for w in range(num_workers):
                spec = WorkerSpec(w, num_workers, seed, dataset, collate_fn, batch_transform, worker_init_fn)
                task_r, task_w = ctx.Pipe(duplex=False)
                res_r, res_w = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(spec, task_r, res_w), name=f"cupy_nwt-worker-{w}", daemon=True)
                try:
                    proc.start()
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    for c in (task_r, task_w, res_r, res_w):
                        c.close()
                    raise LoaderError(
                        f"start_method={start_method!r} sends the dataset, collate_fn, batch_transform and "
                        f"worker_init_fn to each worker by pickling, and that failed: {exc}. Define them at module "
                        "level, or use start_method='fork' where CUDA is not initialised in this process"
                    ) from exc
                task_r.close()
                res_w.close()
                self._workers.append(_Worker(w, proc, task_w, res_r))
        except BaseException:
            self.shutdown()
            raise

    # -- the ring

    def attach(self, slots: SlotPool) -> None:
        """Hand the workers a (new) ring; its pool says which slots they may fill, for which generation."""
        ring = slots.ring
        if ring.name is None:
            raise LoaderError("internal error: workers can only attach to a ring in /dev/shm")
        self.slots = slots
        for w in self._workers:
            self._send(w, RingMsg(ring.name, ring.layout, ring.slots))

    # -- tasks and results

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.is_alive()]

    def submit(self, batch_index: int, indices: np.ndarray, tseed: int) -> bool:
        """Queue a batch on the least busy worker; False when no slot or worker capacity is free."""
        if self.slots is None or not self.slots.free or not self._workers:
            return False
        n = len(self._workers)
        order = [self._workers[(self._rr + k) % n] for k in range(n)]
        w = min(order, key=lambda x: x.outstanding)
        if w.outstanding >= self.prefetch_factor:
            return False
        self._rr = (w.id + 1) % n
        slot = self.slots.take()
        assert slot is not None  # checked free above
        try:
            self._send(w, Task(self.slots.generation, batch_index, slot, indices, tseed))
        except LoaderError:
            self.slots.give_back(slot)
            raise
        w.outstanding += 1
        return True

    def _send(self, w: _Worker, msg: ToWorker) -> None:
        try:
            w.tasks.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._raise_if_dead(timeout=1.0)
            raise LoaderError(f"could not reach loader worker {w.id} (pid {w.process.pid})") from None

    def collect(self, timeout: float | None) -> list[HostBatch | Failed]:
        """Wait up to ``timeout`` s for results; raise at once if a worker died or failed to start."""
        conns = [w.results for w in self._workers]
        sentinels = [w.process.sentinel for w in self._workers]
        wait(conns + sentinels, timeout)
        out: list[HostBatch | Failed] = []
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

    def _absorb(self, w: _Worker, msg: FromWorker) -> HostBatch | Failed | None:
        """A worker's answer: a batch to deliver, a failure to raise in turn, or nothing (stale, skipped)."""
        if isinstance(msg, InitFailed):
            raise make_worker_error(msg.report, worker_id=w.id, pid=w.process.pid, batch_index=None)
        assert self.slots is not None  # tasks went out, so a ring was attached
        w.outstanding -= 1
        if isinstance(msg, Ok):
            if not self.slots.accept(msg.generation, msg.slot):
                return None  # made for an abandoned epoch: its slot is free again
            return self.slots.batch(msg.batch_index, msg.slot, msg.rows)
        self.slots.release(msg.slot)
        if isinstance(msg, BatchFailed) and self.slots.is_current(msg.generation):
            error = make_worker_error(msg.report, worker_id=w.id, pid=w.process.pid, batch_index=msg.batch_index)
            return Failed(msg.batch_index, error)
        return None

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
        if self.slots is not None:
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
        self.slots = None

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

