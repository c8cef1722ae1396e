"""bench/tune_stability.py: a tiny real run of repeated ``cupy-nwt tune`` writes the stability file and its plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "do_repeated_tunes_agree"))
import tune_stability as ts  # noqa: E402


def test_a_tiny_run_writes_runs_the_steady_curve_and_the_verdict(tmp_path, capsys):
    assert ts.main(["--runs", "2", "--synthetic-n", "256", "--batch-size", "16", "--iterations", "8",
                    "--max-workers", "2", "--rounds", "2", "--compare-iterations", "4", "--device", "cpu",
                    "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "tune_stability.json").read_text())
    runs = doc["runs"]
    assert [r["run"] for r in runs] == [1, 2] and runs[0]["replaced"]  # the first run saves into an empty store
    assert all(r["main_process"] == "busy" for r in runs)  # a CPU step, as tune represented it
    assert set(doc["steady_rounds"]) == {"0", "1"} and all(len(v) == 2 for v in doc["steady_rounds"].values())
    judged = doc["judged"]
    assert 0 < judged["in_force_agreement"] <= 1 and judged["steady_best"] in (0, 1)
    assert doc["config"]["command"].startswith("cupy-nwt tune --synthetic-n 256")
    if (tmp_path / "tune_stability.png").exists():
        assert (tmp_path / "tune_stability.png").read_bytes()[:4] == b"\x89PNG"
    assert "picks in force" in capsys.readouterr().out


def test_bad_sizes_exit_with_one_line(capsys):
    with pytest.raises(SystemExit):
        ts.main(["--runs", "0"])
    assert "--runs must be >= 1" in capsys.readouterr().err


def test_judging_uses_paired_rounds_and_the_pairwise_spread():
    runs = [ts.TuneRun(i, w, 100.0, 0.01, w, True, 3, "", "busy", 1.0, 1.0) for i, w in enumerate((2, 3), 1)]
    rounds = {0: [50.0, 55.0], 1: [80.0, 82.0], 2: [100.0, 104.0], 3: [96.0, 101.0]}
    j = ts.judge(runs, rounds)
    assert j["steady_best"] == 2
    assert j["in_force_agreement"] == pytest.approx(98.5 / 102.0)
    assert j["in_force_within_5pct_of_each_other"]
    assert j["in_force"][1]["share_of_best"] == pytest.approx((0.96 + 101 / 104) / 2)
