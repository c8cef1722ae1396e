"""The CPU-side costs that bench/gpu_session.sh's step estimates rest on, timed on this host.

GPU time is scarce, so the script's estimates cannot come from trial runs on a GPU machine.
What a step does on the host (Python and import start-up, pytest's collection, nvcc's build of the
native reference, building the synthetic datasets, the loaders' per-batch CPU work, the whole NWT
reproduction with the GPU's step scaled down) runs the same on any x86 Linux machine, so it is timed
here, each the way the step runs it, and the estimates beside each step in gpu_session.sh derive
from these figures (scaled to 16 cores where the work is parallel). ``--nwt ARGS`` times
``cupy-nwt reproduce --no-gpu ARGS``: the NWT step's own command, on the CPU.

    PYTHONPATH=. python bench/studies/how_long_do_the_gpu_steps_take/session_costs.py --nwt "--max-workers 16 --iterations 50"

Writes ``bench/results/session_costs-<host>.json`` (or ``--output``). Each figure is one wall-clock
run unless it says ``median_s`` (of ``--repeats``): on a shared machine read them as upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
RESULTS = Path(__file__).resolve().parent  # this study's folder
BATCH = 128


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and all it waited for, stdout)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    took, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return took, cpu, proc.stdout


def _median(cmd: list[str], repeats: int) -> dict[str, Any]:
    runs = [_timed(cmd)[:2] for _ in range(repeats)]
    return {"command": shlex.join(cmd), "median_s": statistics.median(w for w, _ in runs),
            "median_cpu_s": statistics.median(c for _, c in runs), "all_s": [w for w, _ in runs]}


def _load() -> float:
    """The 1-minute load average: on a shared machine, what the wall-clock figures beside it went through."""
    return os.getloadavg()[0]


def batch_seconds(dataset: Any, transform: Any, batches: int = 30, warmup: int = 3) -> dict[str, float]:
    """Wall and CPU seconds per batch of ``BATCH`` made in this process (0 workers): one worker's work per
    batch. The CPU figure holds on a loaded machine, where the wall one counts the waits for a core."""
    from cupy_nwt import DataLoader

    with DataLoader(dataset, batch_size=BATCH, shuffle=True, seed=0, num_workers=0, device="cpu",
                    batch_transform=transform, drop_last=True) as loader:
        if len(loader) < warmup + batches:
            raise ValueError(f"{len(loader)} batches per epoch, fewer than {warmup + batches}")
        it = iter(loader)
        for _ in range(warmup):
            next(it)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(batches):
            next(it)
        return {"wall_s": (time.perf_counter() - t0) / batches, "cpu_s": (time.process_time() - c0) / batches}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of the short commands (median kept)")
    p.add_argument("--nwt", default=None, help="time `cupy-nwt reproduce --no-gpu` with these arguments")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    if args.repeats < 1:
        print("session_costs: --repeats must be >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from bench.workloads import make_workloads
    from cupy_nwt import system
    from cupy_nwt.data import CifarTrainTransform, SyntheticCIFAR10
    from cupy_nwt.experiments.kernel_check import find_nvcc
    from cupy_nwt.reporting import tables as report

    py = sys.executable
    out: dict[str, Any] = {"host": system.host_info(), "batch_size": BATCH, "load_average_at_start": _load()}
    out["python_import"] = _median([py, "-c", "import cupy_nwt.cli"], args.repeats)
    out["info"] = _median([py, "-m", "cupy_nwt", "info", "--json"], args.repeats)
    took, cpu, text = _timed([py, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                              "tests", "bench"])
    out["pytest_collect_gpu"] = {"seconds": took, "cpu_s": cpu, "summary": text.strip().splitlines()[-1]}
    nvcc = find_nvcc()
    if nvcc and shutil.which("make"):
        with tempfile.TemporaryDirectory() as build:
            took, cpu, _ = _timed(["make", "-s", "-C", "bench/native", f"BUILD={build}", f"NVCC={nvcc}"])
        out["native_build"] = {"seconds": took, "cpu_s": cpu}
    with tempfile.TemporaryDirectory() as tmp:
        # a fresh machine has no cache: the build is part of the NWT step there
        code = f"from cupy_nwt.data import SyntheticCIFAR10; SyntheticCIFAR10(50000, cache_dir={tmp!r})"
        took, cpu, _ = _timed([py, "-c", code])
        out["synthetic_cifar10_build"] = {"seconds": took, "cpu_s": cpu, "threads": system.usable_cpus()}
        transform = CifarTrainTransform()
        ds = SyntheticCIFAR10(50000, cache_dir=tmp)
        out["batch_s"] = {"nwt (synthetic CIFAR-10 PNGs + CifarTrainTransform)": batch_seconds(ds, transform)}
        t0, c0 = time.perf_counter(), time.process_time()
        workloads = make_workloads(Path(tmp))
        out["feed_workloads_build"] = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
        for w in workloads:
            out["batch_s"][w.name] = batch_seconds(w.dataset, w.batch_transform)
    if args.nwt is not None:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [py, "-m", "cupy_nwt", "reproduce", "--no-gpu", "--no-progress", "--out", f"{tmp}/nwt",
                   *shlex.split(args.nwt)]
            load = _load()
            took, cpu, _ = _timed(cmd, env={"CUPY_NWT_CACHE_DIR": f"{tmp}/cache", "NUMBA_CACHE_DIR": f"{tmp}/numba"})
            rep = json.loads(Path(f"{tmp}/nwt/report.json").read_text())
        # its CPU seconds include the spinner that stands for a CPU training step (one core for the trials' length)
        out["nwt"] = {"arguments": args.nwt, "seconds": took, "cpu_s": cpu, "load_average_before": load,
                      "load_average_after": _load(), "config": rep["config"],
                      "paper_search_s": rep["tune_paper"]["search_seconds"],
                      "fast_search_s": rep["tune_fast"]["search_seconds"],
                      "paper_trials": len(rep["tune_paper"]["trials"]),
                      "fast_trials": len(rep["tune_fast"]["trials"])}
    out["load_average_at_end"] = _load()
    dest = args.output or RESULTS / f"session_costs-{system.host_tag()}.json"
    report.write_json(out, dest)
    print(report.to_json(out))
    print(f"wrote {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
