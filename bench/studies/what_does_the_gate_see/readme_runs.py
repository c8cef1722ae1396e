"""Does the README's flow count the same code the same from one run to the next?

A user follows the README: a fresh git folder holding ``bench/test_pipeline.py`` (its ``test_loader``), one run
that saves ``bench/baseline.json``, then CI runs judged against it. Each run leaves something beside the test
(the saved baseline, pytest's cache, a second baseline), and the counting process used to list the folders it
imports from, so each of them moved the count. For each ``--code`` (a folder holding ``cupy_nwt/``: this
repository, or a worktree of an older revision), in ``--folders`` fresh folders (two at a time), it runs:

1. ``pytest bench/test_pipeline.py --nwt-save-baseline=bench/baseline.json`` (the first run: a fresh folder);
2. ``pytest ... --nwt-save-baseline=bench/b2.json`` (the next run, after the state the first left);
3. ``pytest ... --nwt-baseline=bench/baseline.json --nwt-require-baseline --nwt-throughput-drop=5`` (the gate);
4. the gate again, started as ``python -m pytest`` (the interpreter by another name),

and records each run's cost per sample and its components (``--benchmark-json``, written outside the folder).

    python bench/studies/what_does_the_gate_see/readme_runs.py --code . --code /tmp/old-worktree \\
        --out bench/studies/what_does_the_gate_see/vm-2cpu/readme_runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

TEST = '''import pytest
from cupy_nwt.data import SyntheticCIFAR10
from cupy_nwt.data import CifarTrainTransform

def test_loader(loader_benchmark):
    loader_benchmark(SyntheticCIFAR10(n=4096), batch_size=128, num_workers=2, persistent_workers=True,
                     shuffle=True, seed=0, batch_transform=CifarTrainTransform())
'''
RUNS = (("first run (saves bench/baseline.json)", "pytest", ["--nwt-save-baseline=bench/baseline.json"]),
        ("next run (saves bench/b2.json)", "pytest", ["--nwt-save-baseline=bench/b2.json"]),
        ("gate", "pytest", ["--nwt-baseline=bench/baseline.json", "--nwt-require-baseline",
                            "--nwt-throughput-drop=5"]),
        ("gate as python -m pytest", "-m", ["--nwt-baseline=bench/baseline.json", "--nwt-require-baseline",
                                            "--nwt-throughput-drop=5"]))


def one_folder(code: Path, base: Path, cache: Path, index: int) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="readme-", dir=base))
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    (folder / "bench").mkdir()
    (folder / "bench" / "test_pipeline.py").write_text(TEST)
    env = {**os.environ, "PYTHONPATH": str(code.resolve()), "XDG_CACHE_HOME": str(cache)}
    out = []
    for n, (what, how, args) in enumerate(RUNS):
        report = base / f"{folder.name}-{n}.json"
        start = ([os.path.join(os.path.dirname(sys.executable), "pytest")] if how == "pytest"
                 else [sys.executable, "-m", "pytest"])
        done = subprocess.run([*start, "bench/test_pipeline.py", "-p", "no:randomly", f"--benchmark-json={report}",
                               *args], cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False)
        info = json.loads(report.read_text())["benchmarks"][0]["extra_info"] if report.exists() else {}
        verdict = [x for x in done.stdout.splitlines() if "cost/sample" in x and "[baseline" in x]
        out.append({"folder": index, "run": what, "exit": done.returncode,
                    "cost_per_sample": info.get("cost_per_sample"), "components": info.get("cost_components"),
                    "gate_line": verdict[0] if verdict else None})
        print(json.dumps(out[-1]), flush=True)
    return out


def spread(values: list[float]) -> float:
    return 100.0 * (max(values) - min(values)) / min(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, action="append", required=True, help="a folder holding cupy_nwt/")
    ap.add_argument("--folders", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    record: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                              "load_average_at_start": os.getloadavg(),
                              "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
                              "test": TEST, "runs": [r[0] for r in RUNS], "codes": []}
    with tempfile.TemporaryDirectory(prefix="nwt-readme-") as tmp:
        cache = Path(tmp) / "cache"  # the dataset is built by the first run, as on a fresh runner
        for code in args.code:
            revision = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                      text=True, check=False).stdout.strip()
            base = Path(tempfile.mkdtemp(prefix="code-", dir=tmp))
            with ThreadPoolExecutor(2) as pool:
                runs = [r for rs in pool.map(lambda i: one_folder(code, base, cache, i), range(args.folders))
                        for r in rs]
            costs = [r["cost_per_sample"] for r in runs if r["cost_per_sample"] is not None]
            same_name = [r["cost_per_sample"] for r in runs if r["cost_per_sample"] is not None
                         and "python -m" not in r["run"]]
            record["codes"].append({
                "code": str(code), "revision": revision or None, "dirty": bool(subprocess.run(
                    ["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                    text=True, check=False).stdout.strip()),
                "runs": runs, "distinct_costs": sorted(set(costs)), "spread_pct": spread(costs),
                "spread_pct_started_as_pytest": spread(same_name),
                "gates_failed": sum(1 for r in runs if r["run"].startswith("gate") and r["exit"] != 0)})
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps([{k: c[k] for k in ("revision", "spread_pct", "spread_pct_started_as_pytest", "distinct_costs")}
                      for c in record["codes"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
