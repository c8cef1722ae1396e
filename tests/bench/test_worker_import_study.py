"""bench/studies/what_does_a_worker_start_cost/worker_import.py: a tiny run writes both ways of importing a
worker's modules; bad input stops with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "what_does_a_worker_start_cost"))
import worker_import as wi  # noqa: E402


def test_a_tiny_run_writes_both_ways(tmp_path):
    out = tmp_path / "wi.json"
    assert wi.main(["--repeats", "1", "--no-torch", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) == {"plain", "as_worker"}
    for s in doc["summary"].values():
        assert s["n"] == 1 and s["median_s"] > 0
        assert 0 < s["modules"] < 60  # a worker's own side, not the whole package


def test_bad_arguments_stop_before_any_run(tmp_path, capsys):
    assert wi.main(["--repeats", "0"]) == 2
    assert wi.main(["--tree", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--repeats must be >= 1" in line for line in err)
