"""Process workers (``worker_type="process"``): the pool seen from the main process (each worker's
side, its channel and main, is ``process_main``).

Each worker has its own task pipe and result pipe (no lock shared between workers, so a worker
killed mid-message cannot wedge the others). The main process waits on the result pipes and the
workers' sentinels together, which is what turns a SIGKILLed worker into an error within one
wake-up rather than a hang. Small messages travel (see ``messages``): a task with indices and a
seed one way, ``(batch, slot, rows)`` and the batch's non-array leaves the other; arrays are
written into the shared ring, whose slots and generations a ``SlotPool`` keeps. The ring's memory
(``ring.memory.RingFile``) is made with the pool, before any worker starts, so each worker gets it as
it starts (inherited, or a descriptor in the process object) and a later ``RingMsg`` only says its
layout. A worker watches the parent's sentinel too, so it never outlives the main process.

Until the ring exists (its layout is learned from the first batch a worker makes) each worker has
at most one task out, without a slot; those few batches come back pickled, their large arrays
through an anonymous file handed over each worker's spill socket (``pipes``).

Under forkserver and spawn the workers start in a wave (``start.start_wave``: one per usable CPU), the
rest once one of them says it is up: a worker not yet started takes no task (its batches wait, as they
would for a busy worker), and what it is owed until then (the ring, its reader's ``Restore``) is held
for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import time
import warnings
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.context import BaseContext
from typing import Any

from ..._interrupts import ctrl_c_held
from ..._worker_info import worker_seed
from ...errors import LoaderError
from .._events import Listener, StageTimes
from .._reader_gate import HangUp
from .._stats import MemoryGrowthWarning, settle_baselines
from ..ring.memory import RingFile
from ..ring.ring import Ring, SlotLayout
from ..ring.slots import SlotPool
from . import lifeline, pipes
from .capacity import StartProgress
from .launch import Worker, launch
from .maker import BatchMaker, make_worker_error
from .messages import (
    FromWorker,
    InitFailed,
    Restore,
    RingMsg,
    Started,
    Stop,
    ToWorker,
    task_wire,
)
from .pool import SHUTDOWN_GRACE_S, Dispatch, Result, WorkerKind
from .process_main import WorkerSpec
from .shared_pickle import SharedPickles
from .start import (
    check_importable,
    context_of,
    death_error,
    default_start_method,
    forkserver_preload,
    names_script,
    script_path,
    start_method_of,
    start_wave,
    stuck_hint,
)

UNREACHABLE_WAIT_S = 10.0  # how long a worker behind a broken pipe may take to be known dead
DRAIN_SLICE_MS = 20  # the longest a shutdown waits before looking at the workers again (``_drain``)


class WorkerPool(Dispatch):
    """``num_workers`` processes, and the slot pool of the ring they write into once it exists.

    ``maker`` (pickled to each worker with forkserver or spawn) makes the batches; ``seed`` is the
    loader's, each worker's own is drawn from it, the worker id and ``epoch``.
    """

    def __init__(self, *, maker: BatchMaker, num_workers: int, prefetch_factor: int, seed: int,
                 worker_init_fn: Callable | None, start_method: str | BaseContext, epoch: int = 0,
                 rank: int = 0, world_size: int = 1, events: Listener | None = None,
                 hung_up: HangUp | None = None) -> None:
        self.prefetch_factor = prefetch_factor
        self.events = events
        self.hung_up = hung_up if hung_up is not None else HangUp()
        self.slots = SlotPool(None)
        self._closed = False
        self._workers: list[Worker] = []
        self._waits = select.poll()  # every worker's result pipe and sentinel, registered as it starts
        self._by_fd: dict[int, Worker] = {}  # result pipe -> its worker
        self._ctx = context_of(start_method)
        self._spec = (num_workers, seed, epoch, maker, worker_init_fn, rank, world_size)
        self._file: RingFile | None = None
        self._want = num_workers  # workers started or to start (``start_wave``); ids are positions in ``_workers``
        self._held: dict[int, list[ToWorker]] = {}  # messages for workers not started yet, by id
        method = self._ctx.get_start_method()
        check_importable(method, not isinstance(start_method, str),
                         [maker.dataset, maker.collate_fn, maker.batch_transform, worker_init_fn])
        if method == "forkserver":
            self._ctx.set_forkserver_preload(
                forkserver_preload([maker.dataset, maker.collate_fn, maker.batch_transform]))
        self._hint = stuck_hint(method)  # what the parent is like as the workers start: why one might hang
        self._pickles = (SharedPickles(script_path(), names_script([worker_init_fn]))
                         if method != "fork" else None)  # the maker's arrays, pickled once
        lifeline.track(self)
        try:
            self._file = RingFile.create()
            self._start_up_to(start_wave(method, num_workers))
        except BaseException:
            self.shutdown()
            raise
        advice = self._pickles.private_copy_advice(method) if self._pickles is not None else None
        if advice is not None:
            warnings.warn(advice, MemoryGrowthWarning, stacklevel=2)
        self.active = num_workers  # workers given tasks; the others are parked (alive, idle)

    def _ship(self) -> BatchMaker:
        """The maker as the workers about to start get it: with forkserver and spawn, its arrays shared."""
        maker = self._spec[3]
        return maker if self._pickles is None else self._pickles.wrap(maker)

    def _start(self, w: int, shipped: BatchMaker) -> None:
        if self._ctx.get_start_method() != "fork":  # its start unblocks SIGINT in this thread, which the worker inherits
            resource_tracker.ensure_running()
        with ctrl_c_held():  # a Ctrl-C in the fork's hooks is lost: it comes once the worker is the pool's to stop
            self._start_held(w, shipped)

    def _start_held(self, w: int, shipped: BatchMaker) -> None:
        num_workers, seed, epoch, _, worker_init_fn, rank, world_size = self._spec
        if self._file is not None:
            self._file.settle()  # no fork beside the thread allocating the ring's pages
        settle_baselines()  # nor beside one reading the workers' memory: online tuning adds workers mid-epoch
        method = self._ctx.get_start_method()
        spec = WorkerSpec(w, max(num_workers, w + 1), worker_seed(seed, w, epoch), shipped, worker_init_fn, rank,
                          world_size, self._file, dict(os.environ) if method == "forkserver" else None)
        worker = launch(self._ctx, spec, w)
        self._workers.append(worker)
        self._by_fd[worker.results.fileno()] = worker
        self._waits.register(worker.results.fileno(), select.POLLIN)
        self._waits.register(worker.process.sentinel, select.POLLIN)

    def _start_up_to(self, n: int) -> None:
        """Start workers until ``n`` run, each handed the ring if it exists and what was held for it."""
        if len(self._workers) >= n:
            return  # online tuning parks and un-parks often: nothing to ship
        shipped = self._ship()
        with StartProgress(n - len(self._workers), self._ctx.get_start_method()) as progress:
            while len(self._workers) < n:
                self._start(len(self._workers), shipped)
                w = self._workers[-1]
                ring = self.slots.ring
                if ring is not None:
                    self._send(w, RingMsg(ring.name, ring.layout, ring.slots))
                for msg in self._held.pop(w.id, ()):
                    self._send(w, msg)
                progress.started()

    @property
    def size(self) -> int:
        """Workers started or to start: which worker makes a batch counts them all."""
        return self._want

    def set_active(self, n: int) -> None:
        """Give tasks to the first ``n`` workers: un-park parked ones, start more processes if needed."""
        self._want = max(self._want, n)
        self._start_up_to(n)
        self.active = max(1, n)

    # -- the ring

    def new_ring(self, layout: SlotLayout, slots: int) -> Ring:
        """A ring the workers can map: in the memory they were started with, else a named /dev/shm segment."""
        return Ring(layout, slots, file=self._file) if self._file is not None else Ring(layout, slots, shared=True)

    def attach(self, ring: Ring) -> None:
        """Hand the workers the ring, once its layout is known; the pool's slots are then its slots."""
        if ring.name is None and (ring.file is None or ring.file is not self._file):
            raise LoaderError("internal error: workers can only attach to their pool's ring memory or /dev/shm")
        self.slots.attach(ring)
        for w in self._workers:
            self._send(w, RingMsg(ring.name, ring.layout, ring.slots))

    # -- tasks and results

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if not lifeline.ended(w.process)]

    def worker_label(self, worker_id: int) -> str:
        return f"loader worker {worker_id} (pid {self._workers[worker_id].process.pid})"

    def stuck_hint(self) -> str:
        return self._hint

    def _deliver(self, w: Worker, generation: int, batch_index: int, slot: int, indices: Any, tseed: int) -> None:
        try:
            pipes.send(w.task_fd, task_wire(generation, batch_index, slot, indices, tseed))
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._unreachable(w)

    def restore(self, per_worker: dict[int, tuple[Any, int, int | None, int | None]]) -> None:
        """Before the epoch's first task: each worker's ``Restore`` fields by worker id (its saved state, batches to
        skip, epoch, shuffle seed: ``checkpoint.readers.restore_plan``)."""
        for w in self._workers:
            if w.id in per_worker:
                self._send(w, Restore(*per_worker[w.id]))
        for w_id in range(len(self._workers), self._want):
            if w_id in per_worker:
                self._held.setdefault(w_id, []).append(Restore(*per_worker[w_id]))

    def _send(self, w: Worker, msg: ToWorker) -> None:
        """``msg`` pickled as a task is, not by ``Connection.send``: its pickler (torch's reductions on
        multiprocessing's) would share a torch tensor in a restored state through multiprocessing's resource
        sharer, a thread that then runs in this process for good, beside every worker forked after it."""
        try:
            pipes.send(w.task_fd, msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._unreachable(w)

    def _unreachable(self, w: Worker) -> None:
        """``w``'s task pipe broke: only its exit closes the other end, so wait for the exit to be known (a
        forkserver worker's is known once the server has reaped it, which a loaded machine delays) and raise
        its death; a worker still running behind a broken pipe is a one-line ``LoaderError``."""
        w.process.join(UNREACHABLE_WAIT_S)
        self._raise_if_dead(timeout=1.0)
        raise LoaderError(f"could not reach loader worker {w.id} (pid {w.process.pid})") from None

    def _poll(self, timeout: float | None) -> list[tuple[int, int]]:
        """The pipes and sentinels ready within ``timeout`` s (None: no limit), waited on in slices
        (``_slices``) so that a signal's Python handler runs however the kernel delivered it. A slice that
        ends empty looks at the workers too: a worker the system reaped (SIGCHLD ignored) whose helper holds
        its sentinel and pipes open makes nothing ready (``lifeline.ended``)."""
        for left in self._slices(timeout):
            ready = self._waits.poll(math.ceil(left * 1000))
            if ready or any(lifeline.ended(w.process) for w in self._workers):
                return ready
        return []

    def collect(self, timeout: float | None) -> list[Result]:
        """Wait up to ``timeout`` s for results; raise at once if a worker died or failed to start.

        The workers are looked at when a sentinel or a closed pipe says one ended, or when nothing came:
        a batch's answer alone proves its worker alive.
        """
        if self._file is not None and self._file.allocating:
            self._file.settle(wait=False)  # the ring's pages, allocated beside the first batches: refused?
        ready = self._poll(timeout)
        out: list[Result] = []
        look = not ready
        for fd, _ in ready:
            w = self._by_fd.get(fd)
            if w is None:
                look = True  # a sentinel: that worker has ended
                continue
            try:
                msgs = w.inbox.take()
            except (EOFError, OSError):
                look = True
                continue
            for msg in msgs:
                item: Result | None
                if type(msg) is tuple:  # an ``Ok`` on the wire (``Ok.wire``)
                    g, b, slot, rows, objects = msg[:5]
                    item = self._in_slot(w, g, b, slot, rows, objects, StageTimes(*msg[5:]) if len(msg) > 5 else None)
                elif type(msg) is Started:
                    if len(self._workers) < self._want and not self._closed:
                        self._start_up_to(self._want)
                    continue
                else:
                    item = self._absorb(w, msg)
                if item is not None:
                    out.append(item)
        if look:
            self._raise_if_dead(timeout=0.0)
        return out

    def _absorb(self, w: Worker, msg: FromWorker) -> Result | None:
        """A worker's answer (see ``Dispatch._answer``)."""
        return self._answer(w, w.pid, msg)

    def _raise_if_dead(self, timeout: float) -> None:
        for w in self._workers:
            if not lifeline.ended(w.process):
                continue
            w.process.join(timeout if timeout > 0 else 1.0)  # reap it so the exit code is known
            self._raise_init_error(w)
            raise death_error(w.id, w.process.pid, w.process.exitcode, self._ctx.get_start_method())

    def _raise_init_error(self, w: Worker) -> None:
        """A worker whose worker_init_fn failed reported why before exiting: prefer that reason."""
        try:
            while w.results.poll():
                for msg in w.inbox.take():
                    if isinstance(msg, InitFailed):
                        raise make_worker_error(msg.report, worker_id=w.id, pid=w.process.pid, batch_index=None,
                                                stage=msg.stage)
        except (EOFError, OSError):
            pass

    # -- shutdown

    def shutdown(self) -> None:
        """Stop every worker: ask, wait up to SHUTDOWN_GRACE_S, then SIGTERM, then SIGKILL. Idempotent.

        A Ctrl-C (or any error) while it waits still ends the workers and frees their pipes and memory
        before it propagates: the process may live on (a notebook's kernel), and a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.slots.retire()  # queued tasks are skipped, not computed
            for w in self._workers:
                try:
                    w.tasks.send(Stop())
                except (OSError, ValueError):
                    pass
            self._drain(time.monotonic() + SHUTDOWN_GRACE_S)
        finally:
            self._end_workers()

    def _end_workers(self) -> None:
        """SIGTERM the workers still alive, SIGKILL those that stay, reap them; then close what they used."""
        try:
            for w in self._workers:
                if not lifeline.ended(w.process):
                    w.process.terminate()
            for w in self._workers:
                w.process.join(1.0)
                if not lifeline.ended(w.process):
                    w.process.kill()
                    w.process.join()
        finally:
            self._close_workers()

    def _close_workers(self) -> None:
        """Close the workers' pipes and spill files, the ring's file and the shared arrays; forget the pool."""
        for w in self._workers:
            w.tasks.close()
            w.results.close()
            if w.spill is not None:
                w.spill.close()  # a file handed over but never read goes with it
            with contextlib.suppress(ValueError):  # one still running (a second Ctrl-C): multiprocessing reaps it
                w.process.close()
        self._workers = []
        if self._file is not None:
            self._file.close()  # the memory goes with the ring's mapping, or already went with the workers
        if self._pickles is not None:
            self._pickles.close()
        lifeline.untrack(self)

    def _drain(self, deadline: float) -> None:
        """Wait for the workers to exit, reading away what they still send: a worker blocked writing a
        batch larger than the pipe holds would otherwise never read its ``Stop``. Each wait is short: a process a
        worker started (a helper forked in ``worker_init_fn``) holds its sentinel and pipes open past its end."""
        exits = {w.process.sentinel: w for w in self._workers}
        while not all(lifeline.ended(w.process) for w in self._workers) and (left := deadline - time.monotonic()) > 0:
            for fd, _ in self._waits.poll(min(math.ceil(left * 1000), DRAIN_SLICE_MS)):
                if fd in exits:  # that worker closed its end as it exited: reap it, it may not be a zombie yet
                    self._waits.unregister(fd)
                    exits[fd].process.join(max(0.0, deadline - time.monotonic()))
                    continue
                try:
                    ended = not os.read(fd, 1 << 16)
                except OSError:
                    ended = True
                if ended:  # a closed pipe stays ready: stop watching it
                    self._waits.unregister(fd)

    def kill_now(self) -> None:
        """From a signal handler, the process about to die: SIGKILL every worker, reap it, unlink the ring.

        Only raw steps (no message to a worker, no grace period); ``shutdown`` is the orderly path.
        """
        procs = [w.process for w in self._workers]
        for p in procs:
            if p.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(1.0)
        ring = self.slots.ring
        if ring is not None:
            ring.unlink()

    @property
    def closed(self) -> bool:
        return self._closed


def _start(*, maker: BatchMaker, num_workers: int, prefetch_factor: int, seed: int, worker_init_fn: Callable | None,
           context: BaseContext | None, device: str, epoch: int, rank: int, world_size: int,
           events: Listener | None, hung_up: HangUp | None = None) -> WorkerPool:
    return WorkerPool(maker=maker, num_workers=num_workers, prefetch_factor=prefetch_factor, seed=seed,
                      worker_init_fn=worker_init_fn, start_method=context if context is not None else
                      default_start_method(device), epoch=epoch, rank=rank, world_size=world_size, events=events,
                      hung_up=hung_up)


KIND = WorkerKind("process", _start, processes=True, start_method=start_method_of)

