"""bench/suites/test_bench_gate.py is the suite the gate judges: run as its docstring says, against a baseline
saved here, its pipeline is judged on its counted cost (not merely shown, as a plain ``benchmark``'s clock is)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bench/suites/test_bench_gate.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("valgrind") is None, reason="the gate counts with valgrind")]


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", SUITE, "-k", "numba-array", "-q", "-p", "no:cacheprovider",
           "--nwt-max-seconds=1", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_gate_judges_the_loader_suite_on_its_counted_cost(tmp_path):
    base = str(tmp_path / "base.json")
    saved = _pytest(f"--nwt-save-baseline={base}")
    assert saved.returncode == 0, saved.stdout[-3000:]
    gated = _pytest(f"--nwt-baseline={base}", "--nwt-require-baseline", "--nwt-throughput-drop=5")
    assert gated.returncode == 0, gated.stdout[-3000:]
    name = f"{SUITE}::test_loader_pipeline[numba-array]"
    assert f"{name}: cost/sample " in gated.stdout
    assert any(line.startswith(name) and line.rstrip().endswith(" ok") for line in gated.stdout.splitlines())
    assert "judged nothing" not in gated.stdout
