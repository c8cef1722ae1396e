"""Cases of PyTorch's newest ``test/test_dataloader.py`` on how a loader's workers end: timeouts, a
dropped iterator, an error that ends the loop, a script that exits mid-epoch.

Written afresh as a user's script would use the loader, the same body on cupy_nwt's DataLoader and on
torch's (the ``backend`` fixture); each docstring names the torch test. The cases of the same file
about batches, arguments and workers are in ``test_parity_torch_recent.py``.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from parity_backends import is_torch

torch = pytest.importorskip("torch", reason="these cases mirror torch's own tests")
import torch.utils.data as tud  # noqa: E402
from pids import wait_gone  # noqa: E402
from torch_suite_data import Counting, SlowAt, as_list, worker_info  # noqa: E402

pytestmark = pytest.mark.usefixtures("worker_type")




# -- timeouts and exits


def test_persistent_workers_time_out_in_torchs_words(backend):
    """torch: TestDataLoaderPersistentWorkers.test_timeout."""
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+(\.\d+)? seconds"):
        next(iter(backend(SlowAt(10, seconds=1.0), batch_size=2, num_workers=2, timeout=0.3, persistent_workers=True)))


def test_after_a_caught_timeout_the_same_iterator_still_delivers_the_epoch(backend):
    """torch: TestDataLoader.test_timeout, then what torch's iterator does next: a ``next()`` after the
    caught timeout waits again for the same batch, so a retry loop loses no sample."""
    it = iter(backend(SlowAt(8, seconds=1.0), batch_size=2, num_workers=2, timeout=0.8))
    with pytest.raises(RuntimeError, match="DataLoader timed out after"):
        next(it)
    assert [int(v) for b in it for v in as_list(b)] == list(range(8))


class SlowFirstPid(SlowAt):
    def __getitem__(self, i):
        return os.getpid(), super().__getitem__(i)


def retrying(it) -> tuple[list, int]:
    """A user's loop that retries a ``next()`` that timed out: the batches, and how many timeouts."""
    batches, timeouts = [], 0
    while True:
        try:
            batches.append(next(it))
        except StopIteration:
            return batches, timeouts
        except RuntimeError as exc:
            assert "DataLoader timed out after" in str(exc)
            timeouts += 1


def test_a_caught_timeout_keeps_persistent_workers(backend):
    """torch: TestDataLoaderPersistentWorkers.test_timeout, then the loop goes on: the workers that timed
    out are the ones that finish the epoch and make the next."""
    loader = backend(SlowFirstPid(6, seconds=1.0), batch_size=2, num_workers=2, timeout=0.4, persistent_workers=True)
    batches, timeouts = retrying(iter(loader))
    first = [(int(p), int(i)) for pids, idx in batches for p, i in zip(as_list(pids), as_list(idx))]
    assert timeouts >= 1 and sorted(i for _, i in first) == list(range(6))
    again = [int(p) for pids, _ in retrying(iter(loader))[0] for p in as_list(pids)]
    assert {p for p, _ in first} == set(again)


class Pids(tud.Dataset):
    """Sample i is the pid of the worker that made it; the last worker fails from sample ``fail_from`` on."""

    def __init__(self, n: int, fail_from: int | None = None) -> None:
        self.n, self.fail_from = n, fail_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        info = worker_info()
        if self.fail_from is not None and i >= self.fail_from and info.id == info.num_workers - 1:
            raise RuntimeError("Worker error")
        return os.getpid()


class PidStream(tud.IterableDataset):
    def __init__(self, n: int, fail_from: int | None = None) -> None:
        self.n, self.fail_from = n, fail_from

    def __iter__(self):
        info = worker_info()
        for k in range(self.n):
            if self.fail_from is not None and k >= self.fail_from and info.id == info.num_workers - 1:
                raise RuntimeError("Worker error")
            yield os.getpid()


@pytest.mark.process_only("worker processes must exit: threads have no pid of their own")
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("stream", [False, True], ids=["map", "iterable"])
def test_workers_exit_when_the_iterator_is_dropped_mid_epoch(backend, persistent, stream):
    """torch: TestDataLoader.test_partial_workers, and test_iterable_style_dataset's "workers exit gracefully"."""
    loader = backend(PidStream(20) if stream else Pids(40), batch_size=2, num_workers=2, persistent_workers=persistent)
    it, pids = iter(loader), set()
    for i, batch in enumerate(it):
        pids |= set(as_list(batch))
        if i == 5:
            break
    assert len(pids) == 2
    del it, loader
    gc.collect()
    assert wait_gone(pids) == []


def run_then_fail(make, dataset, exit_method, hold, persistent, conn):
    """The loader process of torch's test_proper_exit: runs an epoch until the loop or a worker raises."""
    try:
        loader = make(dataset, batch_size=1, num_workers=2, persistent_workers=persistent)
        it, pids = iter(loader), set()
        for i, batch in enumerate(it):
            pids.add(int(np.asarray(batch).reshape(-1)[0]))
            if i == 1:
                conn.send(sorted(pids))
                if not hold:
                    del it, loader
            if i == 3 and exit_method == "loader_error":
                raise RuntimeError("Loader error")
        conn.send("no error")
    except Exception as exc:  # noqa: BLE001 - reported to the test, then raised again
        conn.send(f"{type(exc).__name__}: {exc}")
        raise


