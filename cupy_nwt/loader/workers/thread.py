"""Thread workers (``worker_type="thread"``): the worker pool's surface, served by threads of this process.

Most per-sample work releases the GIL (Pillow's decoders, NumPy, this package's Numba transforms),
and then threads make batches in parallel without what processes cost: no pickling of tasks or
batches, no second mapping of the ring, no start-up by fork or forkserver. A thread writes straight
into the ring's slot (the ring is plain anonymous memory, page-locked like the shared one when
``pin_memory``). What a process's pipe would copy is copied as it is handed over (``handed_over``): a
batch made outside the ring (the first ones, one that does not fit it, ``batch_size=None``'s samples)
and a ring batch's other leaves are the caller's, never the dataset's or ``collate_fn``'s own memory.

Each thread runs the one serve loop (``serve``) on its own copy of the ``BatchMaker`` (so an
iterable-style dataset gets one iterator per worker) and has its own task queue; every answer comes
back through one queue. What differs from processes, and why:

* a map-style dataset and the callables are one shared object, not a copy per worker (an
  iterable-style dataset is deep-copied per thread: its position and state are each reader's own; one
  that cannot be copied, an open file among its attributes, is a one-line ``LoaderError``);
* ``get_worker_info().seed`` is what a process worker would get, but Python's, NumPy's and torch's
  global generators belong to the whole process and are left alone; so is torch's
  ``get_worker_info()``, which therefore stays None: a stream whose class's methods call torch's
  ``get_worker_info`` is refused with more than one thread, rather than read whole by each
  (``torch_workers.refuse_for_threads``); one that shards by ``cupy_nwt.get_worker_info()``, a torch
  ``IterableDataset`` or not, is served;
* a thread cannot be killed: shutdown asks, then waits at most ``SHUTDOWN_GRACE_S`` for the pool; a
  thread stuck in user code is a daemon (renamed "... (stuck)", with a warning) and ends when that
  code returns, its answer dropped.
  An exception that escapes the worker loop (``SystemExit`` in a dataset) is this pool's
  ``WorkerDiedError``, the analogue of a process that died.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from typing import Any

from ..._worker_info import WorkerInfo, enter_thread, worker_seed
from ...data.contract import dataset_style
from ...errors import LoaderError, WorkerDiedError
from .._events import Listener
from .._reader_gate import HangUp
from ..ring.ring import Ring, SlotLayout
from ..ring.slots import SlotPool
from .capacity import out_of_tasks
from .maker import BatchMaker
from .messages import FromWorker, Ok, Restore, Stop, Task, Whole
from .pool import SHUTDOWN_GRACE_S, Dispatch, Result, WorkerKind
from .serve import serve_loop
from .torch_workers import PIPE_WALK_LOCK, refuse_for_threads

STUCK_SUFFIX = " (stuck)"  # appended to the name of a thread still busy after shutdown
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Died:
    """An exception escaped the loop: the thread is gone."""

    error: BaseException


_Message = Task | Ring | Restore | Stop


@dataclass
class _Thread:
    id: int
    thread: threading.Thread
    tasks: queue.SimpleQueue[_Message]
    outstanding: int = 0


class ThreadPool(Dispatch):
    """``num_workers`` threads, and the slot pool of the ring they write into once it exists.

    The arguments are ``WorkerPool``'s, less the start method; ``seed``, the worker ids, ``epoch``,
    ``rank`` and ``world_size`` give each thread the ``WorkerInfo`` a process worker would have.
    """

    def __init__(self, *, maker: BatchMaker, num_workers: int, prefetch_factor: int, seed: int,
                 worker_init_fn: Callable | None, epoch: int = 0, rank: int = 0, world_size: int = 1,
                 events: Listener | None = None, hung_up: HangUp | None = None) -> None:
        refuse_for_threads(maker.dataset, num_workers)
        self.prefetch_factor = prefetch_factor
        self.events = events
        self.hung_up = hung_up if hung_up is not None else HangUp()
        self.slots = SlotPool(None)
        self._closed = False
        self._stopping = threading.Event()
        self._results: queue.SimpleQueue[tuple[int, FromWorker | _Died]] = queue.SimpleQueue()
        self._workers: list[_Thread] = []
        self._spec = (num_workers, seed, epoch, maker, worker_init_fn, rank, world_size)
        try:
            for w in range(num_workers):
                self._start(w)
        except BaseException:
            self.shutdown()
            raise
        self.active = num_workers  # threads given tasks; the others are parked (alive, idle)

    def _start(self, w: int) -> None:
        num_workers, seed, epoch, maker, worker_init_fn, rank, world_size = self._spec
        mine = copy.copy(maker)
        if dataset_style(maker.dataset) == "iterable":  # its own copy, as a process worker has: a reader, a position
            mine.dataset = _reader_copy(maker.dataset)
        info = WorkerInfo(w, max(num_workers, w + 1), worker_seed(seed, w, epoch), mine.dataset, rank, world_size)
        tasks: queue.SimpleQueue[_Message] = queue.SimpleQueue()
        thread = threading.Thread(target=self._loop, args=(info, mine, worker_init_fn, tasks),
                                  name=f"cupy_nwt-worker-{w}", daemon=True)
        if self.slots.ring is not None:
            tasks.put(self.slots.ring)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread"
            raise out_of_tasks(f"loader worker thread {w} could not be started") from None
        self._workers.append(_Thread(w, thread, tasks))

    def set_active(self, n: int) -> None:
        """Give tasks to the first ``n`` threads: un-park parked ones, start more if needed."""
        while self.size < n:
            self._start(self.size)
        self.active = max(1, n)

    @property
    def closed(self) -> bool:
        return self._closed

    def new_ring(self, layout: SlotLayout, slots: int) -> Ring:
        """This process's anonymous memory: the threads share it as it is."""
        return Ring(layout, slots, shared=False)

    def attach(self, ring: Ring) -> None:
        """The pool's slots are ``ring``'s; each thread takes it before its next task."""
        self.slots.attach(ring)
        for t in self._workers:
            t.tasks.put(ring)

    def pids(self) -> list[int]:
        """Empty: thread workers are no processes of their own."""
        return []

    def worker_label(self, worker_id: int) -> str:
        return f"loader worker thread {worker_id}"

    # -- the threads

    def _loop(self, info: WorkerInfo, maker: BatchMaker, worker_init_fn: Callable | None,
              tasks: queue.SimpleQueue[_Message]) -> None:
        enter_thread(info)
        try:
            serve_loop(_QueueChannel(info.id, tasks, self._results, self._stopping), maker, info.id, worker_init_fn)
        except BaseException as exc:  # noqa: BLE001 - the thread's death, told to the main thread
            if not self._stopping.is_set():
                self._results.put((info.id, _Died(exc)))

    # -- tasks and results

    def _deliver(self, t: _Thread, generation: int, batch_index: int, slot: int, indices: Any, tseed: int) -> None:
        t.tasks.put(Task(generation, batch_index, slot, indices, tseed))

    def restore(self, per_worker: dict[int, tuple[Any, int, int | None, int | None]]) -> None:
        """Before the epoch's first task: each thread's ``Restore`` fields by worker id (its saved state, batches to
        skip, epoch, shuffle seed: ``checkpoint.readers.restore_plan``)."""
        for t in self._workers:
            if t.id in per_worker:
                t.tasks.put(Restore(*per_worker[t.id]))

    def collect(self, timeout: float | None) -> list[Result]:
        """Wait up to ``timeout`` s (None: no limit) for answers; raise at once if a thread failed to start or died."""
        for left in self._slices(timeout):  # a Ctrl-C the kernel hands to a worker thread raises here, not after the batch
            with contextlib.suppress(queue.Empty):
                first = self._results.get(timeout=left) if left > 0 else self._results.get_nowait()
                break
        else:
            return []
        answers = [first]
        while True:
            try:
                answers.append(self._results.get_nowait())
            except queue.Empty:
                break
        out: list[Result] = []
        for wid, msg in answers:
            item = self._absorb(self._workers[wid], msg)
            if item is not None:
                out.append(item)
        return out

    def _absorb(self, t: _Thread, msg: FromWorker | _Died) -> Result | None:
        pid = os.getpid()
        if isinstance(msg, _Died):
            raise WorkerDiedError(f"loader worker thread {t.id} ended with {type(msg.error).__name__}: {msg.error}",
                                  worker_id=t.id, pid=pid, exitcode=None) from msg.error
        return self._answer(t, pid, msg)

    # -- shutdown

    def shutdown(self) -> None:
        """Stop every thread: what is queued is skipped; wait up to ``SHUTDOWN_GRACE_S`` in all. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.slots.retire()
        self._stopping.set()
        for t in self._workers:
            t.tasks.put(Stop())
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for t in self._workers:
            if t.thread is not threading.current_thread():
                t.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self._workers if t.thread.is_alive() and t.thread is not threading.current_thread()]
        for t in stuck:
            t.thread.name += STUCK_SUFFIX
        if stuck:
            _log.warning("loader worker thread(s) %s still in user code %.1f s after shutdown: a thread cannot be "
                         "killed; each ends when that code returns, its batch dropped",
                         ", ".join(str(t.id) for t in stuck), SHUTDOWN_GRACE_S)
        self._workers = []


def _reader_copy(dataset: Any) -> Any:
    """A thread's own copy of an iterable-style dataset, or a one-line ``LoaderError`` naming why there is none
    (an open file or a lock among its attributes: a fork would have shared it, a deep copy cannot). Taken
    while no torch pipe is walked: a pipe's copy goes through the hooks a walk sets process-wide."""
    try:
        with PIPE_WALK_LOCK:
            return copy.deepcopy(dataset)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's object to copy, told in one line
        raise LoaderError(
            f"thread workers read an iterable-style dataset from a copy each (copy.deepcopy), and copying "
            f"{type(dataset).__name__} failed: {type(exc).__name__}: {exc}. Open files and locks in __iter__ "
            "rather than in __init__, give the class a __deepcopy__, or use worker_type='process'") from exc


