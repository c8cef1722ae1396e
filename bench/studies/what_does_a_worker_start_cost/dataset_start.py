"""What does an in-memory dataset cost a loader's start, by fork and by forkserver, before and after a change?

Each measurement is a fresh interpreter holding one source tree's package: it builds an array dataset
of ``--images`` 32x32x3 images (50,000, CIFAR-10's training set, by default: 154 MB) with the CIFAR
batch transform, and times two ``--workers``-worker loaders to their first batch (the first one, cold,
also starts forkserver's server), then their ``close()`` (the cold one right after its first batch,
the warm one after an epoch); after the warm loader's epoch it reads each
worker's anonymous memory (its own copy, not a shared file's pages). Rounds alternate the trees'
order so a neighbour's load hits both alike. Writes ``dataset_start-<host>.json`` beside itself:

    PYTHONPATH=. python bench/studies/what_does_a_worker_start_cost/dataset_start.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
METHODS = ("fork", "forkserver")


def anonymous_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Anonymous:"))


class SamplePaths:
    """An image folder's sample list, (path, class) per image as torchvision's ImageFolder holds it; a
    sample is its class (nothing is read: the list is what a worker start has to carry)."""

    def __init__(self, n: int) -> None:
        self.samples = [(f"/data/train/n{i % 1000:08d}/image_{i:08d}.JPEG", i % 1000) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> int:
        return self.samples[i][1]


def one(method: str, workers: int, images: int, dataset: str) -> dict[str, Any]:
    """In the child interpreter: the figures of one tree for one start method."""
    import numpy as np  # noqa: PLC0415 - the tree under test is on PYTHONPATH only here

    from cupy_nwt import DataLoader  # noqa: PLC0415
    from cupy_nwt.data import ArrayDataset, CifarTrainTransform  # noqa: PLC0415

    rng = np.random.default_rng(0)
    arrays = dataset == "arrays"
    ds = (ArrayDataset(rng.integers(0, 256, (images, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, images))
          if arrays else SamplePaths(images))
    out: dict[str, Any] = {"first_batch_s": [], "close_s": []}
    for warm in (False, True):
        t = time.perf_counter()
        dl = DataLoader(ds, batch_size=128, num_workers=workers, batch_transform=CifarTrainTransform() if arrays else None,
                        multiprocessing_context=method, persistent_workers=True)
        it = iter(dl)
        next(it)
        out["first_batch_s"].append(time.perf_counter() - t)
        if warm:
            for _ in it if arrays else ():
                pass
            out["worker_anonymous_bytes"] = max(anonymous_bytes(p) for p in dl.worker_pids())
        t = time.perf_counter()
        dl.close()
        out["close_s"].append(time.perf_counter() - t)
    return out


def measure(tree: Path, method: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, __file__, "--one", method, "--workers", str(args.workers),
                           "--images", str(args.images), "--dataset", args.dataset], env=env, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"dataset_start: {method} in {tree} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians per tree and method: cold and warm first batch, close, worker anonymous memory."""
    def med(rows: list[dict[str, Any]], key: str, i: int | None = None) -> float:
        return statistics.median(r[key][i] if i is not None else r[key] for r in rows)

    return {tree: {method: {"cold_first_batch_s": med(rows, "first_batch_s", 0),
                            "warm_first_batch_s": med(rows, "first_batch_s", 1),
                            "close_after_first_batch_s": med(rows, "close_s", 0),
                            "close_after_epoch_s": med(rows, "close_s", 1),
                            "worker_anonymous_mib": med(rows, "worker_anonymous_bytes") / 2**20}
                   for method, rows in per.items()} for tree, per in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a folder holding the source tree (cupy_nwt/) to compare against")
    p.add_argument("--after", default=str(ROOT), help="the source tree measured against it (this checkout)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--images", type=int, default=50_000)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--dataset", choices=["arrays", "paths"], default="arrays",
                   help="arrays: the images in memory, the CIFAR batch transform, an epoch before memory is read; "
                        "paths: an image folder's sample list of --images entries, memory read after the first batch")
    p.add_argument("--out-dir", default=str(HERE))
    p.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.workers, args.images, args.dataset)))
        return 0
    methods = args.methods.split(",")
    trees = {"before": Path(args.before or ""), "after": Path(args.after)}
    bad = [f"--{k} {v}" for k, v in trees.items() if not (v / "cupy_nwt").is_dir()]
    if bad or set(methods) - set(METHODS) or min(args.rounds, args.workers, args.images) < 1:
        print(f"dataset_start: need --before and --after folders holding cupy_nwt/ (not {', '.join(bad) or 'given'}), "
              f"--methods from {','.join(METHODS)}, and --rounds, --workers, --images >= 1", file=sys.stderr)
        return 2
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {m: [] for m in methods} for t in trees}
    for r in range(args.rounds):
        for tree in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            for method in methods:
                got = measure(trees[tree].resolve(), method, args)
                runs[tree][method].append(got)
                print(f"round {r + 1}: {tree:6s} {method:10s} first batch {got['first_batch_s'][1]:.2f} s warm, "
                      f"close {got['close_s'][0]:.2f} s after it", file=sys.stderr)
    sys.path.insert(0, str(ROOT))
    from cupy_nwt import system  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report  # noqa: PLC0415

    doc = {"host": system.host_info().to_dict(), "trees": {k: str(v.resolve()) for k, v in trees.items()},
           "workers": args.workers, "images": args.images, "dataset": args.dataset, "runs": runs, "medians": summarize(runs),
           "load_average": list(os.getloadavg())}
    name = "dataset_start" if args.dataset == "arrays" else f"dataset_start-{args.dataset}"
    out = Path(args.out_dir) / f"{name}-{system.host_tag()}.json"
    report.write_json(doc, out)
    print(json.dumps(doc["medians"]), f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
