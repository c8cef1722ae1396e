"""A saved pick flagged unreliable is cleared by what its warning asks for: a steady rerun of the same work."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt import DataLoader, tune_num_workers
from cupy_nwt.nwt.trials import Measurement

DATA = np.zeros((256, 8), np.float32)
CURVE = {0: 0.010, 1: 0.006, 2: 0.004}  # 2 workers fastest by far, whatever the noise


def _search(noise: float, iterations: int):
    return tune_num_workers(DATA, batch_size=16, strategy="paper", max_workers=3, iterations=iterations,
                            device="cpu", progress=False, warn=False,
                            measure=lambda w, i, u: Measurement(CURVE[w], CURVE[w] * (i + u), rel_error=noise))


def _why() -> str:
    with DataLoader(DATA, batch_size=16, num_workers="auto", device="cpu", autotune=False) as loader:
        return loader.stats().num_workers_why


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))


def test_a_steady_rerun_of_the_same_count_clears_an_unreliable_saved_pick():
    noisy = _search(0.30, 20)
    assert noisy.best_workers == 2 and noisy.warning and noisy.save_pick().replaced
    assert "unreliable" in _why()
    steady = _search(0.01, 400)
    assert steady.best_workers == 2 and steady.warning is None
    out = steady.save_pick()
    assert out.replaced and out.in_force.warning is None
    assert out.reason == ("the saved pick's count (2) again, and this search's trials were reliable where the "
                          "saved pick's were not")
    assert _why().startswith("picked 2 workers") and "unreliable" not in _why()


def test_a_noisy_rerun_of_the_same_count_leaves_a_reliable_saved_pick():
    steady = _search(0.01, 400)
    assert steady.save_pick().replaced
    out = _search(0.30, 20).save_pick()
    assert not out.replaced and out.in_force.warning is None and out.reason == "the saved pick is the same count (2)"
