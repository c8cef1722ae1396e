"""bench/suites/test_bench_gate.py is the suite the gate judges: run as its docstring says, each pipeline's record
holds the exact count the gate decides by (cost per sample, by callgrind), which a plain ``benchmark``'s clock
never is. How such records are judged is tested in tests/pytest_plugin (test_gate_counts, test_gate_docs_example)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bench/suites/test_bench_gate.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("valgrind") is None, reason="the gate counts with valgrind")]


def test_the_gate_suite_records_the_counted_cost_it_is_judged_by(tmp_path):
    base = tmp_path / "base.json"
    cmd = [sys.executable, "-m", "pytest", SUITE, "-k", "numba-array", "-q", "-p", "no:cacheprovider",
           "--nwt-max-seconds=0.5", f"--nwt-save-baseline={base}"]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stdout[-3000:]
    entries = {b["fullname"]: b["extra_info"] for b in json.loads(base.read_text())["benchmarks"]}
    info = entries[f"{SUITE}::test_loader_pipeline[numba-array]"]
    assert info["instructions_counted_by"] == "callgrind" and info["cost_per_sample"] > 0
    assert "judged nothing" not in got.stdout
