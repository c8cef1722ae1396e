"""The loader's own cost in instructions, counted by callgrind: what wall clock on a shared VM cannot resolve.

Method. Each figure is the difference of two runs of the same program under valgrind's callgrind, one over
2,048 samples and one over 67,584, divided by the 65,536 samples (or 1,024 batches) between them: imports,
worker start-up and shutdown are the same in both runs and cancel. The samples are 16-byte NumPy rows
(``uint8[16]``) of one array built at the larger size in both runs (only ``len()`` differs), batched by 64,
on the CPU (``device="cpu"``, the copy out of the ring included). Every run has ``PYTHONHASHSEED=0`` and
one BLAS/OpenMP thread (an idle BLAS thread pool spins a count that depends on time, not on work), and
a native run first writes the bytecode caches that a counted run would otherwise write once.

Three loaders: cupy_nwt, torch's DataLoader (both with fork workers) and the floor, the bare loop a loader
cannot beat: fetch each sample and ``np.stack`` 64 of them. Three figures:

* ``num_workers=0``: the whole process, per sample.
* 2 process workers, the main process, per batch: callgrind follows forked children on its own (no
  exec, so ``--trace-children`` is not needed) and writes one file per pid (``--callgrind-out-file=cg.%p``);
  the main process's file is the one whose pid the program wrote down.
* 2 process workers, the workers, per sample: the other pids' files summed (a forked child starts from
  its parent's counts, the same in both runs, so they cancel too).

Each figure is repeated (``--repeats``, 3 by default) and reported as the median with the spread
((max - min) / median) of the repeats. Targets (issue 39): the main process at most 100,000 instructions
a batch with 2 workers, ``num_workers=0`` at most 1.2x the floor, the workers at most 1.3x.
Writes ``bench/results/<host>/loader_instructions.json`` and prints the figures as JSON; ``--check``
exits 1 when a cupy_nwt target is missed (for CI):

    .venv/bin/python bench/studies/what_does_the_loader_itself_cost/loader_instructions.py --repeats 3 --loaders cupy_nwt,torch,floor
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
SMALL, LARGE = 2048, 67584
BATCH = 64
SAMPLE_BYTES = 16
WORKERS = 2
LOADERS = ("cupy_nwt", "torch", "floor")
TARGETS = {"main_per_batch": 100_000, "w0_vs_floor": 1.2, "workers_vs_floor": 1.3}
RUN_TIMEOUT_S = 1800
METHOD = ("valgrind callgrind instruction counts (Ir); each figure = (count of a 67,584-sample run - count of a "
          "2,048-sample run) / 65,536 samples (or / 1,024 batches of 64), so start-up and shutdown cancel; per pid "
          "(callgrind --callgrind-out-file=cg.%p follows forked workers); median and spread of the repeats")
ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class TinySamples:
    """``n`` samples of ``SAMPLE_BYTES`` bytes, rows of one array that is ``LARGE`` rows long in every run."""

    def __init__(self, n: int) -> None:
        self.data = np.arange(LARGE * SAMPLE_BYTES, dtype=np.uint8).reshape(LARGE, SAMPLE_BYTES)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[i]


def workload(loader: str, workers: int, n: int) -> None:
    """One counted program: every batch of ``n`` samples, taken and dropped."""
    ds = TinySamples(n)
    if loader == "floor":
        for start in range(0, n, BATCH):
            np.stack([ds[i] for i in range(start, min(start + BATCH, n))])
        return
    if loader == "cupy_nwt":
        from cupy_nwt.loader import DataLoader  # noqa: PLC0415 - only the loader counted is imported
        from cupy_nwt.loader.workers import process  # noqa: PLC0415

        # Workers under callgrind on a loaded host can take longer than the shutdown grace to exit, and one
        # killed by SIGKILL writes no count: here they get the time (waiting costs no instructions).
        process.SHUTDOWN_GRACE_S = 600.0

        dl: Any = DataLoader(ds, batch_size=BATCH, num_workers=workers, device="cpu")
    else:
        import torch.utils.data as tud  # noqa: PLC0415

        dl = tud.DataLoader(ds, batch_size=BATCH, num_workers=workers)
    for _ in dl:
        pass


def count(loader: str, workers: int, n: int, tmp: Path) -> tuple[int, int]:
    """(main process, workers summed) instructions of one run of ``n`` samples.

    Without workers, ``count_instructions`` counts the one process. With workers, callgrind writes a file
    per pid and each is read with the same total line that ``count_instructions`` reads.
    """
    from cupy_nwt.pytest_plugin._callgrind import _TOTAL, count_instructions  # noqa: PLC0415 - not in the child

    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    child = [sys.executable, __file__, "--child", loader, str(workers), str(n)]
    if workers == 0:
        return count_instructions([*child, os.devnull], env=env, cwd=str(ROOT), timeout=RUN_TIMEOUT_S), 0
    out_dir = Path(tempfile.mkdtemp(dir=tmp))
    pidfile = out_dir / "main.pid"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.%p", f"--log-file={out_dir}/log.%p",
           *child, str(pidfile)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        raise SystemExit(f"loader_instructions: {loader} w={workers} n={n} failed:\n{proc.stderr[-3000:]}")
    totals = {}
    for path in out_dir.glob("cg.*"):
        found = _TOTAL.search(path.read_bytes())
        if found is None:
            raise SystemExit(f"loader_instructions: callgrind wrote no total in {path}")
        totals[int(path.name.split(".")[1])] = int(found.group(1))
    main_pid = int(pidfile.read_text())
    if main_pid not in totals or len(totals) != workers + 1:
        raise SystemExit(f"loader_instructions: expected {workers + 1} processes counted, got pids {sorted(totals)}")
    return totals.pop(main_pid), sum(totals.values())


def measure(loader: str, workers: int, tmp: Path) -> dict[str, float]:
    """One repeat of one path: the per-sample (and with workers, per-batch) figures from the two lengths."""
    small, large = count(loader, workers, SMALL, tmp), count(loader, workers, LARGE, tmp)
    samples, batches = LARGE - SMALL, (LARGE - SMALL) // BATCH
    main = large[0] - small[0]
    if workers == 0:
        return {"per_sample": main / samples}
    return {"main_per_batch": main / batches, "workers_per_sample": (large[1] - small[1]) / samples}


def summary(values: Sequence[float]) -> dict[str, Any]:
    med = statistics.median(values)
    return {"median": med, "spread": (max(values) - min(values)) / med if med else 0.0, "repeats": list(values)}


def warm_caches(loaders: Sequence[str]) -> None:
    """Write the bytecode caches natively, so no counted run compiles what the other one reads."""
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    for loader in loaders:
        for workers in (0, WORKERS):
            subprocess.run([sys.executable, __file__, "--child", loader, str(workers), str(BATCH * 2), os.devnull],
                           env=env, cwd=ROOT, check=True)


def run(loaders: Sequence[str], repeats: int, jobs: int = 1) -> dict[str, Any]:
    """Every loader's figures; ``jobs`` counted runs at once (a count does not depend on the load)."""
    warm_caches(loaders)
    cells = [(loader, workers) for loader in loaders for workers in ((0,) if loader == "floor" else (0, WORKERS))]
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="loader-ir-") as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {(cell, k): pool.submit(measure, *cell, Path(tmp)) for k in range(repeats) for cell in cells}
        for loader in loaders:
            got: dict[str, list[float]] = {}
            for ((name, workers), _), future in futures.items():
                if name == loader:
                    for key, value in future.result().items():
                        got.setdefault(f"w{workers}_{key}", []).append(value)
            figures[loader] = {key: summary(v) for key, v in got.items()}
            print(f"loader_instructions: {loader} " + ", ".join(f"{k} {v['median']:,.0f}"
                                                              for k, v in figures[loader].items()),
                  file=sys.stderr, flush=True)
    return {"figures": figures, "checks": checks(figures)}


