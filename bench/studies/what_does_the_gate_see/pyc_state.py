"""Does the count move with whether a package outside the checkout holds cached bytecode?

The counting process imports what lies outside the checkout (here: this repository's ``cupy_nwt``, found on
``PYTHONPATH`` as an editable install is) from where it lies, and reads a module's ``__pycache__`` where
it has one. In one fresh git folder holding the README's ``test_loader``, it runs the README's first command
(``--nwt-save-baseline``) with ``cupy_nwt``'s ``__pycache__`` removed, then compiled (``compileall``),
twice, then removed again, and records each run's cost per sample.

    python bench/studies/what_does_the_gate_see/pyc_state.py --out bench/studies/what_does_the_gate_see/vm-2cpu/pyc_state.json
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from readme_runs import TEST

ROOT = Path(__file__).resolve().parents[3]
STATES = ("removed", "compiled", "compiled", "removed")


def set_state(state: str) -> None:
    for cache in (ROOT / "cupy_nwt").rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    if state == "compiled":
        compileall.compile_dir(str(ROOT / "cupy_nwt"), quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()
    runs = []
    with tempfile.TemporaryDirectory(prefix="nwt-pyc-") as tmp:
        folder = Path(tmp) / "project"
        subprocess.run(["git", "init", "-q", str(folder)], check=True)
        (folder / "bench").mkdir()
        (folder / "bench" / "test_pipeline.py").write_text(TEST)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
        for n, state in enumerate(STATES):
            set_state(state)
            report = Path(tmp) / f"run-{n}.json"
            done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "pytest"), "bench/test_pipeline.py",
                                   "-p", "no:randomly", f"--benchmark-json={report}",
                                   "--nwt-save-baseline=bench/baseline.json"],
                                  cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False)
            info = json.loads(report.read_text())["benchmarks"][0]["extra_info"] if report.exists() else {}
            runs.append({"cupy_nwt __pycache__": state, "exit": done.returncode,
                         "cost_per_sample": info.get("cost_per_sample"), "components": info.get("cost_components")})
            print(json.dumps(runs[-1]), flush=True)
    set_state("removed")
    costs = [r["cost_per_sample"] for r in runs if r["cost_per_sample"]]
    record = {"revision": revision, "python": platform.python_version(), "machine": platform.machine(),
              "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""), "runs": runs,
              "spread_pct": 100.0 * (max(costs) - min(costs)) / min(costs) if costs else None}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
