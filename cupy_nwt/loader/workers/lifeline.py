"""Nothing outlives the main process: its SIGTERM ends the workers and removes the ring; its death stops them.

Main process. A SIGTERM (or a SIGINT set to the default action) kills a process at once, without
unwinding: worker processes stuck in a sample would stay behind, and they hold the resource
tracker's pipe, so it would not remove the ring's ``/dev/shm`` segment either. While worker pools
live, ``track`` installs a handler for such a signal that kills every live pool's workers, unlinks
its ring, then restores the default action and re-sends the signal, so the process still ends as it
would have (same signal, same exit status). It is installed only from the main thread, and only over
the default action: a handler of the user's own (or ``SIG_IGN``) stays in charge, and SIGINT's usual
``KeyboardInterrupt`` is left alone (unwinding already stops the workers). The handler is removed
when the last pool is shut down, if it is still the one installed. Python runs a handler on the main
thread once it runs Python again, wherever the kernel delivered the signal; so the pools wait for their
workers in slices (``pool.SIGNAL_SLICE_S``), never in one call with no end.

Worker. ``ParentWatch`` notices the main process died: before each message (``alive``: ``getppid`` and a
zero-timeout poll of the parent's sentinel) the worker stops taking queued work, and a daemon thread, every
``WATCH_INTERVAL_S``, ends a worker busy with a batch (inside a sample as soon as that sample lets Python
run). A check between samples would cost two system calls a sample for what the thread already does.

A process forked from the main one (``os.fork``: a pre-forking server) does not own its workers: its end
must not stop them (``_forget_the_parents_workers``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.process
import os
import select
import signal
import threading
import time
import weakref
from multiprocessing.connection import wait as wait_ready
from typing import Any, Protocol

WATCH_INTERVAL_S = 0.2  # how often a worker's watchdog thread looks at its parent
WORKER_NAME = "cupy_nwt-worker-"  # each worker process's name, then its id: how a forked child tells them


class Killable(Protocol):
    def kill_now(self) -> None: ...


_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_owner = os.getpid()
_installed: dict[int, Any] = {}  # signal -> the handler we put in place
_lock = threading.Lock()
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _forget_the_parents_workers() -> None:
    """In a process forked from a loader's (``os.fork``), its workers are not children: multiprocessing's exit
    function, which terminates and joins the children it lists (``multiprocessing.process._children``, copied by
    the fork), would stop the parent's workers as the child ends."""
    children = getattr(multiprocessing.process, "_children", None)
    if isinstance(children, set):
        children.difference_update([p for p in children if str(getattr(p, "name", "")).startswith(WORKER_NAME)])


os.register_at_fork(after_in_child=_forget_the_parents_workers)


def ended(process: Any) -> bool:
    """Whether a worker process has ended: ``waitpid`` (``is_alive()``) where it can answer, else its sentinel,
    else whether its pid still names a process.

    ``waitpid`` cannot answer for a child the system reaped itself (the program set SIGCHLD to SIG_IGN): its
    sentinel, closed as it exits, tells, unless a process the worker started (a helper forked in
    ``worker_init_fn``) holds it open past the worker's end. Then only the pid is left: a child not yet
    reaped stays a zombie, so a pid that names no process is one the system reaped.
    """
    return not process.is_alive() or bool(wait_ready([process.sentinel], 0)) or _reaped(process.pid)


def _reaped(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # no such process, or another user's has the pid now: ours was reaped
        return True
    return False


def track(pool: Killable) -> None:
    """A pool of worker processes is live in this process: make sure a signal cannot orphan it."""
    global _owner
    with _lock:
        if os.getpid() != _owner:  # a child process that imported us before forking again
            _pools.clear()
            _installed.clear()
            _owner = os.getpid()
        _pools.add(pool)
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works only there; a later pool made on the main thread installs it
    for sig in _SIGNALS:
        if sig not in _installed and signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)
            _installed[sig] = _on_signal


def untrack(pool: Killable) -> None:
    """The pool is shut down; the last one out takes the handler away (if nobody replaced it since)."""
    with _lock:
        _pools.discard(pool)
        if _pools or os.getpid() != _owner:
            return
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in list(_installed.items()):
        if signal.getsignal(sig) is handler:
            signal.signal(sig, signal.SIG_DFL)
        del _installed[sig]


def _on_signal(signum: int, frame: Any) -> None:
    """Kill the workers, unlink the rings, then die of ``signum`` as the default action would have."""
    if os.getpid() == _owner:
        for pool in list(_pools):
            try:
                pool.kill_now()
            except Exception:  # noqa: BLE001, S110 - dying anyway: clean what can be cleaned
                pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class ParentWatch:
    """In a worker: is the main process that started us still there?

    Two signs, each the only reliable one for one start method. fork: the parent is the main process,
    and its death reparents us (``getppid`` changes); its sentinel pipe is no sign, since siblings
    forked later hold its write end too. forkserver and spawn: the sentinel pipe, whose write end only
    the main process holds; the forkserver itself outlives the main process until its last worker
    exits, so ``getppid`` stays the same.
    """

    def __init__(self) -> None:
        self.ppid = os.getppid()
        parent = mp.parent_process()
        self._fd = parent.sentinel if parent is not None else None
        self._poll = self._poller()  # the worker loop's; the watchdog has its own (a poll object is one thread's)

    def _poller(self) -> Any:
        if self._fd is None:
            return None
        p = select.poll()
        p.register(self._fd, select.POLLIN | select.POLLHUP)
        return p

    def alive(self, poller: Any = None) -> bool:
        poller = poller if poller is not None else self._poll
        return os.getppid() == self.ppid and not (poller is not None and poller.poll(0))

    def start_watchdog(self) -> None:
        """A daemon thread that ends this process when the main process is gone, even mid-sample. At the limit
        of tasks (a thread is one) the worker goes on without it: it still stops before its next message."""
        with contextlib.suppress(RuntimeError):  # "can't start new thread"
            threading.Thread(target=self._watch, args=(self._poller(),), name="cupy_nwt-parent-watch", daemon=True).start()

    def _watch(self, poller: Any) -> None:
        while self.alive(poller):
            time.sleep(WATCH_INTERVAL_S)
        os._exit(1)
