"""A call run on a thread of its own, off the caller's path, and joined before anything needs its result.

Not ``threading.Thread``: its ``start()`` waits until the new thread runs, a turn of the scheduler that on
a busy machine is the very delay the call was moved off the path to avoid. The thread holds no lock of the
caller's; a process about to fork joins it first, so that no child starts beside it. Where no thread can
start (this user's or the cgroup's limit of tasks), the call runs on the caller's thread instead.
"""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Callable
from typing import Any

GONE_WAIT_S = 1.0  # a guard: a thread past its call is gone within microseconds


class Background:
    """``fn(*args)`` running now on its own thread; ``wait()`` blocks until it returned, ``done()`` looks.

    Either says the call returned only once its thread has ended too: the thread outlives the call by
    its own teardown, and a fork in that moment starts the child beside it (Python 3.12 warns of that).
    """

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._running = _thread.allocate_lock()
        self._running.acquire()
        self._task = ""  # the thread's entry in /proc/self/task, where the system has one
        try:
            _thread.start_new_thread(self._run, (fn, args))
        except RuntimeError:  # "can't start new thread": at the limit of tasks the caller runs it, and waits
            try:
                fn(*args)
            finally:
                self._running.release()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._task = f"/proc/self/task/{threading.get_native_id()}"
            fn(*args)
        finally:
            self._running.release()

    def _ended(self) -> bool:
        return not self._task or not os.path.exists(self._task)

    def wait(self) -> bool:
        """Block until the call has returned (or raised: its exception is the thread's to report) and its thread ended."""
        with self._running:
            pass
        deadline = time.monotonic() + GONE_WAIT_S
        while not self._ended() and time.monotonic() < deadline:
            time.sleep(0)
        return True

    def done(self) -> bool:
        """Has the call returned and its thread ended? Without blocking."""
        if not self._running.acquire(blocking=False):
            return False
        self._running.release()
        return self._ended()
