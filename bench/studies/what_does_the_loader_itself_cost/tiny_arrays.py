"""Tiny arrays in wall clock: where the loader, not the dataset, sets the pace, two revisions interleaved.

The workload of ``loader_instructions`` (16-byte NumPy samples, batch 64, device cpu, fork workers) timed
instead of counted: samples/s of cupy_nwt's DataLoader at each of ``--workers`` (default 0 and 2), and of
the floor (fetch each sample, ``np.stack`` 64), whose rate times the usable CPUs (at most the workers) is
the ceiling a loader with that many workers could reach if it cost nothing. Each revision is checked out
into its own git worktree and measured with its own package, in rounds whose order flips (before-after,
after-before, ...) so that the load of a shared machine hits both alike; each slot runs every cell
``--repeats`` times (median), the first ``--warmup`` batches of a run untimed. ``--before``/``--after``
may also name a folder holding a source tree (``cupy_nwt/`` in it), measured as it stands: a GPU machine
may get the working tree without git history, and the before tree beside it (``bash bench/gpu_session.sh
--prepare-before``). Per cell the result holds each round's figure of both revisions, the ratio of their
medians (after / before) and the noise: the largest relative spread between rounds of one revision.
Writes ``bench/results/<host>/tiny_arrays.json``:

    .venv/bin/python bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py --before 7ebea86 --after HEAD --rounds 5
    python3 bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py --before .gpu-run/before --after . --workers 0,8,15 --rounds 3 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
BATCH = 64
SAMPLE_BYTES = 16
WORKERS = (0, 2)


class TinySamples:
    def __init__(self, n: int) -> None:
        self.data = np.arange(n * SAMPLE_BYTES, dtype=np.uint8).reshape(n, SAMPLE_BYTES)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[i]


def rate(loader: str, workers: int, batches: int, warmup: int) -> float:
    """Samples/s over ``batches`` timed batches, after ``warmup`` untimed ones (worker start-up)."""
    ds = TinySamples((batches + warmup) * BATCH)
    if loader == "floor":
        it: Any = (np.stack([ds[i] for i in range(s, s + BATCH)]) for s in range(0, len(ds), BATCH))
    else:
        from cupy_nwt.loader import DataLoader  # noqa: PLC0415 - the revision under test, by PYTHONPATH

        it = iter(DataLoader(ds, batch_size=BATCH, num_workers=workers, device="cpu"))
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * BATCH / (time.perf_counter() - t0)


def cells(workers: Sequence[int]) -> list[tuple[str, int]]:
    """The loader at each worker count, then the floor (no workers: its rate sets every ceiling)."""
    return [("cupy_nwt", w) for w in workers] + [("floor", 0)]


def parse_workers(text: str) -> tuple[int, ...]:
    """``0,8,15`` -> (0, 8, 15): distinct whole numbers from 0 up, or a one-line ValueError."""
    try:
        got = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise ValueError(f"--workers takes whole numbers separated by commas (like 0,8,15), got {text!r}") from None
    if any(w < 0 for w in got) or len(set(got)) != len(got):
        raise ValueError(f"--workers takes distinct numbers from 0 up, got {text!r}")
    return got


def side(name: str) -> tuple[str, Path | None]:
    """What ``--before``/``--after`` names: a folder holding ``cupy_nwt/`` (its ``REVISION`` file, written
    by ``gpu_session.sh --prepare-before``, says which commit it is; else its path), or a revision."""
    folder = Path(name)
    if folder.is_dir():
        if not (folder / "cupy_nwt").is_dir():
            raise SystemExit(f"tiny_arrays: the folder {name!r} holds no cupy_nwt/ (a source tree), "
                             "and a folder is not taken as a revision")
        folder = folder.resolve()
        stamp = folder / "REVISION"
        return (stamp.read_text(encoding="ascii").strip() if stamp.is_file() else str(folder)), folder
    from bench.interleave_compare import resolve  # noqa: PLC0415 - with the repository on the path (main)

    return resolve(name), None


def slot(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """Every cell, ``--repeats`` times each, with the package of the checkout at ``tree``: median samples/s."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OPENBLAS_NUM_THREADS": "1"}
    got: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for loader, workers in cells(args.workers):
            out = subprocess.run([sys.executable, __file__, "--child", loader, str(workers), str(args.batches),
                                  str(args.warmup)], env=env, cwd=tree, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"tiny_arrays: {loader} w={workers} failed in {tree}:\n{out.stderr[-2000:]}")
            got.setdefault(f"{loader}/w{workers}", []).append(float(out.stdout))
    return {cell: statistics.median(v) for cell, v in got.items()}


