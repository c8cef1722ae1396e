"""Worker memory stays flat across epochs over a dataset that holds a big Python list.

PyTorch's copy-on-read problem: every access to a Python object writes its refcount, so a forked
worker slowly copies the parent's pages. That cost is paid once per page, in the first epoch; what
must not happen is growth epoch after epoch (per-epoch pickling of index lists, result queues that
keep payloads, leaked batches). This measures unique memory (USS) of each persistent worker after the
first epoch and again after several more.
"""

from __future__ import annotations

import gc

import numpy as np
import psutil

from cupy_nwt import DataLoader

N = 20_000
TOLERANCE = 4 * 2**20  # bytes of USS a worker may gain over 3 epochs; one leaked epoch of batches is 60 MB


class PythonObjects:
    """Holds ~N Python objects (tuples of str and int) and reads one per sample (3 KiB image each)."""

    def __init__(self, n: int) -> None:
        self.records = [(f"sample-{i:06d}.png", i * 7) for i in range(n)]
        self.calls = 0  # counts reads in the process that owns this copy

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        self.calls += 1
        name, label = self.records[i]
        return np.full((32, 32, 3), len(name) + i % 7, np.uint8), label


def uss(pids: list[int]) -> dict[int, int]:
    return {p: psutil.Process(p).memory_full_info().uss for p in pids}


def test_worker_uss_is_flat_across_epochs_with_persistent_workers():
    ds = PythonObjects(N)
    with DataLoader(ds, batch_size=500, shuffle=True, seed=0, num_workers=2,
                    persistent_workers=True, device="cpu") as dl:
        total = 0
        for _, y in dl:  # epoch 0 pays the one-off copy-on-read
            total += len(y)
        assert total == N
        assert ds.calls == 0  # every batch, the first included, was made in a worker
        pids = dl.worker_pids()
        gc.collect()
        parent0 = psutil.Process().memory_full_info().uss
        first = uss(pids)
        for _ in range(3):
            labels = np.concatenate([y for _, y in dl])
            assert sorted(labels.tolist()) == [i * 7 for i in range(N)]
        assert dl.worker_pids() == pids
        assert ds.calls == 0  # later epochs never touch per-sample objects in the main process either
        last = uss(pids)
        gc.collect()
        parent1 = psutil.Process().memory_full_info().uss
    growth = {p: last[p] - first[p] for p in pids}
    assert all(g < TOLERANCE for g in growth.values()), f"worker USS grew by {growth} bytes over 3 epochs"
    assert parent1 - parent0 < 4 * TOLERANCE, f"main process USS grew by {parent1 - parent0} bytes over 3 epochs"
