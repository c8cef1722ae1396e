"""The threads inside a loader's ``next()``, and a close from another thread that must wait for them.

Closing stops the workers and closes the pipes, rings and epoch generators that a thread waiting in
``next()`` is using; two threads reading one pipe at once is an error (``select.poll`` refuses it) and a
generator cannot be closed while it runs. So a close first hangs up (``hung_up``: a wait for the workers
ends within one wait slice with ``LoaderClosedError``, and the waiting thread stops its own workers as it
unwinds), then waits until no other thread is inside, and keeps newcomers out until it is done. A close
asked for on a thread that is itself inside ``next()`` (a signal handler's) waits for that call to leave.

At the interpreter's exit (the loader's finalizer, run after the main thread has finished) the only
threads still inside are daemon threads about to be frozen: there the close waits a bounded time, and a
thread that was hung up parks quietly instead of printing a ``LoaderClosedError`` beside the script's own
exit (PyTorch's loader prints nothing there either).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..errors import LoaderClosedError, LoaderError

# At exit, how long a close waits for a thread inside ``next()`` to answer the hang-up (one waiting for workers
# answers within a wait slice; one running a dataset's code in the main process never does), then for one that
# answered to leave (it stops its own workers first).
ANSWER_WAIT_S = 1.0
EXIT_WAIT_S = 10.0


def interpreter_exiting() -> bool:
    """True once the main thread has finished: Python is running its exit functions (and finalizers)."""
    return not threading.main_thread().is_alive()


def park_if_exiting() -> None:
    """A reading thread hung up by the close at exit waits here for the interpreter to end; elsewhere, returns."""
    if interpreter_exiting() and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


class HangUp(threading.Event):
    """Set by a close: a thread waiting for workers stops (``LoaderClosedError``), and says so (``answered``)."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = threading.Event()


class ReaderGate:
    """Counts, per thread, the calls inside ``next()`` (``with gate:``), so that ``close`` can wait for the
    others. A thread's own entries never make it wait for itself: a signal handler that closes the loader runs
    on the thread it interrupted, which may be inside ``next()``; that close runs as the call leaves."""

    def __init__(self) -> None:
        self.hung_up = HangUp()  # handed to the worker pools: their waits end once it is set
        self._cond = threading.Condition(threading.Lock())
        self._inside: dict[int, int] = {}  # thread id -> its calls inside ``next()`` (nested ones count)
        self._closer: int | None = None  # the thread closing now: others are kept out
        self._deferred: dict[int, list[Callable[[], None]]] = {}  # closes asked for from inside ``next()``
        self._pid = os.getpid()  # the process whose loader this is (``close``)

    def __enter__(self) -> None:
        """Count this thread in, then look for a close: a close sets ``_closer`` before it counts the threads
        inside, so one of the two always sees the other (this path, taken each batch, takes no lock)."""
        me = threading.get_ident()
        self._inside[me] = self._inside.get(me, 0) + 1  # only this thread writes its own entry
        closer = self._closer
        if closer is not None and closer != me:
            self._leave(me)
            raise LoaderClosedError("this DataLoader is being closed by another thread")

    def __exit__(self, *exc: object) -> None:
        self._leave(threading.get_ident())

    def _leave(self, me: int) -> None:
        left = self._inside[me] - 1
        if left:
            self._inside[me] = left
            return
        del self._inside[me]
        if self._closer is None and not self._deferred:
            return
        with self._cond:
            self._cond.notify_all()  # a close waiting for the threads inside to leave
            deferred = self._deferred.pop(me, [])
        for action in deferred:
            self.close(action)

    def refuse_if_others_inside(self) -> None:
        """For a loader that serves one iteration at a time, whose new iteration ends the current one: refused
        while another thread is inside that one's ``next()`` (its generator cannot be closed under it)."""
        if self._inside.keys() - {threading.get_ident()}:
            raise LoaderError("this DataLoader serves one iteration at a time (persistent workers, or device='cuda'), "
                              "and another thread is inside the current one's next(): give each thread a loader of its own")

    def close(self, action: Callable[[], None]) -> None:
        """Hang up, then run ``action`` (the loader's close) with no other thread inside ``next()``. Asked for
        from inside ``next()`` (a signal handler), it runs as that call leaves, which the hang-up hastens. At
        exit, a thread that does not answer the hang-up within ``ANSWER_WAIT_S`` (or, answering, stays inside past
        ``EXIT_WAIT_S``) keeps it from running at all: its workers then end with this process, as they notice
        their parent gone. Final: ``hung_up`` stays set.

        In a process forked from the loader's (``os.fork``, then a normal exit, which runs the exit functions
        and finalizers), nothing is done: the workers, pipes and ring are the parent's, still in use there.
        """
        if os.getpid() != self._pid:
            return
        me = threading.get_ident()
        self.hung_up.set()
        with self._cond:
            if self._closer == me:  # a close inside a close (the loader's, then its finalizer's)
                nested = True
            elif self._inside.get(me):
                self._deferred.setdefault(me, []).append(action)
                return
            else:
                nested = False
                while self._closer is not None:  # another thread's close: this one comes after it
                    self._cond.wait()
                self._closer = me  # from now on newcomers are refused, so the wait below ends
                if not self._wait_alone(me):
                    self._closer = None
                    self._cond.notify_all()
                    return
        if nested:
            action()
            return
        try:
            action()
        finally:
            with self._cond:
                self._closer = None
                self._cond.notify_all()

    def _wait_alone(self, me: int) -> bool:
        """Wait (holding ``_cond``) until no other thread is inside; at exit only as long as ``ANSWER_WAIT_S``
        and ``EXIT_WAIT_S`` allow. True once alone."""
        def alone() -> bool:
            return not self._inside.keys() - {me}
        if not interpreter_exiting():
            return self._cond.wait_for(alone)
        return (self._cond.wait_for(lambda: alone() or self.hung_up.answered.is_set(), ANSWER_WAIT_S)
                and self._cond.wait_for(alone, EXIT_WAIT_S))
