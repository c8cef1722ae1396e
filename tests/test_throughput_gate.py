"""The throughput gate's rule on hand-made rounds, and the rounds the fixtures hand it.

No timing here: every figure is made up, so each verdict is exact.
"""

from __future__ import annotations

import math

import pytest

from cupy_nwt.pytest_plugin._gate import (
    MIN_ROUNDS,
    Comparison,
    compare_throughput,
    judge,
    spread,
)
from cupy_nwt.pytest_plugin._parts import loader_args, round_rates, transfer_result

STEADY = [1000.0, 1010.0, 990.0, 1005.0, 995.0]  # q1 995, q3 1005: about 1% apart


def scaled(rounds: list[float], factor: float) -> list[float]:
    return [x * factor for x in rounds]


# ---------------------------------------------------------------- the rule


def test_a_clear_regression_fails():
    j = judge(STEADY, scaled(STEADY, 0.5), max_drop_pct=20)
    assert j.verdict == "regressed"
    assert j.change_pct == pytest.approx(-50.0)
    assert j.noise_pct == pytest.approx((1 - (995 / 1005) ** 4) * 100)
    assert (j.old, j.new, j.old_rounds, j.new_rounds) == (1000.0, 500.0, 5, 5)


def test_an_unchanged_rerun_passes():
    rerun = [1003.0, 998.0, 1012.0, 987.0, 1001.0]
    j = judge(STEADY, rerun, max_drop_pct=10)
    assert j.verdict == "ok"
    assert abs(j.change_pct) < 1


def test_a_drop_within_the_limit_passes():
    assert judge(STEADY, scaled(STEADY, 0.85), max_drop_pct=20).verdict == "ok"


def test_noise_larger_than_the_limit_is_inconclusive_not_a_failure():
    noisy_old = [1000.0, 600.0, 1400.0, 800.0, 1200.0]  # q3/q1 = 1.5
    noisy_new = scaled(noisy_old, 0.7)  # a 30% drop, beyond the 20% limit, but inside the noise
    j = judge(noisy_old, noisy_new, max_drop_pct=20)
    assert j.noise_pct is not None and j.noise_pct > 30
    assert j.verdict == "inconclusive"
    # no drop at all, but a drop of the limit's size could hide in this noise: inconclusive too
    assert judge(noisy_old, noisy_old, max_drop_pct=20).verdict == "inconclusive"


def test_a_drop_beyond_limit_and_noise_fails_even_on_a_noisy_machine():
    noisy = [1000.0, 600.0, 1400.0, 800.0, 1200.0]
    j = judge(noisy, scaled(noisy, 0.05), max_drop_pct=20)
    assert j.noise_pct > 20  # the noise alone would make a small drop inconclusive ...
    assert j.verdict == "regressed"  # ... but not a 95% one


def test_a_single_outlier_round_does_not_decide():
    hiccup = [1000.0, 1010.0, 20.0, 1005.0, 995.0]  # one round stalled 50x
    assert judge(STEADY, hiccup, max_drop_pct=10).verdict == "ok"
    assert judge(hiccup, STEADY, max_drop_pct=10).verdict == "ok"
    burst = [500.0, 505.0, 495.0, 502.0, 9000.0]  # a regression with one lucky round is still one
    assert judge(STEADY, burst, max_drop_pct=20).verdict == "regressed"


def test_without_a_limit_nothing_is_judged():
    j = judge(STEADY, scaled(STEADY, 0.1), max_drop_pct=None)
    assert j.verdict == "compared" and j.change_pct == pytest.approx(-90.0)


def test_single_figures_fall_back_to_the_plain_drop_rule():
    j = judge([1000.0], [700.0], max_drop_pct=20)
    assert j.verdict == "regressed" and j.noise_pct is None
    assert judge([1000.0], [850.0], max_drop_pct=20).verdict == "ok"
    # rounds on one side only: that side's spread is the noise
    noisy = [1000.0, 600.0, 1400.0, 800.0, 1200.0]
    assert judge([1000.0], scaled(noisy, 0.7), max_drop_pct=20).verdict == "inconclusive"


