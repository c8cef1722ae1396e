"""The loop that runs in each loader worker process, and what ``get_worker_info()`` tells it.

A worker serves tasks in the order they come: attach to a ring (``RingMsg``), make a batch
(``Task``), stop (``Stop``). It answers each task once (see ``_messages``). It watches the parent's
sentinel too, so it never outlives the main process. Workers never touch CUDA: they import neither
CuPy nor anything that does.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from .maker import BatchMaker, InSlot, StreamEnd
from .messages import (
    NO_SLOT,
    BatchFailed,
    ErrorReport,
    Exhausted,
    FromWorker,
    InitFailed,
    Ok,
    Restore,
    RingMsg,
    Skipped,
    Stop,
    StreamState,
    Task,
    ToWorker,
    Whole,
)
from ..ring.ring import Ring


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (``None`` in the main process).

    As PyTorch's: ``id`` (0 .. ``num_workers`` - 1), ``seed`` (this worker's; Python's ``random`` and
    NumPy's global generator are seeded from it) and ``dataset`` (this worker's copy). Beyond it,
    ``rank`` and ``world_size`` of the loader, so an iterable-style dataset can take its share of
    the data as ``rank * num_workers + id`` of ``world_size * num_workers`` readers.

    Thread workers (``worker_type="thread"``) get the same ``seed`` a process worker would, but the
    global generators are the whole process's, so they are left alone: draw from
    ``np.random.default_rng(seed)`` instead. ``dataset`` is then the one object all threads share.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rank: int = 0
    world_size: int = 1


_worker_info: WorkerInfo | None = None  # a worker process's
_thread_info = threading.local()  # a worker thread's (``_threads``): the main thread has none


def get_worker_info() -> WorkerInfo | None:
    """This worker's id, the number of workers, its seed, its dataset copy, rank and world size; ``None`` outside.

    Per thread: a thread worker sees its own, the main thread of the main process sees None.
    """
    info: WorkerInfo | None = getattr(_thread_info, "info", None)
    return info if info is not None else _worker_info


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    num_workers: int
    seed: int
    maker: BatchMaker
    worker_init_fn: Callable | None
    rank: int = 0
    world_size: int = 1


def worker_seed(seed: int, worker_id: int, epoch: int = 0) -> int:
    """A worker's seed: fixed by the loader's seed, the worker and the epoch its workers started in."""
    return int(np.random.SeedSequence([seed, 0x776B72, worker_id, epoch]).generate_state(1)[0])


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """Serve tasks until told to ``Stop``, the task pipe closes or the parent dies."""
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    # What the worker inherited (a forked parent's heap: the dataset, and everything else the parent
    # holds) is never garbage to it: keep the collector from walking it, which writes to every object
    # it visits and so copies every page of it (copy-on-read, even of objects the worker never reads).
    gc.freeze()
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    maker = spec.maker
    _worker_info = WorkerInfo(spec.worker_id, spec.num_workers, spec.seed, maker.dataset, spec.rank, spec.world_size)
    parent = mp.parent_process()
    watch: list[Any] = [tasks] if parent is None else [tasks, parent.sentinel]
    ring: Ring | None = None
    stream_generation: int | None = None
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
            if isinstance(msg, Restore):
                maker.restore(msg.state, msg.skip)
                continue
            if msg.indices is None and msg.generation != stream_generation:
                maker.begin_stream()  # a new epoch of this worker's replica of an iterable dataset
                stream_generation = msg.generation
            answer = serve(maker, ring, msg)
            if msg.indices is None and not isinstance(answer, Skipped):
                _send_state(results, msg, maker)
            _send(results, answer)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the main process went away
    finally:
        if ring is not None:
            ring.close()


def _send(results: Connection, answer: FromWorker) -> None:
    """Send an answer; one whose objects will not pickle becomes that batch's failure instead."""
    try:
        results.send(answer)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        if not isinstance(answer, (Ok, Whole)):
            raise
        report = ErrorReport.from_exception(exc, None)
        results.send(BatchFailed(answer.generation, answer.batch_index, answer.slot, report))


def _send_state(results: Connection, task: Task, maker: BatchMaker) -> None:
    """Where this worker's stream is now; a state that cannot be pickled is sent as that error."""
    state = stream_state_or_error(maker)
    try:
        results.send(StreamState(task.generation, task.batch_index, state))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        report = ErrorReport.from_exception(exc, None, keep_object=False)
        results.send(StreamState(task.generation, task.batch_index, report))


def stream_state_or_error(maker: BatchMaker) -> Any:
    """The dataset's ``state_dict()``, or the error it raised as an :class:`ErrorReport`.

    A failing ``state_dict()`` must not cost the batch it follows, nor the worker: iteration goes
    on, and the loader's own ``state_dict()`` raises the error, since only saving needs the state.
    """
    try:
        return maker.stream_state()
    except Exception as exc:  # noqa: BLE001 - the dataset's error, reported when a state is saved
        return ErrorReport.from_exception(exc, None, keep_object=False)


def serve(maker: BatchMaker, ring: Ring | None, task: Task) -> FromWorker:
    """Make the task's batch, into its slot when it has one, unless its generation is no longer current."""
    if ring is not None and ring.generation != task.generation:
        return Skipped(task.generation, task.batch_index, task.slot)
    in_ring = ring is not None and task.slot != NO_SLOT
    try:
        made = maker.produce(task.indices, task.transform_seed, ring.layout if ring is not None else None,
                             (lambda rows: ring.slot_views(task.slot, rows)) if in_ring and ring is not None else None)
    except StreamEnd:
        return Exhausted(task.generation, task.batch_index, task.slot)
    except Exception as exc:  # noqa: BLE001 - reported to the main process
        report = ErrorReport.from_exception(exc, maker.failed_index(exc))
        return BatchFailed(task.generation, task.batch_index, task.slot, report)
    if isinstance(made, InSlot):
        return Ok(task.generation, task.batch_index, task.slot, made.rows, made.objects or None, maker.times)
    return Whole(task.generation, task.batch_index, task.slot, made.rows, made.batch, maker.times)
