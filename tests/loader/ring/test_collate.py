"""Collation rules: NumPy scalar fields (what ArrayDataset rows hold) stay strict on the fast path."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt.errors import BatchLayoutError
from cupy_nwt.loader.ring.collate import default_collate


def test_numpy_scalar_fields_collate_to_their_own_dtype():
    samples = [(np.full((2, 2), i, np.uint8), np.int64(i), np.float32(i / 2)) for i in range(5)]
    images, labels, halves = default_collate(samples)
    assert images.shape == (5, 2, 2) and labels.dtype == np.int64 and halves.dtype == np.float32
    assert labels.tolist() == [0, 1, 2, 3, 4] and halves.tolist() == [0, 0.5, 1, 1.5, 2]


def test_a_numpy_scalar_of_another_dtype_is_named():
    samples = [(np.zeros(3, np.uint8), np.int64(i)) for i in range(6)]
    samples[4] = (samples[4][0], np.int32(4))
    with pytest.raises(BatchLayoutError, match=r"sample index 14, field \[1\].*int64.*int32") as info:
        default_collate(samples, indices=range(10, 16))
    assert info.value.sample_index == 14


@pytest.mark.parametrize("first", [True, False])
def test_an_int_too_large_for_int64_is_named_in_any_sample(first):
    """torch raises a ValueError for it; the first sample's was a bare OverflowError naming nothing."""
    samples = [(np.zeros(2), i) for i in range(3)]
    at = 0 if first else 2
    samples[at] = (samples[at][0], 2 ** 70)
    with pytest.raises(BatchLayoutError, match=rf"sample index {at + 5}") as info:
        default_collate(samples, indices=range(5, 8))
    assert info.value.sample_index == at + 5 and isinstance(info.value, ValueError)
