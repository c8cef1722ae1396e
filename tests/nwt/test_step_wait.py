"""The tuner judged by the user's step: the count that leaves the consumer waiting least, the fewest
workers among counts within noise of it, the placement chosen among candidate pipelines, and the
one-line why and warning every result carries.

Decisions run on fake trial measurements through ``tune_num_workers(measure=...)`` (a measure
reports the consumer's loop per batch, its wait fraction and the step's time, as the real one
does), so no assertion depends on timing; one small real run checks that the fields are filled.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from cupy_nwt import AutoWorkers, DataLoader, UnreliablePickWarning
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.errors import ArgumentError
from cupy_nwt.nwt import tune as nwt_tune
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import Searched, choose, tune_num_workers
from cupy_nwt.picks.fingerprint import work_fingerprint
from cupy_nwt.picks.pick import auto_fingerprint
from cupy_nwt.picks.store import TuneResult
from cupy_nwt.picks.trials import Trial
from cupy_nwt.picks.verdict import explain, reliability
from cupy_nwt.ranks import RankLayout

STEP = 0.005
SINGLE = RankLayout(0, 1, 0, 1, "single")


def _step_measure(waits: dict[int, float], rel_error: float = 0.002, step: float = STEP):
    """A trial with the step in the loop: the consumer's loop is the step plus its wait, so a wait
    fraction f makes a loop of step / (1 - f) seconds a batch."""
    def measure(workers: int, iterations: int, warmup: int) -> Measurement:
        f = waits[workers]
        spi = step / (1 - f)
        return Measurement(spi, spi * (iterations + warmup) + 0.05 * workers, rel_error=rel_error,
                           wait_fraction=f, step_seconds=step)
    return measure


# The H100's shape, scaled: waits fall as workers are added until the loader outruns the step, then
# rise again when the workers take the main process's core (15 busy workers on 16 cores: 11-14%).
WAITS_16 = {0: 0.85, 1: 0.70, 2: 0.45, 3: 0.25, 4: 0.12, 5: 0.05, 6: 0.012, 7: 0.011, 8: 0.010, 9: 0.011,
            10: 0.010, 11: 0.011, 12: 0.012, 13: 0.015, 14: 0.04, 15: 0.12}


@pytest.mark.parametrize("strategy", ["fast", "paper"])
def test_the_pick_leaves_the_consumer_waiting_least_with_the_fewest_workers(strategy):
    result = tune_num_workers(measure=_step_measure(WAITS_16), batch_size=64, max_workers=16, iterations=100,
                              strategy=strategy, alpha=0.0, progress=False, warn=False)
    least = min(WAITS_16.values())
    trials = {t.workers: t for t in result.trials}
    picked = trials[result.best_workers]
    assert picked.wait_fraction is not None and picked.wait_fraction <= least + 0.02 + 1e-9
    assert result.best_workers < 15  # a core left to the main process: 15 workers made it wait 12%
    if strategy == "fast":  # the fewest measured workers within the tolerance of the least wait
        assert result.best_workers == 6
        assert result.wait_fraction == pytest.approx(0.012)


def test_counts_within_noise_go_to_the_fewest_workers_and_the_why_says_so():
    waits = {0: 0.60, 1: 0.30, 2: 0.098, 3: 0.012, 4: 0.011, 5: 0.011}
    result = tune_num_workers(measure=_step_measure(waits), batch_size=64, max_workers=6, iterations=100,
                              strategy="fast", progress=False, warn=False)
    assert result.best_workers == 3
    why = result.why
    assert why.startswith("picked 3 workers: the consumer's loop takes 5.1 ms a batch, 1.2% of it waiting, "
                          "with a 5.0-ms step (")
    assert "4 workers: 5.1 ms, 1.1% waiting, within noise" in why
    assert "2: 5.5 ms, 9.8% waiting" in why and "2: 5.5 ms, 9.8% waiting, within noise" not in why
    assert result.warning is None


def test_without_a_step_the_why_speaks_of_samples_per_second():
    times = {0: 0.010, 1: 0.006, 2: 0.004, 3: 0.00401}
    result = tune_num_workers(measure=lambda w, i, k: Measurement(times[w], times[w] * (i + k), rel_error=0.002),
                              batch_size=64, max_workers=4, iterations=100, strategy="fast", progress=False)
    assert result.best_workers == 2 and result.wait_fraction is None
    assert result.why.startswith("picked 2 workers: 16,000 samples/s +-0% (3 workers: 15,960 samples/s, within noise")
    assert "1: 10,667 samples/s, 33% slower" in result.why


def _searched(placement: str, loop: float, workers: int, kind: str = "process") -> Searched:
    run = Trial(workers, 50, 3, loop, 64 / loop, 1.0, None, None, 0.01, "coarse", 0.02, 0.004)
    return Searched(placement, kind, workers, (run,), 8, "asked")


def test_the_placement_is_chosen_among_candidate_pipelines_by_the_consumers_loop():
    cpu, gpu = _searched("cpu", 0.0060, 6), _searched("gpu", 0.0051, 2)
    assert choose([cpu, gpu]) == 1
    assert choose([_searched("cpu", 0.0051, 6), _searched("gpu", 0.0051, 2)]) == 0  # a tie: the first
    unmeasured = Searched("gpu", "process", 0, (), 1, "one count")
    assert choose([unmeasured, cpu]) == 1


def test_a_result_records_its_placement_and_round_trips_with_its_waits(tmp_path):
    result = tune_num_workers(measure=_step_measure({0: 0.5, 1: 0.2, 2: 0.01}), batch_size=64, max_workers=3,
                              iterations=100, strategy="paper", progress=False)
    assert result.placement == "cpu"
    back = TuneResult.load(result.save(tmp_path / "r.json"))
    assert back == result and back.placement == "cpu"
    assert [t.wait_fraction for t in back.trials] == [0.5, 0.2, 0.01]
    doc = result.to_dict()
    assert doc["placement"] == "cpu" and doc["why"] == result.why and doc["warning"] is None


def test_noisy_trials_warn_with_what_to_do():
    noisy = _step_measure({0: 0.5, 1: 0.2, 2: 0.01, 3: 0.01}, rel_error=0.3)
    with pytest.warns(UnreliablePickWarning, match="unreliable") as caught:
        result = tune_num_workers(measure=noisy, batch_size=64, max_workers=4, iterations=100, strategy="paper",
                                  progress=False)
    text = str(caught[0].message)
    assert text == result.warning
    assert "+-30%" in text and "--iterations" in text and "iterations=" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tune_num_workers(measure=noisy, batch_size=64, max_workers=4, iterations=100, strategy="paper",
                         progress=False, warn=False)


def test_counts_the_trials_could_not_tell_apart_warn_even_when_each_error_is_modest():
    times = {0: 0.010, 1: 0.0060, 2: 0.0050, 3: 0.0054}  # 3 is 8% slower than 2, each +-6%: no telling
    result = tune_num_workers(measure=lambda w, i, k: Measurement(times[w], times[w] * (i + k), rel_error=0.06),
                              batch_size=64, max_workers=4, iterations=100, strategy="paper", alpha=0.0,
                              progress=False, warn=False)
    warning = reliability(result)
    assert warning is not None and "the trials cannot tell 3 (7% slower) from the fastest, 2" in warning
    assert reliability(result, "this search's pick").startswith("this search's pick of 2 workers is unreliable")


def test_a_pick_picked_unmeasured_explains_itself():
    result = tune_num_workers(measure=_step_measure({0: 0.1}), batch_size=64, max_workers=1, iterations=100,
                              strategy="fast", progress=False)
    assert explain(result) == "picked 0 workers: the only count to search, not measured"
    assert result.warning is None


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5ms", True, 10_000])
def test_a_step_is_checked_where_it_is_set(bad):
    with pytest.raises(ArgumentError, match="step"):
        AutoWorkers(step=bad)
    with pytest.raises(ArgumentError, match="step"):
        tune_num_workers(measure=_step_measure({0: 0.1, 1: 0.0}), max_workers=2, step=bad, progress=False)


def test_the_step_is_part_of_the_saved_picks_key_and_old_keys_stay():
    data = ArrayDataset(np.zeros((64, 4), np.float32), np.zeros(64, np.int64))
    kw = {"batch_size": 8, "device": "cpu", "layout": SINGLE}
    plain = auto_fingerprint(data, **kw)
    assert plain.work.step is None
    assert auto_fingerprint(data, step=0.005, **kw).key != plain.key
    assert auto_fingerprint(data, step=0.005, **kw).work.step == "0.005 s"
    assert auto_fingerprint(data, step=np.mean, **kw).work.step == "numpy.mean"
    work = work_fingerprint(data, batch_size=8, device="cpu", pin_memory=False)
    assert "step" in work.to_dict() and work.step is None  # absent from the key's digest while None


def _consume(batch) -> None:
    np.asarray(batch[0]).sum()


def test_a_real_run_with_a_step_fills_the_waits_and_the_loader_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))
    data = ArrayDataset(np.arange(256 * 4, dtype=np.float32).reshape(256, 4), np.zeros(256, np.int64))
    result = tune_num_workers(data, batch_size=8, max_workers=2, iterations=8, strategy="fast", device="cpu",
                              step=0.001, progress=False, warn=False)
    assert result.main_process == "busy"  # a CPU step: the step time is spun on the main process's CPU
    for t in result.trials:
        assert t.wait_fraction is not None and 0.0 <= t.wait_fraction <= 1.0
        assert t.step_seconds is not None and t.step_seconds >= 0.001
    assert result.why.startswith(f"picked {result.best_workers} worker")
    assert result.fingerprint is not None and result.fingerprint.work.step == "0.001 s"

    result.save_pick()

    def search(*args, **kwargs):
        raise AssertionError("num_workers=AutoWorkers(...) ran the offline search")

    monkeypatch.setattr(nwt_tune, "tune_num_workers", search)
    with DataLoader(data, batch_size=8, num_workers=AutoWorkers(step=0.001), device="cpu") as loader:
        why = loader.stats().num_workers_why
        assert loader.num_workers == result.best_workers
    assert why is not None and why.startswith(result.why)  # stats() adds the warning when there was one
    with caplog.at_level(logging.INFO, logger="cupy_nwt.tuner"):  # another step: its own key, a miss
        with DataLoader(data, batch_size=8, num_workers=AutoWorkers(step=_consume), device="cpu") as loader:
            why = loader.stats().num_workers_why
            assert loader.decisions[0].action == "start"  # tuned online, judged by the caller's own loop
    assert why is not None and "tuning online from " in why
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("num_workers='auto': ")]
    assert len(logged) == 1 and why in logged[0]
    with DataLoader(data, batch_size=8, num_workers=2, device="cpu") as loader:
        assert loader.stats().num_workers_why is None


def _gpu_step(batch) -> None:
    x = batch[0]
    (x @ x.T).sum()  # queued on the consumer's stream; the trial synchronises it after the step


@pytest.mark.gpu
def test_on_the_gpu_the_step_runs_on_each_batch_and_is_timed_as_the_device_runs_it():
    data = ArrayDataset(np.ones((512, 256), np.float32), np.zeros(512, np.int64))
    result = tune_num_workers(data, batch_size=64, device="cuda", step=_gpu_step, max_workers=2, iterations=8,
                              strategy="fast", progress=False, warn=False)
    assert result.device == "cuda" and result.main_process == "step"
    assert all(t.wait_fraction is not None and t.step_seconds is not None and t.step_seconds > 0
               for t in result.trials)
    assert result.why.startswith(f"picked {result.best_workers} worker")
