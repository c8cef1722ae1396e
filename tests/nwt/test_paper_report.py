"""The paper strategy's pick explained: what alpha is, each accept/reject decision of Algorithm 1
replayed from the trials, why it stopped where it did, and the exhaustive best beside it; in
``tune --strategy paper`` and in the reproduce report."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_nwt import cli, cuda
from cupy_nwt.cli.explain import PaperDecision, explain_paper_pick, paper_decisions
from cupy_nwt.cli.reproduce import PickComparison, ReproduceConfig, ReproduceReport, reproduce_summary, summary_markdown
from cupy_nwt.nwt.trials import Measurement
from cupy_nwt.nwt.tune import tune_num_workers
from cupy_nwt.system import HostInfo

# seconds per 100 iterations by worker count: 3 gains too little, 4 is taken, 5 is faster still but
# not by more than alpha = 0.5 s, so Algorithm 1 keeps 4 although 5 is the fastest count measured
CURVE = [10.0, 6.0, 4.0, 3.6, 3.3, 3.0, 3.5]


def _flat(text: str) -> str:
    """The text with its prose unwrapped (explanations are wrapped at 100 columns)."""
    return " ".join(text.split())


def _paper(curve=CURVE, alpha=0.5):
    return tune_num_workers(max_workers=len(curve), strategy="paper", alpha=alpha, iterations=10, batch_size=32,
                            measure=lambda w, i, u: curve[w] / 100, progress=False)


def test_decisions_replay_algorithm_1_on_a_hand_made_curve():
    r = _paper()
    assert r.best_workers == 4
    d = paper_decisions(r)
    assert [x.workers for x in d] == list(range(7))
    assert [x.accepted for x in d] == [True, True, True, False, True, False, False]
    assert [x.accepted_before for x in d] == [None, 0, 1, 2, 2, 4, 4]
    assert d[0].gain is None
    assert [round(x.gain, 6) for x in d[1:]] == [4.0, 2.0, 0.4, 0.7, 0.3, -0.2]
    assert d[5].seconds_per_100 == pytest.approx(3.0)
    assert d[5].to_dict() == {"workers": 5, "seconds_per_100": d[5].seconds_per_100, "accepted_before": 4,
                              "gain": d[5].gain, "accepted": False}


def test_the_explanation_says_what_alpha_is_why_it_stopped_and_the_exhaustive_best():
    raw = explain_paper_pick(_paper())
    assert raw.startswith("why the paper's rule picked 4\n") and max(map(len, raw.splitlines())) <= 100
    text = _flat(raw)
    assert "alpha = 0.5 s per 100 iterations" in text and "by more than alpha" in text
    assert "taken: the first count" in text
    assert "taken: 0.70 s faster than 2, more than alpha" in text
    assert "passed over: only 0.40 s faster than 2, not more than alpha 0.5" in text
    assert "passed over: only 0.30 s faster than 4, not more than alpha 0.5" in text
    assert "passed over: 0.20 s slower than 4" in text
    assert ("It stopped at 4 workers (3.30 s): no later count beat that by more than 0.5 s "
            "(the fastest later count, 5, was 0.30 s faster).") in text
    assert ("Exhaustive best (fastest count measured): 5 workers at 3.00 s; the pick takes 10.0% longer "
            "per iteration and runs 1 fewer worker.") in text


def test_when_the_pick_is_the_fastest_and_the_last():
    text = _flat(explain_paper_pick(_paper([5.0, 3.0, 1.0])))
    assert "It took the last count, 2 workers (1.00 s)." in text
    assert "Exhaustive best (fastest count measured): 2, the same as the pick." in text
    one = _flat(explain_paper_pick(_paper([5.0])))
    assert "It took the last count, 0 workers" in one and "taken: the first count" in one


def test_the_fast_strategy_has_no_algorithm_1_to_explain():
    fast = tune_num_workers(max_workers=4, strategy="fast", measure=lambda w, i, u: 0.01, progress=False)
    assert explain_paper_pick(fast) == ""
    with pytest.raises(ValueError, match="only the paper strategy"):
        paper_decisions(fast)


@settings(max_examples=150, deadline=None)
@given(curve=st.lists(st.floats(0.01, 50.0), min_size=1, max_size=12), alpha=st.floats(0.0, 5.0))
def test_the_replay_agrees_with_the_search(curve, alpha):
    r = _paper(curve, alpha)
    d = paper_decisions(r)
    taken = [x for x in d if x.accepted]
    assert taken[0].workers == 0 and taken[-1].workers == r.best_workers
    assert all(b.seconds_per_100 < a.seconds_per_100 - alpha for a, b in zip(taken, taken[1:]))
    assert all(x.gain is not None and x.gain <= alpha for x in d if not x.accepted)
    assert f"picked {r.best_workers}" in explain_paper_pick(r)


def test_cli_tune_paper_prints_the_explanation(tmp_path, monkeypatch, capsys):
    import numpy as np

    class FakeMeasure:
        def __init__(self, dataset, **kwargs):
            pass

        def __call__(self, workers, iterations, warmup):
            return Measurement(CURVE[workers] / 100, CURVE[workers] / 100 * iterations)

    monkeypatch.setattr("cupy_nwt.nwt.measure.LoaderMeasure", FakeMeasure)
    data = tmp_path / "d.npz"
    np.savez(data, images=np.zeros((16, 8, 8, 3), np.uint8), labels=np.arange(16) % 10)
    base = ["tune", "--dataset", str(data), "--max-workers", "7", "--iterations", "10", "--batch-size", "8",
            "--device", "cpu", "--no-progress", "--no-save", "--no-transform"]
    assert cli.main(base + ["--strategy", "paper"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "pick: 4 workers (alpha 0.5 s per 100 iterations)" in out
    assert "why the paper's rule picked 4" in out and "Exhaustive best (fastest count measured): 5 workers" in out
    assert cli.main(base + ["--strategy", "paper", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["best_workers"] == 4
    assert cli.main(base + ["--strategy", "fast"]) == 0
    assert "why the paper's rule" not in capsys.readouterr().out


def _report() -> ReproduceReport:
    paper = _paper()
    fast = tune_num_workers(max_workers=7, strategy="fast", iterations=10, batch_size=32,
                            measure=lambda w, i, u: CURVE[w] / 100, progress=False)
    rates = {w: 32 / (c / 100) for w, c in enumerate(CURVE)}
    host = HostInfo("hand-made CPU", 8, 4, 7, 8 * 1024**3, 4 * 1024**3, "3.11", "linux")
    return ReproduceReport(ReproduceConfig(progress=False), host, cuda.GpuStatus(False, "no usable GPU: test"),
                           paper, fast, PickComparison(rates, 5, paper.best_workers, fast.best_workers),
                           skipped=("transfer experiments: turned off",), files=("out/summary.md",))


def test_the_reproduce_summary_explains_the_paper_pick():
    rep = _report()
    md = summary_markdown(rep)
    section = _flat(md.split("## why the paper's rule picked 4\n", 1)[1].split("## ", 1)[0])
    assert "alpha = 0.5 s per 100 iterations" in section
    assert "passed over: only 0.30 s faster than 4" in section
    assert "Exhaustive best (fastest count measured): 5 workers at 3.00 s" in section
    assert md.index("## why the paper's rule picked 4") < md.index("## NWT: fast vs paper")
    assert "why the paper's rule picked 4" in reproduce_summary(rep)
    doc = json.loads(json.dumps(rep.to_dict(), default=lambda o: o.to_dict()))
    assert [d["accepted"] for d in doc["paper_decisions"]] == [True, True, True, False, True, False, False]
    assert PaperDecision(**doc["paper_decisions"][4]).workers == 4


def test_fresh_rounds_judge_by_paired_ratios_with_an_interval():
    """Round 2 ran while the machine was slowed: both counts drop alike, so the paired ratio is
    unmoved, where a ratio of medians would move with the slow round's rank."""
    rounds = {2: [100.0, 50.0, 104.0, 98.0, 102.0], 4: [99.0, 49.5, 103.0, 96.0, 101.0]}
    c = PickComparison({2: 100.0, 4: 98.0}, 2, 2, 4, rounds, exhaustive_best=2)
    assert c.fresh_ratio(4) == pytest.approx(0.99)
    lo, hi = c.fresh_interval(4)
    assert 0.97 < lo <= 0.99 <= hi <= 1.0
    assert c.fresh_interval(4) == (lo, hi)  # seeded: the same report gives the same interval
    assert c.fresh_ratio(2, 4) == pytest.approx(1 / 0.99, rel=0.01)
    d = c.to_dict()
    assert d["fast_pick_vs_exhaustive_best_fresh"]["ratio"] == pytest.approx(0.99)
    assert PickComparison({2: 1.0}, 2, 2, 2).fresh_ratio(2) is None
