"""A call run on a thread of its own, off the caller's path, and joined before anything needs its result.

Not ``threading.Thread``: its ``start()`` waits until the new thread runs, a turn of the scheduler that on
a busy machine is the very delay the call was moved off the path to avoid. The thread holds no lock of the
caller's; a process about to fork joins it first, so that no child starts beside it.
"""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import Any


class Background:
    """``fn(*args)`` running now on its own thread; ``wait()`` blocks until it returned, ``done()`` looks."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._running = _thread.allocate_lock()
        self._running.acquire()
        _thread.start_new_thread(self._run, (fn, args))

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        finally:
            self._running.release()

    def wait(self) -> bool:
        """Block until the call has returned (or raised: its exception is the thread's to report)."""
        with self._running:
            return True

    def done(self) -> bool:
        """Has the call returned? Without blocking."""
        if not self._running.acquire(blocking=False):
            return False
        self._running.release()
        return True
