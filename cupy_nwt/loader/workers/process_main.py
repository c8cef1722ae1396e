"""A worker process's side: what it is started with (``WorkerSpec``), its pipe channel, and its main.

The pool (``process``) starts ``worker_main`` in each process; the channel reads tasks from the task
pipe while watching the parent's sentinel (and, before each message, ``lifeline``'s check), and
writes answers to the result pipe, an answer that will not pickle becoming that batch's failure.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import random
import select
import signal
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..._interrupts import release_in_child
from ..._worker_info import WorkerInfo, enter_process
from ...errors import LoaderError
from ..ring.memory import RingFile
from ..ring.ring import Ring
from . import pipes
from .lifeline import ParentWatch
from .maker import BatchMaker
from .messages import (
    ErrorReport,
    FromWorker,
    InitFailed,
    Ok,
    Raised,
    RingMsg,
    Started,
    StreamState,
    Task,
    ToWorker,
    Whole,
)
from .serve import serve_loop
from .shared_pickle import Unloaded
from .torch_workers import TorchAdoption


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: int
    num_workers: int
    seed: int
    maker: BatchMaker
    worker_init_fn: Callable | None
    rank: int = 0
    world_size: int = 1
    ring_file: RingFile | None = None  # the pool's anonymous ring memory; None: a named /dev/shm ring
    # the parent's environment as the worker starts, where it does not inherit it then: forkserver's server
    # (started with the loader) holds the one of that moment, and a variable set since must reach the worker
    environ: dict[str, str] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (forkserver, spawn) with the environment first: set in the worker as it is unpickled, before
        the dataset is, whose ``__setstate__`` may read it."""
        values = [getattr(self, f.name) for f in fields(self) if f.name != "environ"]
        return (_spec_of, (_Environ(self.environ), *values))


class _Environ:
    """An environment that, unpickled, becomes this process's (``WorkerSpec.__reduce__``)."""

    def __init__(self, environ: dict[str, str] | None) -> None:
        self.environ = environ

    def __reduce__(self) -> tuple[Any, ...]:
        return (_applied, (self.environ,))


def _applied(environ: dict[str, str] | None) -> dict[str, str] | None:
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    return environ


def _spec_of(environ: dict[str, str] | None, *values: Any) -> WorkerSpec:
    names = [f.name for f in fields(WorkerSpec) if f.name != "environ"]
    return WorkerSpec(**dict(zip(names, values, strict=True)), environ=environ)


class _PipeChannel:
    """A worker process's ends: the task pipe watched with the parent's sentinel (and, before each
    message, ``lifeline``'s check), the result pipe; torch is adopted once it is imported (``TorchAdoption``)."""

    def __init__(self, tasks: Connection, results: Connection, spill: socket.socket | None, spec: WorkerSpec,
                 watch: ParentWatch) -> None:
        self.tasks, self.results, self.spill, self.spec, self.watch = tasks, results, spill, spec, watch
        self.task_fd, self.result_fd = tasks.fileno(), results.fileno()
        self.inbox, self.queued = pipes.Inbox(self.task_fd), deque[Any]()
        parent = mp.parent_process()
        self.waits = select.poll()  # the task pipe and the parent's sentinel, registered once
        for fd in (self.task_fd, *(() if parent is None else (parent.sentinel,))):
            self.waits.register(fd, select.POLLIN)
        self.torch = TorchAdoption(spec.worker_id, spec.num_workers, spec.seed, spec.maker.dataset)

    def receive(self) -> ToWorker | None:
        while not self.queued:
            for fd, _ in self.waits.poll():
                if fd == self.task_fd:
                    break
            else:
                return None  # the parent is gone: queued tasks are nobody's
            self.queued.extend(self.inbox.take())
        if not self.watch.alive():
            return None
        msg = self.queued.popleft()
        if type(msg) is tuple:
            msg = Task.from_wire(msg)
        if isinstance(msg, Task) and not self.torch.done:
            self.torch.before_task()
        return msg

    def send(self, answer: FromWorker) -> None:
        """An answer whose objects will not pickle becomes that batch's failure (a state: that error)."""
        try:
            if type(answer) is Ok:
                pipes.send(self.result_fd, answer.wire())
            else:  # a batch made before the ring exists, or not fitting it: its arrays may leave the pipe
                pipes.send(self.result_fd, answer, self.spill if type(answer) is Whole else None)
        except Exception as exc:  # pickling runs the user's __reduce__: whatever it raises; the pipe's own errors go on
            if isinstance(exc, OSError):
                raise
            if isinstance(answer, StreamState):
                report = ErrorReport.from_exception(_pickling_error("", exc), None, keep_object=False)
                self.results.send(StreamState(answer.generation, answer.batch_index, report))
            elif isinstance(answer, (Ok, Whole)):
                report = ErrorReport.from_exception(_pickling_error("the batch does not pickle, so it cannot leave "
                                                                "the worker: ", exc), None)
                self.results.send(Raised(answer.generation, answer.batch_index, answer.slot, report))
            else:
                raise

    def open_ring(self, msg: RingMsg) -> Ring:
        where = msg.name if msg.name is not None else self.spec.ring_file
        if where is None:
            raise LoaderError("internal error: a ring of anonymous memory for a worker started without it")
        return Ring.attach(where, msg.layout, msg.slots)

    def close_ring(self, ring: Ring) -> None:
        ring.close()


def seed_globals(seed: int) -> None:
    """Python's ``random`` and NumPy's global generator, from a worker's seed (NumPy's takes 32-bit words)."""
    random.seed(seed)
    np.random.seed(np.random.SeedSequence(seed).generate_state(4))


def worker_main(spec: WorkerSpec, tasks: Connection, results: Connection, spill: socket.socket | None = None) -> None:
    """A worker process: serve tasks until told to ``Stop``, the task pipe closes or the parent dies; large
    arrays of a batch that does not go into the ring leave through ``spill`` (``pipes``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    release_in_child()  # blocked across the start (``_interrupts``): a Ctrl-C sent meanwhile is ignored now
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the main process's handler (``lifeline``), if forked
    watch = ParentWatch()
    watch.start_watchdog()
    # What the worker inherited (a forked parent's heap: the dataset, and everything else the parent
    # holds) is never garbage to it: keep the collector from walking it, which writes to every object
    # it visits and so copies every page of it (copy-on-read, even of objects the worker never reads).
    gc.freeze()
    seed_globals(spec.seed)
    maker = spec.maker
    if isinstance(maker, Unloaded):
        pipes.send(results.fileno(), InitFailed(maker.report, "unpickling its dataset"))
        return
    enter_process(WorkerInfo(spec.worker_id, spec.num_workers, spec.seed, maker.dataset, spec.rank, spec.world_size))
    try:
        pipes.send(results.fileno(), Started())  # before worker_init_fn: the user's own start is not the pool's to pace
        serve_loop(_PipeChannel(tasks, results, spill, spec, watch), maker, spec.worker_id, spec.worker_init_fn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the main process went away


def _pickling_error(what: str, exc: BaseException) -> pickle.PicklingError:
    """``exc``, raised while pickling an answer, as a ``PicklingError`` that says so (``what`` first), chained to it.

    Python 3.13 words a local object's failure "Can't get local object" (an ``AttributeError``), which
    names no pickling; the caller must learn that it was the answer that would not pickle.
    """
    err = pickle.PicklingError(f"{what}{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
