"""``cupy_nwt.reporting.figures``: a headline figure from repeats as a study computes it, NumPy arrays included."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt.reporting.figures import figure


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_numpy_array_of_repeats_is_summarised_like_a_list(dtype):
    repeats = np.array([2, 3, 4, 5, 6], dtype=dtype)
    got = figure(repeats, target=1.0)
    assert (got["repeats"], got["dropped"], got["median"], got["verdict"]) == (5, 0, 4.0, "met")
    assert got == figure([float(v) for v in repeats], target=1.0)


def test_non_finite_repeats_are_dropped_and_counted():
    got = figure(np.array([1.0, np.nan, 3.0, np.inf]))
    assert (got["repeats"], got["dropped"], got["median"]) == (2, 2, 2.0)
