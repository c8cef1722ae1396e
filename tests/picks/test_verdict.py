"""A busy neighbour is said, not hidden in a confident pick: a job that starts mid-search slows the counts
measured after it while each trial still looks steady, so the search can pick a count measured before it
against counts measured under it. Each trial of the real loader reports how many of the usable CPUs other
processes kept busy (``Measurement.other_cpus``); the result's warning says where that was notable.

The searches run on fake trial curves (``tune_num_workers(measure=...)``): what each trial reports is fixed.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cupy_nwt import DataLoader, UnreliablePickWarning, system, tune_num_workers
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.picks.store import TuneResult

# a 2-CPU machine with a CPU-bound dataset: 2 workers make batches twice as fast as 0 or 1
QUIET = {0: 10e-3, 1: 10.2e-3, 2: 5.4e-3, 3: 5.6e-3}


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch):
    monkeypatch.setattr(system, "usable_cpus", lambda: 2)


def _measure(busy_calls: set[int], others: float = 1.0, quiet_others: float = 0.0):
    """Trials of QUIET; the ``busy_calls``-th trials (1-based) run beside a neighbour taking ``others`` CPUs,
    which makes them 2.2x slower."""
    calls: list[int] = []

    def measure(workers: int, iterations: int, warmup: int) -> Measurement:
        calls.append(workers)
        slow = len(calls) in busy_calls
        spi = QUIET[workers] * (2.2 if slow else 1.0)
        return Measurement(spi, spi * (iterations + warmup) + 0.05 * workers, rel_error=0.01,
                           other_cpus=others if slow else quiet_others)

    return measure


def _tune(measure, **kw) -> TuneResult:
    return tune_num_workers(measure=measure, max_workers=4, strategy="fast", iterations=100, progress=False,
                            warn=False, **kw)


def test_a_neighbour_during_some_trials_makes_the_pick_unreliable_and_says_where():
    result = _tune(_measure({2, 3}))
    assert result.best_workers == 0  # 2 workers were measured only beside the neighbour, twice as slow
    assert result.warning is not None
    assert result.warning.startswith("the pick of 0 workers is unreliable: other processes kept up to 1.0 of the "
                                     "2 usable CPUs busy during the trials of 2 workers (0.0 in the least busy), so "
                                     "counts measured at different times met different loads.")
    assert "tune again when other processes leave the CPUs alone" in result.warning
    with pytest.warns(UnreliablePickWarning, match="other processes kept up to 1.0"):
        tune_num_workers(measure=_measure({2, 3}), max_workers=4, strategy="fast", iterations=100, progress=False)


def test_a_load_over_the_limit_in_some_trials_only_is_a_change_however_small():
    result = _tune(_measure({2, 3}, others=0.9, quiet_others=0.45))
    assert result.warning is not None and "suits a machine that busy" not in result.warning
    assert ("busy during the trials of 2 workers (0.5 in the least busy), so counts measured at different times met "
            "different loads") in result.warning


def test_a_neighbour_throughout_the_search_is_said_as_such():
    result = _tune(_measure(set(range(1, 100)), others=0.9))
    assert result.warning is not None
    assert ("other processes kept up to 0.9 of the 2 usable CPUs busy during every trial: the pick suits a machine "
            "that busy") in result.warning


def test_a_quiet_machine_or_unmeasured_load_gives_no_warning():
    assert _tune(_measure(set(), quiet_others=0.3)).warning is None  # under half a CPU: accounting noise
    result = _tune(lambda w, i, k: Measurement(QUIET[w], QUIET[w] * (i + k), rel_error=0.01))
    assert result.best_workers == 2 and result.warning is None


def test_the_load_is_saved_with_the_pick_and_said_by_num_workers_auto(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    data = np.zeros((64, 4), np.float32)
    result = tune_num_workers(data, batch_size=8, measure=_measure({2, 3}), max_workers=4, strategy="fast",
                              iterations=100, progress=False, warn=False, device="cpu")
    result.save()
    again = TuneResult.load(result.save(tmp_path / "r.json"))
    assert [r.other_cpus for r in again.runs] == [r.other_cpus for r in result.runs]
    assert again.warning == result.warning
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"), \
            DataLoader(data, batch_size=8, num_workers="auto", device="cpu") as loader:
        assert loader.num_workers == 0
        assert loader.stats().num_workers_why.endswith(
            "; unreliable: other processes kept the CPUs busy during its trials")


def test_a_measure_reporting_a_bad_load_is_one_line():
    with pytest.raises(ValueError, match="a measure gave other_cpus -1.0; need a finite number of CPUs >= 0"):
        _tune(lambda w, i, k: Measurement(0.01, 0.01 * (i + k), other_cpus=-1.0))


def test_a_count_next_to_the_pick_the_budget_left_unmeasured_is_said():
    """Start-up (0.3 s a worker) outweighs 100 batches of a few ms: the fast search's budget ends before it
    measures 1, which is the fastest count; its pick of 2 must not read as settled."""
    times = {0: 10e-3, 1: 6e-3, 2: 9e-3}

    def measure(workers: int, iterations: int, warmup: int) -> Measurement:
        spi = times[workers]
        return Measurement(spi, spi * (iterations + warmup) + 0.1 + 0.3 * workers, rel_error=0.01)

    result = tune_num_workers(measure=measure, max_workers=3, strategy="fast", iterations=100, progress=False,
                              warn=False)
    assert result.best_workers == 2 and 1 not in {t.workers for t in result.trials}
    assert result.warning == (
        "the pick of 2 workers is unreliable: it never measured 1, next to the fastest count (2) or the pick: "
        "the search's budget ran out first. Another run may pick another count: time more batches per trial "
        "(iterations=400, cupy-nwt tune --iterations 400; now 100)")
    longer = tune_num_workers(measure=measure, max_workers=3, strategy="fast", iterations=400, progress=False,
                              warn=False)
    assert longer.best_workers == 1 and longer.warning is None
