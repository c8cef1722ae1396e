"""bench/online_tuning.py: a tiny run writes its JSON (and plot), the picks are the documented ones,
and bad input exits 2 with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_online_tuning_follow_the_load"))
import online_tuning as ot  # noqa: E402


def run(n: int, p1: float, p2: float, p3: float) -> ot.Run:
    return ot.Run(f"fixed {n}", n, [p1, p2, p3], p1 + p2 + p3)


def test_one_shot_takes_the_fewest_workers_near_phase_ones_best_and_hindsight_the_best_per_phase():
    fixed = [run(1, 2.0, 8.0, 1.0), run(2, 1.01, 4.0, 1.2), run(3, 1.0, 2.0, 1.3)]
    assert ot.one_shot_pick(fixed).num_workers == 2
    result = ot.Result({}, {"batches_per_phase": 3}, fixed, run(2, 1.0, 2.5, 1.0), 2, fixed[1].total_s,
                       1.0 + 2.0 + 1.0, [3, 3, 1])
    d = result.to_dict()
    assert d["online_vs_hindsight"] == pytest.approx(4.5 / 4.0) and not d["within_10pct_of_hindsight"]
    assert d["online_vs_one_shot"] == pytest.approx(4.5 / 6.21) and d["beats_one_shot"]


def test_the_phases_cost_what_they_say():
    ds = ot.PhasedDataset(30, 0.0, 0.0)
    assert [ds.phase(i) for i in (0, 9, 10, 19, 20, 29)] == [0, 0, 1, 1, 2, 2]
    assert ds[25].tolist() == [25.0] * 16


def test_a_tiny_run_writes_its_result(tmp_path, capsys):
    code = ot.main(["--workers", "1,2", "--batches", "6", "--batch-size", "2", "--step-ms", "1", "--io-ms", "0.5",
                    "--decode-ms", "0.1", "--out-dir", str(tmp_path)])
    assert code == 0
    [path] = tmp_path.glob("online_tuning-*.json")
    data = json.loads(path.read_text())
    assert [r["num_workers"] for r in data["fixed"]] == [1, 2]
    assert len(data["online"]["workers_at"]) == 18 and data["online"]["decisions"][0]["action"] == "start"
    assert data["one_shot_workers"] in (1, 2) and data["hindsight_s"] <= min(r["total_s"] for r in data["fixed"])
    assert "online:" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--io-ms", "-1"]])
def test_bad_input_exits_2(argv, capsys):
    assert ot.main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_json_prints_the_result_alone_on_stdout(tmp_path, capsys):
    assert ot.main(["--workers", "1", "--batches", "3", "--batch-size", "2", "--step-ms", "0", "--io-ms", "0",
                    "--decode-ms", "0", "--out-dir", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)  # a pipe into a JSON reader gets nothing else
    assert printed == json.loads(next(tmp_path.glob("online_tuning-*.json")).read_text())
    assert "online:" in err
