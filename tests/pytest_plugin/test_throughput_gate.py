"""The throughput gate's statistics and rule on made-up rounds, and how the fixture sizes its runs.

No timing here: rounds are hand-made or drawn from a seeded generator, so every verdict is exact.
"""

from __future__ import annotations

import math
import random

import pytest

from cupy_nwt.pytest_plugin._cpu import Reading
from cupy_nwt.pytest_plugin._gate import Comparison, compare_against, compare_throughput, judge
from cupy_nwt.pytest_plugin._interval import (
    _u_counts,
    median_halfwidth,
    paired_interval,
    rounds_for,
    shift_interval,
    sign_rank,
    signed_rank,
    u_rank,
)
from cupy_nwt.pytest_plugin._loader_run import PILOT_ROUNDS, Round, RoundRunner, deciding, sized_run
from cupy_nwt.pytest_plugin._parts import loader_args, sizing_args, transfer_result

STEADY = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
NOISY = [1000.0, 600.0, 1400.0, 800.0, 1200.0]


def scaled(rounds: list[float], factor: float) -> list[float]:
    return [x * factor for x in rounds]


def lognormal(rng: random.Random, n: int, median: float, sigma: float) -> list[float]:
    return [median * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


# ---------------------------------------------------------------- the intervals


@pytest.mark.parametrize(("n", "m", "k"), [(3, 3, 0), (4, 4, 1), (5, 5, 3), (6, 6, 6), (10, 10, 24), (8, 12, 23)])
def test_mann_whitney_rank_matches_the_published_critical_values(n, m, k):
    """k - 1 is the two-sided 5% critical value of U in the standard tables (none for 3|3)."""
    assert u_rank(n, m) == k


def test_u_counts_are_the_whole_symmetric_distribution():
    counts = _u_counts(6, 9)
    assert sum(counts) == math.comb(15, 6) and len(counts) == 6 * 9 + 1
    assert counts == counts[::-1]


def test_normal_approximation_takes_over_for_many_rounds_and_agrees():
    import cupy_nwt.pytest_plugin._interval as interval

    exact = u_rank(50, 50)
    assert 50 * 50 <= interval.EXACT_PAIRS
    assert u_rank(60, 60) > 0  # beyond EXACT_PAIRS: the approximation, still a finite interval
    assert abs(exact - (50 * 50 / 2 - 1.96 * math.sqrt(50 * 50 * 101 / 12))) < 2


def test_the_shift_of_a_pure_scaling_is_exact():
    s = shift_interval(STEADY, scaled(STEADY, 0.5))
    assert s.estimate == pytest.approx(math.log(0.5))
    assert s.low <= math.log(0.5) <= s.high and s.bounded


def test_too_few_rounds_give_no_finite_interval():
    s = shift_interval([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert not s.bounded and s.estimate == pytest.approx(0.0)
    assert median_halfwidth([1.0] * 5) == math.inf
    assert median_halfwidth([1.0] * 6) == 0.0


def test_the_shift_interval_covers_the_true_change_95_times_in_100():
    """Simulated rounds (lognormal, 5% per-round noise, a true +10% change): the coverage is as promised."""
    rng = random.Random(1234)
    truth = math.log(1.10)
    trials = 400
    covered = 0
    for _ in range(trials):
        s = shift_interval(lognormal(rng, 12, 1.0, 0.05), lognormal(rng, 12, 1.10, 0.05))
        covered += s.low <= truth <= s.high
    assert 0.93 <= covered / trials <= 0.99


def test_sign_rank_and_median_halfwidth():
    assert [sign_rank(n) for n in (5, 6, 10, 20)] == [0, 1, 2, 6]
    xs = [math.exp(v) for v in (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09)]
    assert median_halfwidth(xs) == pytest.approx((0.08 - 0.01) / 2)  # X(2) to X(9) of 10


def test_median_halfwidth_shrinks_like_one_over_root_n():
    rng = random.Random(7)
    wide = sum(median_halfwidth(lognormal(rng, 16, 1.0, 0.05)) for _ in range(20))
    narrow = sum(median_halfwidth(lognormal(rng, 256, 1.0, 0.05)) for _ in range(20))
    assert 0.15 < narrow / wide < 0.35  # 16x the rounds: about a quarter of the width


def test_rounds_for_plans_from_the_square_law():
    assert rounds_for(0.02, 8, 0.01) == 32
    assert rounds_for(0.005, 8, 0.01) == 8
    assert rounds_for(math.inf, 8, 0.01) == 16


# ---------------------------------------------------------------- the rule


def test_a_clear_regression_fails():
    j = judge(STEADY, scaled(STEADY, 0.5), max_drop_pct=20)
    assert j.verdict == "regressed"
    assert j.change_pct == pytest.approx(-50.0) and j.worse_pct == pytest.approx(50.0)
    assert j.high_pct < 0 and (j.old, j.new, j.old_rounds, j.new_rounds) == (1000.0, 500.0, 5, 5)


def test_cost_figures_regress_when_they_rise():
    cpu = [0.100, 0.101, 0.099, 0.1005, 0.0995, 0.1002]
    j = judge(cpu, scaled(cpu, 1.10), max_drop_pct=5, higher_is_better=False)
    assert j.verdict == "regressed" and j.worse_pct == pytest.approx(10.0) and j.low_pct > 0
    assert judge(cpu, scaled(cpu, 0.8), max_drop_pct=5, higher_is_better=False).verdict == "ok"  # faster


def test_an_unchanged_rerun_passes():
    assert judge(STEADY, [1003.0, 998.0, 1012.0, 987.0, 1001.0], max_drop_pct=10).verdict == "ok"


def test_a_drop_within_the_limit_passes_and_a_noisy_one_is_inconclusive():
    assert judge(STEADY, scaled(STEADY, 0.85), max_drop_pct=20).verdict == "ok"
    j = judge(NOISY, scaled(NOISY, 0.7), max_drop_pct=20)  # beyond the limit, but inside the noise
    assert j.verdict == "inconclusive" and j.low_pct < -20 and j.high_pct > 0
    assert judge(NOISY, NOISY, max_drop_pct=20).verdict == "inconclusive"  # a 20% drop could hide here
    assert judge(NOISY, scaled(NOISY, 0.05), max_drop_pct=20).verdict == "regressed"


def test_a_single_outlier_round_does_not_decide():
    steady = STEADY + [1002.0, 998.0]
    hiccup = [1000.0, 1010.0, 20.0, 1005.0, 995.0, 1001.0, 999.0]  # one round stalled 50x
    assert judge(steady, hiccup, max_drop_pct=10).verdict == "ok"
    assert judge(hiccup, steady, max_drop_pct=10).verdict == "ok"
    burst = [500.0, 505.0, 495.0, 502.0, 9000.0, 498.0, 501.0]  # a regression with one lucky round
    assert judge(steady, burst, max_drop_pct=20).verdict == "regressed"


def test_simulated_runs_catch_ten_percent_and_never_cry_wolf():
    """The gate's targets on simulated CPU rounds (2% noise per round, 16 rounds a run, limit 5%)."""
    rng = random.Random(2026)
    verdicts: dict[float, list[str]] = {1.0: [], 1.1: [], 1.5: []}
    for factor in verdicts:
        for _ in range(20):
            base, now = lognormal(rng, 16, 0.3, 0.02), lognormal(rng, 16, 0.3 * factor, 0.02)
            verdicts[factor].append(judge(base, now, 5, higher_is_better=False).verdict)
    assert verdicts[1.0].count("regressed") == 0
    assert verdicts[1.1].count("regressed") >= 18
    assert verdicts[1.5].count("regressed") == 20


def test_without_a_limit_nothing_is_judged():
    assert judge(STEADY, scaled(STEADY, 0.1), max_drop_pct=None).verdict == "compared"


def test_single_figures_fall_back_to_the_plain_drop_rule():
    j = judge([1000.0], [700.0], max_drop_pct=20)
    assert j.verdict == "regressed" and j.low_pct is None
    assert judge([1000.0], [850.0], max_drop_pct=20).verdict == "ok"
    assert judge([1000.0], scaled(NOISY, 0.7), max_drop_pct=20).verdict == "inconclusive"  # no finite interval


@pytest.mark.parametrize(("old", "new"), [([], [1.0]), ([1.0], []), ([0.0], [1.0]), ([1.0], [math.nan]),
                                          ([1.0], [math.inf]), ([-1.0], [1.0])])
def test_judge_refuses_figures_that_are_not_positive(old, new):
    with pytest.raises(ValueError, match="positive and finite"):
        judge(old, new, 10)


# ---------------------------------------------------------------- a benchmark's circumstances


def _info(rate: list[float], cpu: list[float], cores: float, others: float, cpus: int = 2, **extra) -> dict:
    return {"samples_per_s_rounds": rate, "cpu_s_per_1k_rounds": cpu, "cpu_cores": cores, "others_cores": others,
            "machine": {"cpu_model": "X", "usable_cpus": cpus}, **extra}


def _judged(old: dict, new: dict, limit: float = 5) -> dict[str, Comparison]:
    cs = compare_throughput({"t::a": new}, {"t::a": {"fullname": "t::a", "extra_info": old}}, "b")
    return {c.key: c for c in cs}


CPU = [0.300, 0.301, 0.299, 0.302, 0.298, 0.300, 0.301, 0.299]
RATE = [4000.0, 4010.0, 3990.0, 4005.0, 3995.0, 4002.0, 3998.0, 4001.0]


@pytest.mark.parametrize("factor", [0.6, 1.1, 1.6])
def test_cpu_time_against_a_stored_baseline_is_shown_never_failed(factor):
    """Steady rounds on each side, so the interval excludes no change: only the rule keeps it from failing.

    On a shared VM an unchanged pipeline's CPU per sample moved by more than a 40% slowdown did
    between runs (bench/studies/does_the_gate_hold/gate_noise_proof.py --mode cpu), so a clean interval says nothing of the code.
    """
    got = _judged(_info(RATE, CPU, 1.5, 0.2), _info(RATE, scaled(CPU, factor), 1.5, 0.2))["cpu_s_per_1k"]
    j = got.judgement(5)
    assert j.verdict == "reported" and (j.low_pct > 0 or j.high_pct < 0)
    assert not got.regressed(5)
    assert "CPU time against a baseline from another time is information (it drifts with the machine); " \
        "exact instruction counts or --nwt-against REV judge it" in got.message(5)


def test_a_stored_baseline_never_fails_on_wall_clock_alone():
    """Another hour is another machine, in effect: a 40% drop in samples/s is reported, not judged."""
    got = _judged(_info(RATE, CPU, 1.6, 0.2), _info(scaled(RATE, 0.6), CPU, 1.6, 0.2))
    j = got["samples_per_s"].judgement(5)
    assert j.verdict == "reported" and "--nwt-against REV judges it in the same job" in j.reason
    assert j.change_pct == pytest.approx(-40.0)
    assert not got["cpu_s_per_1k"].regressed(5)


def test_a_pipeline_starved_of_cpu_by_others_is_not_called_io_bound():
    """0.12 cores while others took 1.89 of 2: the exact count still decides."""
    old = _info(RATE, CPU, 0.6, 0.3, instructions_per_sample=1e6, instructions_counted_by="callgrind",
                instructions_samples=128)
    new = _info(RATE, CPU, 0.12, 1.89, instructions_per_sample=1.02e6, instructions_counted_by="callgrind",
                instructions_samples=128)
    cs = compare_throughput({"t::a": new}, {"t::a": {"fullname": "t::a", "extra_info": old}}, "b",
                            instructions_limit_pct=1.0)
    assert {c.key: c for c in cs}["instructions_per_sample"].regressed(5)


def test_an_io_bound_pipeline_has_nothing_judged_against_a_stored_baseline():
    got = _judged(_info(RATE, CPU, 0.05, 0.2), _info(scaled(RATE, 0.5), scaled(CPU, 2.0), 0.05, 0.2))
    assert {c.judgement(5).verdict for c in got.values()} == {"reported"}
    assert "I/O-bound, judged by wall clock (--nwt-against)" in got["cpu_s_per_1k"].message(5)


def test_a_baseline_from_another_machine_is_compared_never_failed():
    other = _info(RATE, CPU, 1.5, 0.2)
    other["machine"] = {"cpu_model": "Y", "usable_cpus": 16}
    got = _judged(other, _info(scaled(RATE, 0.3), scaled(CPU, 3.0), 1.5, 0.2))
    for c in got.values():
        assert c.judgement(5).verdict == "other-machine" and not c.regressed(5)
    assert "baseline from another machine (cpu_model 'Y' in the baseline, 'X' here; usable_cpus 16 in the " \
           "baseline, 2 here): not judged" in got["cpu_s_per_1k"].message(5)


def test_a_changed_pipeline_is_named_and_still_judged():
    counted = {"instructions_counted_by": "callgrind", "instructions_samples": 256}
    old = _info(RATE, CPU, 1.5, 0.2, pipeline={"batch_size": 128, "num_workers": 2}, instructions_per_sample=1e6,
                **counted)
    new = _info(RATE, CPU, 1.5, 0.2, pipeline={"batch_size": 64, "num_workers": 2}, instructions_per_sample=1.5e6,
                **counted)
    c = _judged(old, new)["instructions_per_sample"]
    assert c.regressed(5) and "(pipeline changed: batch_size 128 in the baseline, 64 here)" in c.message(5)


@pytest.mark.parametrize("rounds", ["12", [], [1.0, "x"], [1.0, 0.0], [1.0, math.nan], {"a": 1.0}])
def test_rounds_that_are_not_a_list_of_positive_numbers_leave_the_headline_figure(rounds):
    baseline = {"t::a": {"fullname": "t::a", "extra_info": {"gbps": 10.0}}}
    (c,) = compare_throughput({"t::a": {"gbps": 7.0, "gbps_rounds": rounds}}, baseline, "b")
    assert (c.old, c.new, c.new_rounds) == (10.0, 7.0, ())
    assert c.regressed(20)


def test_a_copy_benchmark_is_gated_on_its_repeats():
    mib = 1024**2
    times = [1e-4, 1.01e-4, 0.99e-4, 1.02e-4, 0.98e-4, 1.0e-4, 1.005e-4, 0.995e-4, 1.015e-4, 0.985e-4]
    fast = transfer_result(mib, "h2d", True, times, link_gbps=None)
    slow = transfer_result(mib, "h2d", True, scaled(times, 2.0), link_gbps=None)
    hiccup = transfer_result(mib, "h2d", True, [*times[:2], 50e-4, *times[3:]], link_gbps=None)
    baseline = {"t::copy": {"fullname": "t::copy", "extra_info": fast.to_dict()}}
    (bad,) = compare_throughput({"t::copy": slow.to_dict()}, baseline, "b")
    assert bad.key == "gbps" and bad.regressed(20)
    (ok,) = compare_throughput({"t::copy": hiccup.to_dict()}, baseline, "b")
    assert ok.judgement(20).verdict == "ok"


# ---------------------------------------------------------------- sizing a run


class FakeClock:
    """Readings whose CPU per round comes from a seeded generator: made-up figures, no timing."""

    def __init__(self, sigma: float, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.sigma = sigma
        self.cpu = self.wall = 0.0
        self.reads = 0

    def read(self) -> Reading:
        self.reads += 1
        if self.reads % 2 == 0:  # the end of a round: 1 s of wall, ~1 core of CPU
            self.wall += 1.0
            self.cpu += math.exp(self.rng.gauss(0.0, self.sigma))
        return Reading(self.cpu, 2 * self.wall, self.wall, None)


def test_a_run_adds_rounds_until_the_target_noise():
    runner = RoundRunner(lambda: 8, FakeClock(sigma=0.05), round_s=0.0)
    sizing = sized_run(runner, 2, target_pct=1.0, max_seconds=3600)
    assert sizing.stopped == "target noise" and sizing.noise_pct <= 1.0
    assert sizing.decided_by == "cpu_s_per_1k" and sizing.batches_per_round == 2
    assert len(runner.rounds) > PILOT_ROUNDS  # 5% per round needs far more than the pilot


def test_a_steady_run_stops_after_the_pilot():
    runner = RoundRunner(lambda: 8, FakeClock(sigma=0.001), round_s=0.0)
    assert sized_run(runner, 1, target_pct=1.0, max_seconds=3600).stopped == "target noise"
    assert len(runner.rounds) == PILOT_ROUNDS


def test_a_run_stops_at_the_time_cap_and_says_so():
    runner = RoundRunner(lambda: 8, FakeClock(sigma=0.5), round_s=0.0)
    sizing = sized_run(runner, 1, target_pct=0.1, max_seconds=1e-9)
    assert sizing.stopped == "time cap" and len(runner.rounds) == PILOT_ROUNDS and sizing.noise_pct > 0.1


def test_an_io_bound_run_is_decided_by_wall_clock():
    rounds = [Round(100, 1, 1.0, 0.01, 0.0, None) for _ in range(8)]
    assert deciding(rounds)[0] == "samples_per_s"
    assert deciding([Round(100, 1, 1.0, 0.9, 0.0, None)])[0] == "cpu_s_per_1k"


@pytest.mark.parametrize(("args", "match"), [
    ((5, 1, 6), r"rounds \(6\) must not exceed batches \(5\)"),
    ((5, 1, 0), "rounds must be an int >= 1"),
    ((5, 1, True), "rounds must be an int >= 1"),
    ((0, 1, 1), "batches must be an int >= 1"),
    ((5, -1, 1), "warmup must be an int >= 0"),
    ((None, 1, 3), "rounds needs batches"),
])
def test_loader_arguments_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        loader_args(*args)


@pytest.mark.parametrize(("target", "cap", "match"), [(0, 5, "target_noise"), (100, 5, "target_noise"),
                                                      (1, 0, "max_seconds"), (1, True, "max_seconds")])
def test_sizing_arguments_are_checked(target, cap, match):
    with pytest.raises(ValueError, match=match):
        sizing_args(target, cap)


# ---------------------------------------------------------------- paired rounds (--nwt-against)


@pytest.mark.parametrize(("n", "k"), [(5, 0), (6, 1), (7, 3), (8, 4), (9, 6), (10, 9), (20, 53)])
def test_signed_rank_matches_the_published_critical_values(n, k):
    """k - 1 is the two-sided 5% critical value of Wilcoxon's T in the standard tables (none for 5)."""
    assert signed_rank(n) == k


def test_signed_rank_approximation_joins_the_exact_values():
    import cupy_nwt.pytest_plugin._interval as interval

    n = interval.EXACT_PAIRED
    assert abs(signed_rank(n) - signed_rank(n + 1)) < 30 and signed_rank(n + 1) > signed_rank(n)


def test_pairs_take_out_a_drift_that_hides_a_slowdown_from_unpaired_rounds():
    """The machine's speed swings by 2x between pairs; within a pair the working tree is 10% slower."""
    rng = random.Random(3)
    drift = [1000.0 * (1.5 if i % 3 == 0 else 0.75) for i in range(10)]
    base = [d * math.exp(rng.gauss(0, 0.01)) for d in drift]
    slower = [d * 0.9 * math.exp(rng.gauss(0, 0.01)) for d in drift]
    same = [d * math.exp(rng.gauss(0, 0.01)) for d in drift]
    assert judge(base, slower, 5).verdict == "inconclusive"  # unpaired: the drift swamps it
    j = judge(base, slower, 5, paired=True)
    assert j.verdict == "regressed" and -12 < j.change_pct < -8 and j.high_pct < 0
    assert judge(base, same, 5, paired=True).verdict == "ok"
    iv = paired_interval(base, same)
    assert iv.low < 0 < iv.high


def test_paired_rounds_need_the_same_count_and_six_pairs_for_an_interval():
    with pytest.raises(ValueError, match="same number"):
        judge([1.0, 2.0], [1.0], 5, paired=True)
    assert judge([1.0] * 5, [0.5] * 5, 5, paired=True).verdict == "inconclusive"  # no finite interval yet


def test_the_base_revisions_rounds_are_compared_pair_by_pair():
    info = {"samples_per_s_rounds": scaled(RATE, 0.8), "cpu_s_per_1k_rounds": scaled(CPU, 1.25),
            "against": {"rev": "a" * 40, "rev_name": "main", "pairs": 8, "samples_per_s_rounds": RATE,
                        "cpu_s_per_1k_rounds": CPU}}
    got = {c.key: c for c in compare_against({"t::a": info})}
    assert set(got) == {"samples_per_s", "cpu_s_per_1k"} and all(c.paired for c in got.values())
    assert got["samples_per_s"].regressed(5) and got["cpu_s_per_1k"].regressed(5)
    assert "measured beside the base revision in this job, 8 pairs of rounds [baseline main (aaaaaaaaaa), " \
        "same job]" in got["samples_per_s"].message(5)
    assert compare_against({"t::a": {"samples_per_s_rounds": RATE}}) == []


# ---------------------------------------------------------------- exact instruction counts


def _counted(n: float, by: str = "callgrind", samples: int = 256, cpu: list[float] = CPU) -> dict:
    return _info(RATE, cpu, 1.5, 0.2, instructions_per_sample=n, instructions_counted_by=by,
                 instructions_samples=samples)


def test_exact_counts_are_judged_at_their_own_limit_and_decide_over_cpu_time():
    cs = compare_throughput({"t::a": _counted(1_015_000, cpu=scaled(CPU, 1.3))},
                            {"t::a": {"fullname": "t::a", "extra_info": _counted(1_000_000)}}, "b",
                            instructions_limit_pct=1.0)
    got = {c.key: c for c in cs}
    ins = got["instructions_per_sample"]
    assert ins.regressed(5) and ins.limit(5) == 1.0  # +1.5%: inside the wall-clock limit, beyond the count's
    assert "instructions/sample rose 1.5% (more than 1%)" in ins.message(5)
    cpu = got["cpu_s_per_1k"].judgement(5)
    assert cpu.verdict == "reported" and cpu.reason == "exact counts decide"
    same = compare_throughput({"t::a": _counted(1_000_400)}, {"t::a": {"fullname": "t::a",
                              "extra_info": _counted(1_000_000)}}, "b", instructions_limit_pct=1.0)
    assert not any(c.regressed(5) for c in same)


@pytest.mark.parametrize(("old", "why"), [
    (_counted(1e6, by="perf"), "counted by perf in the baseline, callgrind here"),
    (_counted(1e6, samples=1024), "callgrind counted a different number of samples in the baseline"),
])
def test_counts_made_differently_are_reported_not_judged(old, why):
    got = {c.key: c for c in compare_throughput({"t::a": _counted(2e6)}, {"t::a": {"fullname": "t::a",
                                                "extra_info": old}}, "b", instructions_limit_pct=1.0)}
    j = got["instructions_per_sample"].judgement(5)
    assert j.verdict == "reported" and j.reason == why
