"""Does preloading the package's modules in forkserver's server shorten a loader's start-up?

Each round starts two fresh interpreters, one whose forkserver preloads only the worker loop (the
list before the change, ``--no-preload``) and one with the package's modules of the dataset and batch
transform too (the loader as it is), and times a 3-worker loader on the Numba array workload to its
first batch twice in each: cold (the server starts too) and warm. Rounds interleave the two so a
neighbour's load hits both alike. Writes ``forkserver_start-<host>.json`` beside itself:

    PYTHONPATH=. python bench/forkserver_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cupy_nwt import system
from cupy_nwt.reporting import tables as report

RESULTS = Path(__file__).resolve().parent


def one(preload: bool, workers: int) -> list[float]:
    """First-batch seconds of two loaders in this process: forkserver cold, then warm."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: bench.workloads
    from bench.workloads import make_workloads  # noqa: PLC0415
    from cupy_nwt import DataLoader  # noqa: PLC0415
    from cupy_nwt.loader.workers import process, start  # noqa: PLC0415

    if not preload:
        process.forkserver_preload = lambda objects=(): start.forkserver_preload()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        wl = next(w for w in make_workloads(Path(tmp), decode_images=256, array_images=1024) if w.name == "numba-array")
        for _ in range(2):
            t = time.perf_counter()
            with DataLoader(wl.dataset, batch_size=128, num_workers=workers, batch_transform=wl.batch_transform,
                            multiprocessing_context="forkserver") as loader:
                next(iter(loader))
                out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--one", choices=["preload", "no-preload"], help=argparse.SUPPRESS)
    p.add_argument("--out-dir", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one == "preload", args.workers)))
        return 0
    runs: dict[str, list[list[float]]] = {"no-preload": [], "preload": []}
    for r in range(args.rounds):
        for mode in runs:
            proc = subprocess.run([sys.executable, __file__, "--one", mode, "--workers", str(args.workers)],
                                  capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(proc.stdout.splitlines()[-1]))
            print(f"round {r + 1}: {mode:10s} cold {runs[mode][-1][0]:.2f} s, warm {runs[mode][-1][1]:.2f} s",
                  file=sys.stderr)
    medians = {m: {"cold": statistics.median(x[0] for x in v), "warm": statistics.median(x[1] for x in v)}
               for m, v in runs.items()}
    doc = {"host": system.host_info().to_dict(), "workers": args.workers, "workload": "numba-array, 1,024 images",
           "first_batch_seconds": runs, "medians": medians, "load_average": list(__import__("os").getloadavg())}
    out = Path(args.out_dir) / f"forkserver_start-{system.host_tag()}.json"
    report.write_json(doc, out)
    print(json.dumps(medians), f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
