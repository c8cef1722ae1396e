"""A process-wide lock held by another thread when the process forks is free in the child."""

from __future__ import annotations

import os
import threading

from cupy_nwt._fork_safe_lock import ForkSafeLock


def take(lock) -> None:
    with lock:
        pass


def test_a_lock_another_thread_holds_at_fork_is_free_in_the_child():
    lock = ForkSafeLock()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the holder thread is gone, its lock must not be
            taker = threading.Thread(target=take, args=(lock,), daemon=True)
            taker.start()
            taker.join(5)
            os._exit(1 if taker.is_alive() else 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join()
    take(lock)  # and free here once its holder let go
