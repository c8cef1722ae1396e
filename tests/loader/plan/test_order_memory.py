"""An epoch in order (``shuffle=False``) costs no memory for its order, as torch's ``SequentialSampler`` costs none.

The loader built the whole index order (and a list of its batches) before the first batch: 8 bytes a sample,
1.2 GB for the 100 million samples here, at every epoch; a dataset of windows over a large token corpus
(10**10 of them) could not be loaded at all.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import cupy_nwt

N = 100_000_000
MAX_BYTES = 64 << 20  # what the first batches may allocate: far below the order's 800 MB


class Windows:
    """Sample i is i, read lazily."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_first_batches_of_a_huge_epoch_in_order_allocate_no_order(num_workers):
    loader = cupy_nwt.DataLoader(Windows(), batch_size=4, num_workers=num_workers, device="cpu", output="numpy")
    tracemalloc.start()
    try:
        it = iter(loader)
        first = [np.asarray(next(it)).tolist() for _ in range(2)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert peak < MAX_BYTES, f"{peak / 2**20:.0f} MiB allocated for the first two batches"
    state = loader.state_dict()
    assert state["delivered"] == 2
    loader.load_state_dict(state)
    assert np.asarray(next(iter(loader))).tolist() == [8, 9, 10, 11]  # a resume reads its rest, in order too
    loader.close()
