"""Does the gate's count move with where the checkout lies, with the user's variables, or with ``--nwt-against``?

The same code on the same samples must count the same wherever it was checked out (a Jenkins ``workspace@2``,
a runner whose workspace path varies, a developer's checkout against CI's) and on both sides of
``--nwt-against`` (the base revision runs from a worktree elsewhere, started as ``python -m pytest``). Run
with the package at ``--code`` (a folder holding ``cupy_nwt/``: this repository, or an older revision's
``git archive``), it copies that package and a small pipeline (3x32x32 float images, batch 16, 128
samples counted) into two git checkouts whose paths differ by 24 characters, compiled as an import leaves
them, and counts the pipeline's cost per sample (``count_pipeline``) ``--repeats`` times:

* from each checkout;
* from the shorter one with a variable of the user's 0, 21 and 500 characters long, and with a PATH holding
  a venv's bin twice;
* through ``pytest --nwt-against=HEAD`` in each checkout, the code unchanged: this run's cost and the base
  revision's, counted in the same job.

    python bench/studies/what_does_the_gate_see/paths.py --out bench/studies/what_does_the_gate_see/vm-2cpu/paths.json
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
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PIPELINE = '''
import numpy as np


class Floats:
    """3x32x32 float images, normalised: a sample's work mostly NumPy."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = np.full((3, 32, 32), float(i), np.float32)
        return (x - x.mean()) / (x.std() + 1.0)
'''
COUNT = ("import json; from floats import Floats; from cupy_nwt.pytest_plugin._count import count_pipeline; "
         "c = count_pipeline(Floats(), batch_size=16, collate_fn=None, batch_transform=None, samples=128); "
         "print(json.dumps({'cost': c.cost.total, **c.cost.to_dict()}))")
BENCH = '''
from floats import Floats


def test_floats(loader_benchmark):
    loader_benchmark(Floats(), batch_size=16, device="cpu", max_seconds=0.5, count_samples=128)
'''
CONFTEST = "def pytest_benchmark_generate_machine_info(config):\n    return {'node': 'paths'}\n"
INI = "[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n"


def checkout(where: Path, code: Path) -> Path:
    """A git checkout at ``where`` of the package and the pipeline, its bytecode compiled."""
    shutil.copytree(code / "cupy_nwt", where / "cupy_nwt", ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in (("floats.py", PIPELINE), ("test_bench.py", BENCH), ("conftest.py", CONFTEST),
                       ("pytest.ini", INI)):
        (where / name).write_text(text)
    git = ["git", "-C", str(where), "-c", "user.email=s@s", "-c", "user.name=s"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the code"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    compileall.compile_dir(str(where / "cupy_nwt"), quiet=1)
    compileall.compile_file(str(where / "floats.py"), quiet=1)
    return where


def environment(where: Path, **extra: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {"PATH": os.pathsep.join([bin_dir, "/usr/local/bin:/usr/bin:/bin"]), "HOME": os.environ.get("HOME", "/"),
            "LANG": "C.UTF-8", "PYTHONPATH": str(where), **extra}


def count(where: Path, **extra: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", COUNT], cwd=where, env=environment(where, **extra),
                          capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"the count failed in {where}: {done.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def against(where: Path) -> dict[str, float]:
    """This run's cost and the base revision's (HEAD: the same code) under ``pytest --nwt-against=HEAD``."""
    out = where / "out.json"
    out.unlink(missing_ok=True)
    pytest_script = Path(sys.executable).with_name("pytest")
    cmd = [str(pytest_script)] if pytest_script.exists() else [sys.executable, "-m", "pytest"]
    done = subprocess.run([*cmd, "test_bench.py", "--nwt-against=HEAD", f"--benchmark-json={out}", "-q"], cwd=where,
                          env=environment(where), capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"pytest --nwt-against failed in {where}: {done.stdout.strip().splitlines()[-3:]}")
    info = json.loads(out.read_text())["benchmarks"][0]["extra_info"]
    return {"this_run": info["cost_per_sample"], "base_revision": info["against"]["cost_per_sample"]}


def spread_pct(costs: list[float]) -> float:
    return 100.0 * (max(costs) - min(costs)) / min(costs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="a folder holding the cupy_nwt package to count with")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    code = args.code.resolve()
    revision = subprocess.run(["git", "-C", str(code), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=False).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="gate-paths-"))
    try:
        short, deep = checkout(tmp / "a", code), checkout(tmp / ("a" * 25), code)
        reps = range(args.repeats)
        paths = {str(len(str(c))): [count(c)["cost"] for _ in reps] for c in (short, deep)}
        bin_dir = str(Path(sys.executable).parent)
        env: dict[str, list[float]] = {
            f"variable of {n}": [count(short, MY_SETTING="x" * n)["cost"] for _ in reps] for n in (0, 21, 500)}
        twice = os.pathsep.join([bin_dir, environment(short)["PATH"]])
        env["PATH with a bin twice"] = [count(short, PATH=twice)["cost"] for _ in reps]
        ab = [against(c) for _ in reps for c in (short, deep)]
        record: dict[str, Any] = {
            "code": str(args.code), "revision": revision or None, "python": platform.python_version(),
            "machine": platform.machine(), "load_average": os.getloadavg(), "repeats": args.repeats,
            "checkout_path_lengths": {"short": len(str(short)), "deep": len(str(deep))},
            "cost_by_checkout_path_length": paths,
            "checkout_paths_spread_pct": spread_pct([x for v in paths.values() for x in v]),
            "cost_by_user_environment": env,
            "user_environment_spread_pct": spread_pct([x for v in env.values() for x in v]),
            "against_head_unchanged": ab,
            "against_change_pct": [100.0 * (r["this_run"] - r["base_revision"]) / r["base_revision"] for r in ab],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k.endswith("_pct")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
