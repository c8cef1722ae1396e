"""A process-wide lock that a forked child gets free.

A fork copies a lock as it stands, held or not, but only the forking thread: a lock some other thread
held then is held forever in the child. The loader forks workers while its own threads (thread workers,
another loader's) may hold such a lock, so each of its process-wide locks is this one, which a child
replaces by a fresh lock as it starts.
"""

from __future__ import annotations

import os
import threading
from typing import Any


class ForkSafeLock:
    """``with lock:`` as with ``threading.Lock``; in a forked child, a new lock, free whoever held the old.

    For module-level locks: each one registers a fork handler that lives as long as the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()
