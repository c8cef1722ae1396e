"""Whether a loader's processes are gone: what the exit and fault tests ask of a pid."""

from __future__ import annotations

import time

import psutil


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, seconds: float = 10.0) -> list[int]:
    """The pids still running after ``seconds``."""
    end = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]
