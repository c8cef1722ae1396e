"""bench/suites are run by hand and on a GPU machine, not by CI: at least every suite imports and collects here,
so a renamed workload or fixture fails now rather than on the next benchmark run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_suite_collects():
    got = subprocess.run([sys.executable, "-m", "pytest", "bench/suites", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    suites = {line.split("::")[0] for line in got.stdout.splitlines() if "::" in line}
    assert suites == {str(p.relative_to(ROOT)) for p in (ROOT / "bench" / "suites").glob("test_*.py")}
