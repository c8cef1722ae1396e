"""A background call, once waited for, leaves no thread for a fork to start beside.

The ring's page allocation and the stats' baseline reads run on such threads, and the loader waits for
them before forking its workers; a thread still in its teardown at that fork is one Python 3.12 warns of
("This process is multi-threaded, use of fork() may lead to deadlocks in the child").
"""

from __future__ import annotations

import os
import time

import pytest

from cupy_nwt._background import Background

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc/self/task")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_after_wait_the_thread_is_gone():
    alone = threads()
    left = 0
    for _ in range(300):
        Background(lambda: None).wait()
        left += threads() > alone
    assert left == 0


def test_wait_blocks_until_the_call_returned():
    got: list[int] = []
    call = Background(lambda: time.sleep(0.05) or got.append(1))
    assert not call.done()
    assert call.wait() and got == [1] and call.done()


def test_where_no_thread_can_start_the_call_runs_on_the_caller(monkeypatch):
    """At the limit of tasks (a container's pids.max, ulimit -u) a thread is refused: the call still runs."""
    import _thread

    def refuse(*args, **kw):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_thread, "start_new_thread", refuse)
    ran = []
    call = Background(ran.append, 1)
    assert ran == [1] and call.done() and call.wait()
