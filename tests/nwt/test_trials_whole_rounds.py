"""Batches arrive in waves, one per worker round: trials time whole rounds.

Each of w workers makes one batch of every w in turn, and workers sharing the CPUs progress
together, so w batches arrive at about the same moment and then nothing for a round. On the 2-CPU VM, 10 timed batches
from 7 workers covered one round instead of 10/7 of one, so the fast search read 7 workers as far
faster than they were and picked them. The model below reproduces that arrival pattern and runs
the real stamp-to-figure code (``LoaderMeasure``'s window and ``_batch_means_error``) on it.
"""

from __future__ import annotations

import random

import pytest
from test_fast_search_noisy_trials import _held_out, _two_cpus
from test_tuner import KINDS, NS, _curve

from cupy_nwt.nwt import fast
from cupy_nwt.nwt.measure import _batch_means_error
from cupy_nwt.nwt.trials import Measurement, whole_rounds
from cupy_nwt.nwt.tune import tune_num_workers

PREFETCH = 2


def _stamps(workers: int, count: int, round_s: float, jitter: float, rng: random.Random) -> list[float]:
    """Arrival times of ``count`` batches: round r's batches all land near r x round_s."""
    per = max(1, workers)
    out, t = [], 0.0
    for i in range(count):
        if i % per == 0:
            t += round_s * (1 + rng.uniform(-jitter, jitter))
        out.append(t + 1e-6 * (i % per))
    return out


class Waves:
    """A loader whose batches arrive in rounds of ``workers``: ``t(w)`` seconds per batch on average.

    It times a trial as :class:`~cupy_nwt.nwt.measure.LoaderMeasure` does: warm-up plus the other
    start-up prefetch rounds, then from the last warm-up batch to the last timed one.
    """

    def __init__(self, t, jitter: float = 0.05, seed: int = 0) -> None:
        self.t, self.jitter, self.rng = t, jitter, random.Random(seed)
        self.calls: list[tuple[int, int]] = []

    def __call__(self, workers: int, iterations: int, warmup: int) -> Measurement:
        self.calls.append((workers, iterations))
        if warmup > 0:
            warmup += workers * (PREFETCH - 1)
        round_s = self.t(workers) * max(1, workers)
        stamps = _stamps(workers, warmup + iterations, round_s, self.jitter, self.rng)
        window = stamps[max(warmup, 1) - 1:]
        spi = (stamps[-1] - (stamps[warmup - 1] if warmup else 0.0)) / iterations
        err = _batch_means_error(window, round_size=max(1, workers))
        wall = 0.01 * workers + stamps[-1]
        return Measurement(spi, wall, 10**9 + 3 * 10**7 * workers, None, err, warmup_batches=warmup)


def test_whole_rounds_rounds_up_to_at_least_two_rounds():
    assert [whole_rounds(10, w) for w in (0, 1, 2, 3, 4, 7, 8, 15)] == [10, 10, 10, 12, 12, 14, 16, 30]
    assert whole_rounds(21, 7) == 21


def test_group_errors_see_steady_rounds_as_steady():
    """Exactly periodic rounds of 7: groups of whole rounds find no noise; groups that cut rounds
    (the former grouping) report the burst pattern as a large error."""
    stamps = _stamps(7, 43, 0.07, 0.0, random.Random(0))
    assert _batch_means_error(stamps, round_size=7) == pytest.approx(0.0, abs=1e-6)
    assert _batch_means_error(stamps, round_size=1) > 0.1
    assert _batch_means_error(stamps[:8], round_size=7) is None  # one round: no spread to estimate


def test_whole_rounds_time_a_round_once_and_cut_ones_do_not():
    t = lambda w: 0.01  # noqa: E731
    exact = Waves(t, jitter=0.0)
    assert exact(7, whole_rounds(10, 7), 8).seconds_per_iteration == pytest.approx(0.01, rel=1e-3)
    assert exact(7, 10, 8).seconds_per_iteration == pytest.approx(0.007, rel=1e-3)  # reads 1.43x too fast


def _rate(curve, kinds, seeds: int) -> float:
    hits = []
    for kind in kinds:
        for n in NS:
            for s in (seed * 7919 + n for seed in range(seeds)):
                t = curve(kind, n, random.Random(s))
                best_t = min(t(w) for w in range(n))
                paper = tune_num_workers(max_workers=n, alpha=0.0, strategy="paper", progress=False,
                                         measure=Waves(t, seed=s + 1))
                measure = Waves(t, seed=s + 2)
                r = tune_num_workers(max_workers=n, strategy="fast", progress=False, measure=measure)
                assert all(w < 2 or (k % w == 0 and k >= 2 * w) for w, k in measure.calls)
                hits.append(best_t / t(r.best_workers) >= 0.95 and r.search_seconds <= 0.30 * paper.search_seconds)
    return sum(hits) / len(hits)


def _kinds(kind: str, n: int, rng: random.Random):
    return _two_cpus(n, rng) if kind == "two_cpus" else _curve(kind, n, rng)


def test_fast_pick_holds_its_bounds_when_batches_arrive_in_rounds():
    assert _rate(_kinds, KINDS + ("two_cpus",), 3) >= 0.95


def test_fast_pick_holds_its_bounds_in_rounds_on_held_out_shapes():
    assert _rate(_held_out, ("plateau_rise", "log_gain", "smt", "v"), 3) >= 0.95


def test_timing_cut_rounds_misses_the_bounds(monkeypatch):
    """The same search timing 10 and 20 batches whatever the count (before whole rounds): the
    rounds it cuts make counts above the best look faster than they are."""
    monkeypatch.setattr(fast, "whole_rounds", lambda iterations, workers: iterations)
    cut = []
    for kind in ("two_cpus", "rising"):
        for n in (8, 12, 16):
            for seed in range(3):
                t = _kinds(kind, n, random.Random(seed * 7919 + n))
                r = tune_num_workers(max_workers=n, strategy="fast", progress=False, measure=Waves(t, seed=seed))
                cut.append(min(t(w) for w in range(n)) / t(r.best_workers) >= 0.95)
    assert sum(cut) / len(cut) < 0.8
