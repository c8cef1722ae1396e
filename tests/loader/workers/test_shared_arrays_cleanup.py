"""The shared file of a forkserver or spawn loader's arrays goes with its loader, however it ends.

It is anonymous (memfd): nothing of it is ever in /dev/shm, and no process of this test holds it
once the loader is closed, its worker killed, or its loop interrupted.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from cupy_nwt import DataLoader
from cupy_nwt.errors import WorkerDiedError
from cupy_nwt.loader.workers.shared_pickle import MEMFD_NAME


def processes() -> list[int]:
    """This process and its descendants (the forkserver's server and its children included)."""
    out, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def holders() -> list[int]:
    """The processes of this test that hold or map the arrays' file."""
    found = []
    for pid in processes():
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        if any(MEMFD_NAME in x for x in links) or MEMFD_NAME in maps:
            found.append(pid)
    return found


class Rows:
    def __init__(self) -> None:
        self.data = np.repeat(np.arange(256, dtype=np.int64)[:, None], 1024, axis=1)  # 2 MiB: shared, not pickled

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> int:
        return int(self.data[i, -1])


@pytest.fixture
def shm():
    before = set(os.listdir("/dev/shm"))
    yield
    mine = {n for n in set(os.listdir("/dev/shm")) - before if str(os.getpid()) in n}
    assert mine == set()
    assert holders() == []


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_closed(shm, method):
    with DataLoader(Rows(), batch_size=16, num_workers=2, multiprocessing_context=method) as dl:
        it = iter(dl)
        first = [next(it), next(it)]  # batch i comes from worker i: both workers have their dataset now
        assert set(holders()) >= set(dl.worker_pids())
        assert sorted(int(x) for b in [*first, *it] for x in b) == list(range(256))


def test_a_killed_worker(shm):
    dl = DataLoader(Rows(), batch_size=16, num_workers=2, multiprocessing_context="forkserver")
    it = iter(dl)
    next(it)
    os.kill(dl.worker_pids()[0], signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        for _ in it:
            pass
    dl.close()


def test_an_interrupted_loop(shm):
    dl = DataLoader(Rows(), batch_size=16, num_workers=2, multiprocessing_context="forkserver")
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(dl):
            if i == 2:
                raise KeyboardInterrupt
    assert dl.worker_pids() == []
