"""Steps and transforms given as ``functools.partial`` or lambdas key a pick each by what they are: a pick tuned
beside a 1-ms step is not reused for a 50-ms one, though both are partials of one function."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from cupy_nwt import AutoWorkers, DataLoader, tune_num_workers
from cupy_nwt.picks.fingerprint import step_name, transform_name

DATA = np.zeros((256, 8), np.float32)


def train_step(batch, seconds):
    """A training step that takes ``seconds`` (not run here: the searches run on a fake curve)."""


def scale(batch, factor):
    return batch * factor


def _save_pick(step=None, batch_transform=None) -> None:
    result = tune_num_workers(DATA, batch_size=16, strategy="paper", max_workers=3, iterations=4, device="cpu",
                              step=step, batch_transform=batch_transform,
                              measure=lambda w, i, u: 0.05 / (w + 1), progress=False, warn=False)
    assert result.best_workers == 2 and result.save_pick().replaced


def _why(step=None, batch_transform=None) -> str:
    with DataLoader(DATA, batch_size=16, num_workers=AutoWorkers(step=step), batch_transform=batch_transform,
                    device="cpu", autotune=False) as loader:
        return loader.stats().num_workers_why


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))


def test_a_pick_tuned_beside_one_partial_step_is_not_reused_for_another():
    _save_pick(step=functools.partial(train_step, seconds=0.001))
    assert _why(step=functools.partial(train_step, seconds=0.001)).startswith("picked 2 workers")
    assert _why(step=functools.partial(train_step, seconds=0.050)).startswith("no saved pick")


def test_a_pick_tuned_beside_one_lambda_is_not_reused_for_another():
    _save_pick(step=lambda batch: train_step(batch, 0.001))
    assert _why(step=lambda batch: train_step(batch, 0.050)).startswith("no saved pick")


def test_a_partial_batch_transform_keys_its_arguments_too():
    _save_pick(batch_transform=functools.partial(scale, factor=2.0))
    assert _why(batch_transform=functools.partial(scale, factor=2.0)).startswith("picked 2 workers")
    assert _why(batch_transform=functools.partial(scale, factor=3.0)).startswith("no saved pick")


def test_names_of_partials_and_lambdas_say_what_they_are_and_plain_names_stay():
    assert step_name(functools.partial(train_step, seconds=0.05)) == f"{__name__}.train_step(seconds=0.05)"
    assert transform_name(lambda b: b).startswith(f"{__name__}.test_names_of_partials_and_lambdas_say_what_they_are_"
                                                  "and_plain_names_stay.<locals>.<lambda>:")
    assert transform_name(np.mean) == "numpy.mean" and transform_name(train_step) == f"{__name__}.train_step"
    big = transform_name(functools.partial(train_step, seconds=list(range(1000))))
    assert len(big) < 300 and big != transform_name(functools.partial(train_step, seconds=list(range(1001))))
    assert " at 0x" not in transform_name(functools.partial(train_step, seconds=object()))
