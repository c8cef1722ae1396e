"""tune_num_workers' arguments that a search could not honour are refused before any trial, in one line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cupy_nwt.errors import ArgumentError, ArgumentTypeError
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers

DATA = np.zeros((64, 4), np.float32)


def _flat(w, i, u):
    return 1.0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"memory_limit": -1}, r"^memory_limit must be a positive integer or None, got -1$"),
    ({"memory_limit": 1.5e9}, r"^memory_limit must be a positive integer or None, got 1500000000.0$"),
    ({"memory_limit": 10**9, "max_workers": 2}, r"^memory_limit bounds only the open search \(strategy='fast' "
                                                r"without max_workers\), so it would be ignored here$"),
    ({"memory_limit": 10**9, "strategy": "paper"}, r"^memory_limit bounds only the open search"),
])
def test_a_memory_limit_that_could_not_bound_anything_is_refused(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        tune_num_workers(measure=_flat, strategy=kwargs.pop("strategy", "fast"), progress=False, **kwargs)


def test_a_memory_limit_below_this_process_is_refused_for_the_real_loader():
    with pytest.raises(ArgumentError, match=r"^memory_limit must be at least this process's own memory \(.* now\), "
                                            r"which every trial's peak includes, got 10 \(10 B\)$"):
        tune_num_workers(DATA, strategy="fast", memory_limit=10, device="cpu", progress=False)


def test_one_worker_type_may_be_given_as_a_string():
    result = tune_num_workers(measure=_flat, worker_types="thread", max_workers=2, progress=False)
    assert result.worker_type == "thread"
    with pytest.raises(ArgumentTypeError, match=r"^worker_types must be 'process', 'thread' or a sequence of them, "
                                                r"got 5$"):
        tune_num_workers(measure=_flat, worker_types=5, progress=False)


def test_a_measure_that_is_not_callable_is_refused_before_any_trial():
    with pytest.raises(ArgumentTypeError, match=r"^measure must be a callable measure\(workers, iterations, warmup\) "
                                                r"or None, got int$"):
        tune_num_workers(measure=3, max_workers=2, progress=False)


@pytest.mark.parametrize("gives", ["fast", None, [0.1]])
def test_a_measure_that_gives_no_number_is_named_in_one_line(gives):
    """A custom measure returning something that is neither a Measurement nor seconds per iteration
    was a bare ValueError or TypeError from float()."""
    with pytest.raises(ArgumentError, match=r"^measure\(0, 100, 0\) gave .*; need a Measurement or seconds per "
                                            r"iteration$"):
        tune_num_workers(measure=lambda w, i, u: gives, max_workers=2, strategy="paper", progress=False)


@pytest.mark.parametrize("name", ["progress", "warn"])
def test_a_switch_given_a_string_is_refused_not_read_as_on(name):
    with pytest.raises(ArgumentTypeError, match=f"{name} must be True or False, got 'no'"):
        tune_num_workers(measure=lambda w, i, u: Measurement(0.01, 0.1), batch_size=8, max_workers=2, iterations=8,
                         **{name: "no"})


def test_pinning_without_a_gpu_is_said_once_not_by_every_trial():
    """A user tuning with pin_memory=True on a CPU machine sees torch's warning once, at their own call."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tune_num_workers(np.zeros((64, 4), np.float32), batch_size=8, pin_memory=True, device="cpu", strategy="fast",
                         max_workers=3, iterations=8, progress=False)
    pins = [w for w in seen if "pin_memory" in str(w.message)]
    assert len(pins) == 1 and pins[0].filename == __file__


@pytest.mark.parametrize("measure", [None, _flat])
def test_a_bad_pin_memory_is_one_line_before_any_trial_or_warning(measure):
    """Not a warning about pinning without a GPU and then the loader's error; nor, with a measure, a pick
    saved under a pin_memory no loader has, where num_workers="auto" would never find it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ArgumentError, match=r"^pin_memory must be True, False or 'staging', got 'yes'$"):
            tune_num_workers(DATA, batch_size=8, max_workers=2, pin_memory="yes", measure=measure, device="cpu",
                             progress=False)
