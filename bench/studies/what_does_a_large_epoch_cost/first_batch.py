"""How long does the first batch of a large epoch wait for the epoch's plan?

Before its first batch a loader lays out the epoch: the order of its ``n`` samples and the batches
still to make. That should cost a pass over ``n`` indices at most, not a sort of them. Each
measurement is a fresh interpreter with one source tree's package on its path: a ``num_workers=0``
loader over a dataset of ``n`` samples that returns its index, batch 4, and the seconds from
``iter()`` to the first batch (the median of ``--repeats`` epochs, each fresh). torch's DataLoader
is measured beside them where torch is installed. Rounds alternate the trees' order. Writes
``first_batch-<host>.json`` beside itself:

    PYTHONPATH=. python bench/studies/what_does_a_large_epoch_cost/first_batch.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import importlib.util
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


class Indexes:
    """Sample i is i: the dataset costs nothing, so the first batch waits for the plan alone."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def one(loader: str, n: int, shuffle: bool, repeats: int) -> float:
    """In the child interpreter: the median seconds from ``iter()`` to the first batch."""
    if loader == "torch":
        from torch.utils.data import DataLoader as TorchLoader  # noqa: PLC0415

        def make() -> Any:
            return TorchLoader(Indexes(n), batch_size=4, shuffle=shuffle)
    else:
        from cupy_nwt import DataLoader  # noqa: PLC0415

        def make() -> Any:
            return DataLoader(Indexes(n), batch_size=4, shuffle=shuffle, seed=1, device="cpu")
    seconds = []
    for _ in range(repeats):
        loader_ = make()
        t = time.perf_counter()
        next(iter(loader_))
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds)


def measure(tree: Path | None, loader: str, n: int, shuffle: bool, repeats: int) -> float:
    path = f"sys.path.insert(0, {str(tree)!r}); " if tree is not None else ""
    code = (f"import sys; {path}sys.path.insert(1, {str(HERE)!r}); import first_batch as f; "
            f"print(f.one({loader!r}, {n}, {shuffle}, {repeats}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="a directory holding the earlier tree's cupy_nwt/")
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not (args.before / "cupy_nwt").is_dir():
        ap.error(f"--before {args.before}: no cupy_nwt/ there")
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes takes sample counts like 100000,1000000, got {args.sizes!r}")
    if min(sizes) < 4:
        ap.error("--sizes: each at least one batch (4 samples)")
    arms: dict[str, tuple[str, Path | None]] = {"before": ("cupy_nwt", args.before.resolve()), "after": ("cupy_nwt", ROOT)}
    if importlib.util.find_spec("torch") is not None:
        arms["torch"] = ("torch", None)
    seconds: dict[str, dict[str, list[float]]] = {a: {} for a in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for n in sizes:
            for shuffle in (False, True):
                key = f"{n}{' shuffled' if shuffle else ''}"
                for name in order:
                    loader, tree = arms[name]
                    s = measure(tree, loader, n, shuffle, args.repeats)
                    seconds[name].setdefault(key, []).append(s)
                    print(f"round {r + 1} {name:>6} {key:>18}: {s:.4f} s", flush=True)
    medians = {a: {k: statistics.median(v) for k, v in per.items()} for a, per in seconds.items()}
    doc = {
        "what": "seconds from iter() to the first batch, num_workers=0, batch 4, a dataset returning its index",
        "command": "python bench/studies/what_does_a_large_epoch_cost/first_batch.py " + " ".join(argv or sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
        "rounds": args.rounds, "repeats": args.repeats, "seconds": seconds, "medians": medians,
    }
    out = args.out or HERE / f"first_batch-{os.uname().nodename}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for key in medians["after"]:
        line = f"{key:>18}: before {medians['before'][key]:.4f} s, after {medians['after'][key]:.4f} s"
        if "torch" in medians:
            line += f", torch {medians['torch'][key]:.4f} s"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
