"""bench/worker_start.py: a tiny run writes its JSON with each start method's figures; bad input exits 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "what_does_a_worker_start_cost"))
import worker_start as ws  # noqa: E402


def test_a_tiny_run_writes_first_batch_and_restart_figures_per_start_method(tmp_path):
    out = tmp_path / "ws.json"
    assert ws.main(["--rounds", "2", "--epochs", "2", "--samples", "16", "--sample-size", "4", "--batch-size", "8",
                    "--methods", "fork,forkserver", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["start_method"] for r in result["runs"]] == ["fork", "forkserver"]
    for r in result["runs"]:
        assert r["cold_first_batch_s"] > 0 and r["first_batch"]["n"] == 1
        assert {k: v["n"] for k, v in r["restart"].items()} == {"non_persistent": 1, "persistent": 1}


def test_bad_input_exits_2_with_one_line(capsys):
    assert ws.main(["--methods", "teleport"]) == 2
    assert ws.main(["--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