def checks(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """cupy_nwt against the floor and the targets (None where a loader was not measured)."""
    ours, floor = figures.get("cupy_nwt"), figures.get("floor")
    out: dict[str, Any] = {}
    if ours is not None:
        main = ours["w2_main_per_batch"]["median"]
        out["main_per_batch"] = {"value": main, "target": TARGETS["main_per_batch"],
                                 "met": main <= TARGETS["main_per_batch"]}
    if ours is not None and floor is not None:
        f = floor["w0_per_sample"]["median"]
        for key, fig in (("w0_vs_floor", "w0_per_sample"), ("workers_vs_floor", "w2_workers_per_sample")):
            ratio = ours[fig]["median"] / f
            out[key] = {"value": ratio, "target": TARGETS[key], "met": ratio <= TARGETS[key]}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated, of: " + ", ".join(LOADERS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1, help="counted runs at once (the counts do not depend on it)")
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON to write (default bench/results/<host>/loader_instructions.json)")
    p.add_argument("--check", action="store_true", help="exit 1 when a cupy_nwt target is missed")
    p.add_argument("--child", nargs=4, metavar=("LOADER", "WORKERS", "N", "PIDFILE"), help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        loader, workers, n, pidfile = args.child
        Path(pidfile).write_text(str(os.getpid())) if pidfile != os.devnull else None
        workload(loader, int(workers), int(n))
        return 0
    loaders = [x for x in args.loaders.split(",") if x]
    unknown = sorted(set(loaders) - set(LOADERS))
    if unknown or args.repeats < 1:
        print(f"loader_instructions: unknown loaders {unknown} or --repeats < 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))  # this checkout's package, in the counted children too (PYTHONPATH)
    from cupy_nwt.pytest_plugin._callgrind import callgrind_unavailable_reason  # noqa: PLC0415

    reason = callgrind_unavailable_reason()
    if reason is not None:
        print(f"loader_instructions: {reason}", file=sys.stderr)
        return 2
    from cupy_nwt import system  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report  # noqa: PLC0415

    started = time.perf_counter()
    result = {"host": system.host_tag(), "commit": _commit(), "method": METHOD, "samples": [SMALL, LARGE],
              "batch_size": BATCH,
              "sample_bytes": SAMPLE_BYTES, "workers": WORKERS, "env": ENV, **run(loaders, args.repeats, args.jobs)}
    result["wall_s"] = time.perf_counter() - started
    out = args.out or ROOT / "bench" / "results" / system.host_tag() / "loader_instructions.json"
    report.write_json(result, out)
    print(json.dumps(result, indent=1))
    return 1 if args.check and not all(c["met"] for c in result["checks"].values()) else 0


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