def handed_over(answer: FromWorker) -> FromWorker:
    """``answer`` as a pipe would hand it over: a batch made outside the ring with its arrays copied, and the
    non-array leaves of any batch deep-copied. Without it the caller's batch would be the dataset's own array
    (``batch_size=None``: an in-place edit in the loop edits the dataset) or a buffer ``collate_fn`` reuses for
    its next batch, which a process worker's user never sees. A leaf that cannot be copied is handed over as it
    is (it could not cross a pipe either)."""
    if isinstance(answer, Whole):
        treedef, arrays, objects = answer.parts
        return replace(answer, parts=(treedef, [a.copy() for a in arrays], _copied(objects)))
    if isinstance(answer, Ok) and answer.objects:
        return replace(answer, objects=_copied(answer.objects))
    return answer


def _copied(objects: list[Any]) -> list[Any]:
    out = []
    for obj in objects:
        try:
            out.append(copy.deepcopy(obj))
        except Exception:  # noqa: BLE001 - the user's object refuses a copy: handed over as it is
            out.append(obj)
    return out


class _QueueChannel:
    """A worker thread's ends: its own task queue, the pool's one answer queue; rings are shared objects."""

    def __init__(self, worker_id: int, tasks: queue.SimpleQueue[_Message],
                 results: queue.SimpleQueue[tuple[int, FromWorker | _Died]], stopping: threading.Event) -> None:
        self.worker_id, self.tasks, self.results, self.stopping = worker_id, tasks, results, stopping

    def receive(self) -> _Message:
        msg = self.tasks.get()
        return Stop() if self.stopping.is_set() else msg

    def send(self, answer: FromWorker) -> None:
        self.results.put((self.worker_id, handed_over(answer)))

    def open_ring(self, msg: Ring) -> Ring:
        return msg

    def close_ring(self, ring: Ring) -> None:
        """The main process's ring: it closes it."""


def _start(*, maker: BatchMaker, num_workers: int, prefetch_factor: int, seed: int, worker_init_fn: Callable | None,
           context: BaseContext | None, device: str, epoch: int, rank: int, world_size: int,
           events: Listener | None, hung_up: HangUp | None = None) -> ThreadPool:
    return ThreadPool(maker=maker, num_workers=num_workers, prefetch_factor=prefetch_factor, seed=seed,
                      worker_init_fn=worker_init_fn, epoch=epoch, rank=rank, world_size=world_size, events=events,
                      hung_up=hung_up)


KIND = WorkerKind("thread", _start, processes=False, start_method=lambda context, device: "thread")
