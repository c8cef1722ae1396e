"""Starting one worker process: its pipes, the process, and what a failed start means in one line.

The pool (``process``) decides when a worker starts and keeps the ``Worker`` this returns; here is only
the start itself, whose failures (no file descriptors left, no process slots, a forkserver child that
died, a dataset that does not pickle) each become the error a user can act on.
"""

from __future__ import annotations

import errno
import pickle
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ...data.contract import pickling_advice
from ...errors import LoaderError
from . import lifeline, pipes
from .capacity import out_of_tasks
from .process_main import WorkerSpec, worker_main
from .start import exit_hint
from .torch_workers import PIPE_WALK_LOCK


@dataclass
class Worker:
    """One worker process and the pool's ends of its pipes."""

    id: int
    process: Any
    tasks: Connection
    results: Connection
    spill: socket.socket | None  # where the worker's large unringed arrays arrive (``pipes``)
    inbox: pipes.Inbox
    pid: int
    task_fd: int
    outstanding: int = 0


def launch(ctx: Any, spec: WorkerSpec, w: int) -> Worker:
    """Start worker ``w`` in ``ctx`` with ``spec``; its pipes' far ends are closed here once it holds them.

    Args:
        ctx: a concrete multiprocessing context (``start.context_of``: it has Process and Pipe).
        spec: what the worker runs.
        w: the worker's id, for its name and the errors.
    """
    method = ctx.get_start_method()
    ends: list[Any] = []
    try:
        task_r, task_w = ctx.Pipe(duplex=False)
        ends += (task_r, task_w)
        res_r, res_w = ctx.Pipe(duplex=False)
        ends += (res_r, res_w)
        spill_r, spill_w = socket.socketpair() if pipes.CAN_SPILL else (None, None)
        ends += (spill_r, spill_w)
        proc = ctx.Process(target=worker_main, args=(spec, task_r, res_w, spill_w), name=f"{lifeline.WORKER_NAME}{w}",
                           daemon=True)
        with PIPE_WALK_LOCK:  # pickled (spawn, forkserver) or forked with torch's pipe hooks unset
            proc.start()
    except (pickle.PicklingError, AttributeError, TypeError, ConnectionError, OSError) as exc:
        for c in ends:
            if c is not None:
                c.close()
        if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
            raise pipes.out_of_files(f"loader worker {w} could not be started", "use fewer workers") from None
        if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
            raise out_of_tasks(f"loader worker {w} could not be started by {method}") from None
        if isinstance(exc, ConnectionError):  # the server's child died while being handed the process
            raise LoaderError(f"loader worker {w} could not be started by {method}{exit_hint(method, 1)}") from None
        if isinstance(exc, OSError):
            raise
        raise LoaderError(pickling_advice(method, exc)) from exc
    task_r.close()
    res_w.close()
    if spill_w is not None:
        spill_w.close()
    return Worker(w, proc, task_w, res_r, spill_r, pipes.Inbox(res_r.fileno(), spill_r), proc.pid, task_w.fileno())
