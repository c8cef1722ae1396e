"""bench/studies/what_does_a_worker_start_cost/dataset_start.py: a tiny run writes both trees' figures; bad input exits 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "studies" / "what_does_a_worker_start_cost"))
import dataset_start as ds  # noqa: E402


@pytest.mark.parametrize("dataset", ["arrays", "paths"])
def test_a_tiny_run_writes_each_tree_s_first_batch_close_and_memory(tmp_path, dataset):
    assert ds.main(["--before", str(ROOT), "--rounds", "1", "--workers", "1", "--images", "300",
                    "--methods", "fork", "--dataset", dataset, "--out-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("dataset_start-*.json")
    assert ("paths" in out.name) == (dataset == "paths")
    doc = json.loads(out.read_text())
    for tree in ("before", "after"):
        got = doc["medians"][tree]["fork"]
        assert got["cold_first_batch_s"] > 0 and got["warm_first_batch_s"] > 0 and got["close_after_epoch_s"] >= 0
        assert got["worker_anonymous_mib"] > 0
        assert len(doc["runs"][tree]["fork"]) == 1


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    assert ds.main(["--before", str(tmp_path)]) == 2
    assert ds.main(["--before", str(ROOT), "--methods", "teleport"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