def test_spread_is_upper_over_lower_quartile_and_needs_enough_rounds():
    assert spread([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(4.0 / 2.0)  # the extremes never count
    assert spread([5.0] * MIN_ROUNDS) == 1.0
    assert spread([1.0, 2.0]) is None


@pytest.mark.parametrize(("old", "new"), [([], [1.0]), ([1.0], []), ([0.0], [1.0]), ([1.0], [math.nan]),
                                          ([1.0], [math.inf]), ([-1.0], [1.0])])
def test_judge_refuses_figures_that_are_not_positive(old, new):
    with pytest.raises(ValueError, match="positive and finite"):
        judge(old, new, 10)


# ---------------------------------------------------------------- rounds through compare_throughput


def test_compare_judges_the_rounds_medians_and_carries_the_rounds():
    baseline = {"t::a": {"fullname": "t::a", "extra_info": {"samples_per_s": 1.0, "samples_per_s_rounds": STEADY}}}
    current = {"t::a": {"samples_per_s": 999.0, "samples_per_s_rounds": scaled(STEADY, 0.5)}}
    (c,) = compare_throughput(current, baseline, "base.json")
    assert (c.old, c.new) == (1000.0, 500.0)  # medians of the rounds, not the headline figures
    assert c.old_rounds == tuple(STEADY) and c.regressed(20)
    msg = c.message(20)
    assert "samples/s fell 50.0% (more than 20%): 1,000.00 -> 500.00 (medians of 5|5 rounds, noise " in msg
    assert msg.endswith("[baseline base.json]")
    assert c.to_dict()["new_rounds"] == tuple(scaled(STEADY, 0.5))


def test_an_inconclusive_comparison_says_so_and_does_not_regress():
    noisy = [1000.0, 600.0, 1400.0, 800.0, 1200.0]
    c = Comparison("t::a", "gbps", 1000.0, 700.0, "b", tuple(noisy), tuple(scaled(noisy, 0.7)))
    assert not c.regressed(20)
    assert "t::a: GB/s inconclusive, the noise exceeds the 20% limit: 1,000.00 -> 700.00 (-30.0%)" in c.message(20)


@pytest.mark.parametrize("rounds", ["12", [], [1.0, "x"], [1.0, 0.0], [1.0, math.nan], {"a": 1.0}])
def test_rounds_that_are_not_a_list_of_positive_numbers_leave_the_headline_figure(rounds):
    baseline = {"t::a": {"fullname": "t::a", "extra_info": {"gbps": 10.0}}}
    (c,) = compare_throughput({"t::a": {"gbps": 7.0, "gbps_rounds": rounds}}, baseline, "b")
    assert (c.old, c.new, c.new_rounds) == (10.0, 7.0, ())
    assert c.regressed(20)


# ---------------------------------------------------------------- the rounds the fixtures record


def test_loader_rounds_are_consecutive_near_equal_groups_of_batches():
    counts = [8] * 12
    seconds = [0.01] * 4 + [0.02] * 8
    rates = round_rates(counts, seconds, 5)  # 12 batches: rounds of 3, 3, 2, 2, 2
    assert rates == pytest.approx([800.0, 24 / 0.05, 400.0, 400.0, 400.0])
    assert round_rates([8, 4], [0.01, 0.01], 1) == pytest.approx([600.0])
    with pytest.raises(ValueError, match="cannot split 2 timed batches into 3 rounds"):
        round_rates([8, 8], [0.1, 0.1], 3)


@pytest.mark.parametrize(("args", "match"), [
    ((5, 1, 6), r"rounds \(6\) must not exceed batches \(5\)"),
    ((5, 1, 0), "rounds must be an int >= 1"),
    ((5, 1, True), "rounds must be an int >= 1"),
    ((0, 1, 1), "batches must be an int >= 1"),
    ((5, -1, 1), "warmup must be an int >= 0"),
])
def test_loader_arguments_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        loader_args(*args)


def test_a_copy_benchmark_is_gated_on_its_repeats_like_a_loader_on_its_rounds():
    """The GPU's path without a GPU: transfer_result's extra_info through the same comparison."""
    mib = 1024**2
    fast = transfer_result(mib, "h2d", True, [1e-4, 1.01e-4, 0.99e-4, 1.02e-4, 0.98e-4], link_gbps=None)
    assert fast.gbps_rounds == pytest.approx([mib / t / 1e9 for t in (1e-4, 1.01e-4, 0.99e-4, 1.02e-4, 0.98e-4)])
    slow = transfer_result(mib, "h2d", True, [2e-4, 2.02e-4, 1.98e-4, 2.01e-4, 1.99e-4], link_gbps=None)
    hiccup = transfer_result(mib, "h2d", True, [1e-4, 1.01e-4, 50e-4, 1.02e-4, 0.98e-4], link_gbps=None)
    baseline = {"t::copy": {"fullname": "t::copy", "extra_info": fast.to_dict()}}
    (bad,) = compare_throughput({"t::copy": slow.to_dict()}, baseline, "b")
    assert bad.key == "gbps" and bad.regressed(20)
    assert bad.judgement(20).change_pct == pytest.approx(-50.0, abs=1.0)
    (ok,) = compare_throughput({"t::copy": hiccup.to_dict()}, baseline, "b")
    assert ok.judgement(20).verdict == "ok"  # one copy stalled 50x: not a regression