def summarize(runs: dict[str, list[dict[str, float]]], cpus: int,
              workers_list: Sequence[int] = WORKERS) -> list[dict[str, Any]]:
    """Per loader cell: both revisions' rounds, their ratio, the noise, and the share of the ceiling."""
    rows = []
    for loader, workers in cells(workers_list):
        if loader == "floor":
            continue
        cell = f"{loader}/w{workers}"
        row: dict[str, Any] = {"cell": cell, "num_workers": workers}
        for label, rounds in runs.items():
            ceiling = [r["floor/w0"] * max(1, min(workers, cpus)) for r in rounds]
            row[label] = [r[cell] for r in rounds]
            row[f"{label}_of_ceiling"] = statistics.median(r[cell] / c for r, c in zip(rounds, ceiling))
        before, after = row["before"], row["after"]
        row["ratio"] = statistics.median(after) / statistics.median(before)
        row["noise"] = max((max(v) - min(v)) / statistics.median(v) for v in (before, after))
        row["within_noise"] = abs(row["ratio"] - 1) <= row["noise"] if len(before) > 1 else None
        rows.append(row)
    floor = [r["floor/w0"] for rounds in runs.values() for r in rounds]
    rows.append({"cell": "floor/w0", "num_workers": 0, "samples_per_s": statistics.median(floor),
                 "noise": (max(floor) - min(floor)) / statistics.median(floor)})
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", help="the revision, or a folder holding a source tree, to compare against (required)")
    p.add_argument("--after", default="HEAD", help="the revision or source-tree folder under test (default HEAD)")
    p.add_argument("--workers", default=",".join(map(str, WORKERS)),
                   help="the loader's worker counts, comma-separated (default 0,2)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="runs of each cell per slot (median)")
    p.add_argument("--batches", type=int, default=400, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=20, help="untimed batches per run")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--note", default="")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        loader, workers, batches, warmup = args.child
        print(rate(loader, int(workers), int(batches), int(warmup)))
        return 0
    if args.before is None or min(args.rounds, args.repeats, args.batches) < 1 or args.warmup < 0:
        print("tiny_arrays: --before is required, --rounds, --repeats and --batches must be >= 1, --warmup >= 0",
              file=sys.stderr)
        return 2
    try:
        args.workers = parse_workers(args.workers)
    except ValueError as exc:
        print(f"tiny_arrays: {exc}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from bench.interleave_compare import interleaved  # noqa: PLC0415 - the repository is on the path now
    from cupy_nwt import system  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report  # noqa: PLC0415

    sides = {"before": side(args.before), "after": side(args.after)}
    revs = {label: rev for label, (rev, _) in sides.items()}
    folders = {label: folder for label, (_, folder) in sides.items() if folder is not None}
    started = time.perf_counter()
    runs = interleaved(revs, args.rounds, lambda label, tree, k, tmp: slot(tree, args), prefix="tiny-arrays-",
                       folders=folders)
    cpus = system.usable_cpus()
    result = {"host": system.host_tag(), "cpus": cpus, "before": revs["before"], "after": revs["after"],
              "folders": {label: str(folder) for label, folder in folders.items()}, "workers": list(args.workers),
              "rounds": args.rounds, "repeats": args.repeats, "batches": args.batches, "warmup": args.warmup,
              "batch_size": BATCH, "sample_bytes": SAMPLE_BYTES, "note": args.note,
              "wall_s": time.perf_counter() - started, "cells": summarize(runs, cpus, args.workers)}
    out = args.out or ROOT / "bench" / "results" / system.host_tag() / "tiny_arrays.json"
    report.write_json(result, out)
    print(json.dumps(result["cells"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
