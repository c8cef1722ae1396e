"""What does giving batch b to worker b % num_workers (torch's rule) cost against the least busy worker?

A dataset whose samples wait 1 ms, or 12 ms for one sample in ten (a large file, a slow read), is
the case where the rule matters: a worker holding a slow batch keeps its next batches, and the others
may run out of their own. Each measurement is a fresh interpreter with one source tree's package on
its path: a ``--workers`` persistent loader (batch 8, shuffled, seed 1) warms up for one epoch of
``--samples`` samples and then times one more. Rounds alternate the trees' order so a neighbour's
load hits both alike. ``--out-of-order`` runs this tree with ``in_order=False``, where a batch whose
worker is full goes to the next worker with room. Writes ``skewed_dispatch-<host>.json`` (with
``-out-of-order`` before ``.json`` under that flag) beside itself:

    PYTHONPATH=. python bench/studies/what_does_fixed_dispatch_cost/skewed_dispatch.py --before /tmp/before
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


class Skewed:
    """Sample i waits 1 ms, or 12 ms for one sample in ten (fixed by index)."""

    def __init__(self, n: int) -> None:
        import numpy as np  # noqa: PLC0415

        self.n, self.slow = n, np.random.default_rng(0).random(n) < 0.1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import numpy as np  # noqa: PLC0415

        time.sleep(0.012 if self.slow[i] else 0.001)
        return np.full(16, i, np.float32)


def one(workers: int, samples: int, in_order: bool = True) -> float:
    """In the child interpreter: seconds of the second epoch."""
    import warnings  # noqa: PLC0415

    from cupy_nwt import DataLoader  # noqa: PLC0415

    warnings.simplefilter("ignore")  # more workers than CPUs is the point of a sleep-bound case
    with DataLoader(Skewed(samples), batch_size=8, num_workers=workers, shuffle=True, seed=1, device="cpu",
                    persistent_workers=True, in_order=in_order) as dl:
        for _ in dl:
            pass
        t = time.perf_counter()
        for _ in dl:
            pass
        return time.perf_counter() - t


def measure(tree: Path, workers: int, samples: int, in_order: bool = True) -> float:
    call = f"s.one({workers}, {samples})" if in_order else f"s.one({workers}, {samples}, in_order=False)"
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(HERE)!r}); "
            f"import skewed_dispatch as s; print({call})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="a directory holding the earlier tree's cupy_nwt/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--samples", type=int, default=1600)
    ap.add_argument("--out-of-order", action="store_true", help="run this tree with in_order=False")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not (args.before / "cupy_nwt").is_dir():
        ap.error(f"--before {args.before}: no cupy_nwt/ there")
    if args.rounds < 1 or args.samples < 16:
        ap.error("--rounds must be >= 1 and --samples >= 16")
    try:
        counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers takes counts like 2,4, got {args.workers!r}")
    trees = {"before": args.before.resolve(), "after": ROOT}
    seconds: dict[str, dict[int, list[float]]] = {t: {w: [] for w in counts} for t in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for w in counts:
            for name in order:
                in_order = name == "before" or not args.out_of_order
                seconds[name][w].append(measure(trees[name], w, args.samples, in_order))
                print(f"round {r + 1} {name:>6} {w} workers: {seconds[name][w][-1]:.3f} s", flush=True)
    doc = {
        "what": "seconds of one shuffled epoch of a sleep-bound dataset with one slow sample in ten, batch 8",
        "command": "python bench/studies/what_does_fixed_dispatch_cost/skewed_dispatch.py " + " ".join(argv or sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
        "samples": args.samples, "rounds": args.rounds, "after_in_order": not args.out_of_order,
        "seconds": seconds,
        "after_over_before": {w: statistics.median(seconds["after"][w]) / statistics.median(seconds["before"][w])
                              for w in counts},
    }
    suffix = "-out-of-order" if args.out_of_order else ""
    out = args.out or HERE / f"skewed_dispatch-{os.uname().nodename}{suffix}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for w, ratio in doc["after_over_before"].items():
        print(f"{w} workers: after/before {ratio:.3f} (medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
