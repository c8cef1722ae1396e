"""Worker start-up cost per start method: what choosing forkserver (or spawn) over fork costs a script.

The loader starts workers by fork unless a threaded runtime (JAX, TensorFlow, torch's CUDA) or
CUDA makes it unsafe; then by forkserver. This measures the price of that choice on
cupy_nwt's DataLoader (device="cpu"), for each start method this platform has:

* ``first_batch_s``: time from ``iter(loader)`` to the first batch of a fresh loader (workers start,
  receive the dataset, make a batch). Round 0 of forkserver also starts the server process itself;
  it is reported apart as ``cold_first_batch_s``, the medians are over the later rounds;
* ``restart_s``: per later epoch, ``iter()`` to first batch, with and without persistent workers
  (without, each epoch starts its workers again).

``--import-torch`` makes this script import torch at its top, as a PyTorch user's script does: the
main process has it, forkserver's server imports it once (it preloads the main module) and each
spawned worker imports it again (it re-imports the main module). The dataset is small NumPy
arrays, so start-up, not batch making, is what is timed. Writes
``worker_start-<host>.json`` beside this script (``worker_start-torch-<host>.json`` with ``--import-torch``):

    .venv/bin/python bench/studies/what_does_a_worker_start_cost/worker_start.py
    .venv/bin/python bench/studies/what_does_a_worker_start_cost/worker_start.py --import-torch
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from cupy_nwt import DataLoader, system
from cupy_nwt.reporting import tables as report

RESULTS = Path(__file__).resolve().parent  # this study's folder
IMPORT_TORCH = "CUPY_NWT_BENCH_IMPORT_TORCH"  # set by --import-torch; read again by re-imports in workers
if os.environ.get(IMPORT_TORCH):
    import torch  # noqa: F401
METHODS = ("fork", "forkserver", "spawn")


class Arrays:
    """``n`` small float32 samples: cheap to make, so the workers' start is what the clock sees."""

    def __init__(self, n: int, size: int) -> None:
        self.data = np.random.default_rng(0).random((n, size), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[i]


def first_batch_s(loader: DataLoader) -> tuple[float, Any]:
    """Seconds from ``iter()`` to the first batch, and the iterator (to drain or drop)."""
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    return time.perf_counter() - t0, it


def fresh_loaders(method: str, dataset: Arrays, workers: int, batch_size: int, rounds: int) -> list[float]:
    """Round r: a new loader, timed to its first batch, then closed."""
    out = []
    for _ in range(rounds):
        with DataLoader(dataset, batch_size=batch_size, num_workers=workers, device="cpu",
                        multiprocessing_context=method) as loader:
            seconds, it = first_batch_s(loader)
            del it
        out.append(seconds)
    return out


def epoch_restarts(method: str, dataset: Arrays, workers: int, batch_size: int, epochs: int,
                   persistent: bool) -> list[float]:
    """Epochs 2.. of one loader: ``iter()`` to first batch of each (the first epoch, a cold start, is left out)."""
    out = []
    with DataLoader(dataset, batch_size=batch_size, num_workers=workers, device="cpu", multiprocessing_context=method,
                    persistent_workers=persistent) as loader:
        for epoch in range(epochs):
            seconds, it = first_batch_s(loader)
            for _ in it:
                pass
            if epoch:
                out.append(seconds)
    return out


def summary(xs: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "n": len(xs), "all_s": xs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11, help="fresh loaders per start method (round 0 is cold)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs per loader for the restart figures")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--sample-size", type=int, default=1024, help="float32 values per sample")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--import-torch", action="store_true", help="import torch in the main process first")
    ap.add_argument("--note", default="")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if min(args.workers, args.samples, args.sample_size, args.batch_size) < 1 or args.rounds < 2 or args.epochs < 2:
        print("workers, samples, sample size and batch size must be >= 1; rounds and epochs >= 2", file=sys.stderr)
        return 2
    unknown = [m for m in methods if m not in mp.get_all_start_methods()]
    if unknown or not methods:
        print(f"start methods must be among {mp.get_all_start_methods()}, got {args.methods!r}", file=sys.stderr)
        return 2
    torch_version = None
    if args.import_torch:
        os.environ[IMPORT_TORCH] = "1"
        import torch as imported  # noqa: PLC0415

        torch_version = imported.__version__
    dataset = Arrays(args.samples, args.sample_size)
    runs = []
    for method in methods:
        fresh = fresh_loaders(method, dataset, args.workers, args.batch_size, args.rounds)
        run = {"start_method": method, "cold_first_batch_s": fresh[0], "first_batch": summary(fresh[1:]),
               "restart": {kind: summary(epoch_restarts(method, dataset, args.workers, args.batch_size, args.epochs,
                                                        persistent))
                           for kind, persistent in (("non_persistent", False), ("persistent", True))}}
        runs.append(run)
        print(f"{method:10s} first batch {run['first_batch']['median_s'] * 1e3:8.1f} ms (cold "
              f"{fresh[0] * 1e3:.1f} ms)  epoch restart {run['restart']['non_persistent']['median_s'] * 1e3:8.1f} ms"
              f"  persistent {run['restart']['persistent']['median_s'] * 1e3:6.1f} ms", flush=True)
    result = {"workers": args.workers, "rounds": args.rounds, "epochs": args.epochs, "samples": args.samples,
              "sample_size": args.sample_size, "batch_size": args.batch_size, "torch_imported": torch_version,
              "host": system.host_info(), "note": args.note, "runs": runs}
    name = f"worker_start{'-torch' if args.import_torch else ''}-{system.host_tag()}.json"
    path = report.write_json(result, args.output or RESULTS / name)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
