"""bench/judge_picks.py: the best is chosen on some rounds and judged on others, shares are paired
ratios with an interval, a tiny real run writes its files, and bad input exits with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "are_the_tuner_picks_near_the_best"))
import judge_picks as jp  # noqa: E402


def test_the_best_is_chosen_on_odd_rounds_and_judged_on_even_ones():
    """Count 3 was lucky in the choosing rounds; judged on the others, it is 2 that leads."""
    rounds = {2: [100.0, 100.0, 100.0, 100.0, 100.0, 100.0], 3: [130.0, 90.0, 125.0, 91.0, 120.0, 92.0]}
    choose, on = jp.split(rounds)
    assert list(choose[3]) == [130.0, 125.0, 120.0] and list(on[3]) == [90.0, 91.0, 92.0]
    assert jp.best_count(choose) == 3
    s = jp.share(on, 2, 3)
    assert s.ratio == pytest.approx(100 / 91) and s.low <= s.ratio <= s.high
    assert jp.share(on, 2, 3) == s  # seeded


def test_paired_rounds_cancel_a_slow_round():
    rounds = {0: [50.0, 100.0, 50.0, 50.0, 50.0, 100.0], 1: [100.0, 99.0, 100.0, 49.5, 100.0, 99.0]}
    _, on = jp.split(rounds)
    assert jp.share(on, 1, 0).ratio == pytest.approx(0.99)


def _report(folder: Path, fast: int, paper: int, exhaustive: int | None, n: int = 256, max_workers: int = 2) -> Path:
    folder.mkdir()
    trials = [{"workers": w, "samples_per_second": 100.0 + 10 * (w == 1)} for w in range(max_workers)]
    comparison = {"fast_pick": fast, "paper_pick": paper}
    if exhaustive is not None:
        comparison["exhaustive_best"] = exhaustive
    (folder / "report.json").write_text(json.dumps({
        "config": {"synthetic_n": n, "batch_size": 16}, "comparison": comparison, "fast_cost_vs_paper": 0.25,
        "tune_paper": {"trials": trials, "max_workers": max_workers, "device": "cpu"}}))
    return folder


def test_a_tiny_run_judges_every_report(tmp_path, capsys):
    a = _report(tmp_path / "run1", 1, 0, 0)
    b = _report(tmp_path / "run2", 0, 0, None)  # an older report: the exhaustive best from its trials
    assert jp.main([str(a), str(b), "--rounds", "2", "--iterations", "2", "--out-dir", str(tmp_path),
                    "--no-progress"]) == 0
    [path] = tmp_path.glob("judge_picks-*.json")
    doc = json.loads(path.read_text())
    assert set(doc["rounds"]) == {"0", "1"} and all(len(r) == 2 for r in doc["rounds"].values())
    assert [j["run"]["exhaustive_best"] for j in doc["judged"]] == [0, 1]
    best = doc["best_on_odd_rounds"]
    assert doc["shares_on_even_rounds"][str(best)]["ratio"] == 1.0
    assert "the runs' picks" in capsys.readouterr().out
    assert path.with_suffix(".png").exists()
    # judged again against the saved curve: nothing measured, the same shares
    again = tmp_path / "again"
    again.mkdir()
    assert jp.main([str(a), "--curve", str(path), "--out-dir", str(again), "--no-progress"]) == 0
    redo = json.loads(next(again.glob("judge_picks-*.json")).read_text())
    assert redo["rounds"] == doc["rounds"] and redo["judged"][0] == doc["judged"][0]
    other = _report(tmp_path / "other", 0, 0, 0, n=512)
    with pytest.raises(SystemExit, match="another workload"):
        jp.main([str(other), "--curve", str(path), "--out-dir", str(again)])


def test_bad_input_exits_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit, match="not a cupy-nwt reproduce report"):
        jp.main([str(tmp_path)])
    a = _report(tmp_path / "a", 0, 0, 0)
    b = _report(tmp_path / "b", 0, 0, 0, n=512)
    assert jp.main([str(a), str(b)]) == 2
    assert "different workloads" in capsys.readouterr().err
    assert jp.main([str(a), "--rounds", "1"]) == 2


def test_json_prints_the_result_alone_on_stdout(tmp_path, capsys):
    study = Path(jp.__file__).parent
    runs = sorted(str(p) for p in study.glob("vm-2cpu-reproduce-n8-paired-run*"))
    assert jp.main([*runs, "--curve", str(study / "judge_picks-vm-2cpu.json"), "--out-dir", str(tmp_path),
                    "--json"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)  # a pipe into a JSON reader gets nothing else
    assert printed == json.loads(next(tmp_path.glob("judge_picks-*.json")).read_text())
    assert printed["best_on_odd_rounds"] == 5 and "the runs' picks" in err