@pytest.mark.process_only("the processes of a loader must exit: threads have none")
@pytest.mark.parametrize(("stream", "exit_method", "hold", "persistent"), [
    (False, "loader_error", True, False), (True, "loader_error", False, True),
    (False, "worker_error", False, True), (True, "worker_error", True, False)])
def test_the_loader_s_process_and_its_workers_exit_when_an_error_ends_it(backend, stream, exit_method, hold, persistent):
    """torch: TestDataLoader.test_proper_exit (and TestDataLoaderPersistentWorkers'), without pin memory."""
    fail_from = 2 if exit_method == "worker_error" else None
    dataset = PidStream(7, fail_from) if stream else Pids(12, fail_from)
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=run_then_fail, args=(backend, dataset, exit_method, hold, persistent, theirs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process
        child.start()
    child.join(60)
    try:
        assert not child.is_alive() and child.exitcode != 0
        said = []
        while ours.poll(0.1):
            said.append(ours.recv())
        assert len(said) == 2 and len(said[0]) == 2, said
        assert ("Loader error" if exit_method == "loader_error" else "Worker error") in said[1]
        assert wait_gone(said[0]) == []
    finally:
        if child.is_alive():
            child.kill()


EARLY_EXIT = """
import os, sys, torch, warnings
import {module} as loader_module

class Noise(torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in range(64):
            yield torch.full((28, 28), float(os.getpid()))

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    kw = {{"device": "cpu"}} if "{module}" == "cupy_nwt" else {{}}
    loader = loader_module.DataLoader(Noise(), batch_size=16, num_workers=2, pin_memory=True,
                                      persistent_workers=True, multiprocessing_context="fork", **kw)
    for i, batch in enumerate(loader):
        print(int(batch[0, 0, 0]), flush=True)
        if i == 1:
            {ending}
"""


@pytest.mark.process_only("the script's worker processes must not hold its exit")
@pytest.mark.parametrize("ending", ["break", "raise RuntimeError('Loader error')"], ids=["break", "raise"])
def test_a_script_that_leaves_persistent_workers_mid_epoch_exits_cleanly(backend, ending):
    """torch: TestDataLoaderPersistentWorkers.test_early_exit (break), and test_proper_exit's
    "loader_error" in a script (the uncaught error's traceback holds the iterator)."""
    module = "torch.utils.data" if is_torch(backend) else "cupy_nwt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(EARLY_EXIT.format(module=module, ending=ending))],
                         capture_output=True, text=True, env=env, timeout=120)
    pids = {int(line) for line in run.stdout.split()}
    assert len(pids) == 2 and wait_gone(pids) == [], run.stderr
    if ending == "break":
        assert run.returncode == 0 and not re.search(r"Traceback|Exception ignored", run.stderr), run.stderr
    else:
        assert run.returncode == 1 and run.stderr.count("Traceback") == 1 and "RuntimeError: Loader error" in run.stderr


KEPT_ITERATOR = """
import time, torch
import numpy as np
import {module} as loader_module

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(4, i, np.float32)

if __name__ == "__main__":
    kw = {{"device": "cpu", "worker_type": "{worker_type}"}} if "{module}" == "cupy_nwt" else {{}}
    it = iter(loader_module.DataLoader(Rows(), batch_size=4, num_workers=2, **kw))
    for _ in range(4):
        batch = next(it)
    time.sleep(0.5)  # the workers have made the batches ahead of it
    print(int(batch[0, 0]), flush=True)
"""


def test_a_script_that_ends_holding_an_iterator_mid_epoch_exits_without_a_word(backend, worker_type):
    """What torch's loader does for a script whose last line leaves its iterator where it stood: the
    epoch is ended at exit, without a traceback on the way."""
    module = "torch.utils.data" if is_torch(backend) else "cupy_nwt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = textwrap.dedent(KEPT_ITERATOR.format(module=module, worker_type=worker_type))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert (run.returncode, run.stdout.split(), run.stderr) == (0, ["12"], "")


def test_loaders_made_and_dropped_one_after_another_leak_no_file_descriptors(backend):
    """torch: TestDataLoaderPersistentWorkers.test_persistent_workers_pin_memory_fd_does_not_grow_linearly,
    without the pin memory thread (CUDA): a persistent-workers loader dropped after one batch."""
    def once():
        loader = backend(Counting(20), batch_size=2, num_workers=1, persistent_workers=True)
        it = iter(loader)
        next(it)
        del it, loader
        gc.collect()
        time.sleep(0.05)

    once()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(6):
        once()
    assert len(os.listdir("/proc/self/fd")) <= before + 4
