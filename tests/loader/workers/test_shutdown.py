"""Closing a loader lets its workers exit on their own, not by SIGTERM after the grace period.

A worker whose batch comes back pickled (before the ring exists) and does not fit the pipe stays blocked
writing it until someone reads: unless the main process reads while it waits, closing after the first
batch (``break``, a tuner's trial) waits the whole second of grace, then terminates it. A worker that exits on its own runs its exit finalizers; one
killed by SIGTERM does not, which is what these tests look at.
"""

from __future__ import annotations

from functools import partial
from multiprocessing import util
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import DataLoader


class Images:
    """Batches of 128 x 32 x 32 x 3 bytes: 384 KiB, six times what a pipe holds."""

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((32, 32, 3), i % 251, np.uint8)


def note_exit(folder: str, worker_id: int) -> None:
    Path(folder, f"exited-{worker_id}").touch()


def on_normal_exit(folder: str, worker_id: int) -> None:
    util.Finalize(None, note_exit, args=(folder, worker_id), exitpriority=10)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_exit_on_their_own_when_closed_after_the_first_batch(tmp_path, method, persistent):
    dl = DataLoader(Images(), batch_size=128, num_workers=2, multiprocessing_context=method,
                    persistent_workers=persistent, worker_init_fn=partial(on_normal_exit, str(tmp_path)))
    for _ in dl:
        break
    dl.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exited-0", "exited-1"]
