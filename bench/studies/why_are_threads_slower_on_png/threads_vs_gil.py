"""Are thread workers slower than none on PNG decode because of the loader, or because of the GIL?

The H100 run read 3,487 samples/s with 15 thread workers against 7,042 with none on the synthetic
CIFAR-10 PNGs in a tar shard. Two arms per thread count, interleaved over ``--rounds`` rounds:

* ``loader``: ``cupy_nwt.DataLoader(worker_type="thread")``, batch 128, the workload's batch
  transform, samples/s over ``--batches`` batches after every batch the threads made ahead;
* ``pool``: the dataset's own ``__getitem__`` alone, mapped by a ``ThreadPoolExecutor`` of as many
  threads (the calling thread with none), the same number of samples: no loader at all.

If the pool drops as the loader does, the samples themselves serialise on the GIL and no loader can
hide it; if only the loader drops, the loader is the cost. Writes ``threads_vs_gil-<host>.json``
beside itself:

    PYTHONPATH=. python bench/studies/why_are_threads_slower_on_png/threads_vs_gil.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository: the shared workloads, bench.workloads

from bench.workloads import make_workloads, timed_after  # noqa: E402
from cupy_nwt import DataLoader, system  # noqa: E402

BATCH = 128


def loader_rate(dataset: Any, transform: Any, threads: int, batches: int) -> float:
    """Samples/s of thread workers, timed after every batch they made while the first was awaited."""
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=threads, worker_type="thread", device="cpu",
                        batch_transform=transform, shuffle=True, seed=0, persistent_workers=threads > 0)
    try:
        it = iter(loader)
        for _ in range(timed_after(1, threads, loader.prefetch_factor)):
            next(it)
        start = time.perf_counter()
        for _ in range(batches):
            next(it)
        return batches * BATCH / (time.perf_counter() - start)
    finally:
        loader.close()


def pool_rate(dataset: Any, threads: int, samples: int) -> float:
    """Samples/s of ``dataset[i]`` alone, on ``threads`` pool threads (the calling thread with none)."""
    indexes = [i % len(dataset) for i in range(samples)]
    start = time.perf_counter()
    if threads == 0:
        for i in indexes:
            dataset[i]
    else:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(dataset.__getitem__, indexes, chunksize=BATCH):
                pass
    return samples / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="0,1,2,4,8")
    ap.add_argument("--images", type=int, default=12000, help="PNGs in the shard (default 12000)")
    ap.add_argument("--batches", type=int, default=30, help="timed batches per loader (default 30)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        counts = sorted({int(t) for t in args.threads.split(",")})
    except ValueError:
        ap.error(f"--threads takes counts like 0,1,2, got {args.threads!r}")
    if counts[0] < 0 or args.rounds < 1 or args.batches < 1:
        ap.error("--threads must be >= 0, --rounds and --batches >= 1")
    need = (1 + 2 * counts[-1] + args.batches) * BATCH
    if args.images < need:
        ap.error(f"--images {args.images}: {counts[-1]} threads and {args.batches} timed batches need {need}")
    rates: dict[str, dict[str, list[float]]] = {"loader": {}, "pool": {}}
    with tempfile.TemporaryDirectory() as tmp:
        png = make_workloads(Path(tmp), decode_images=args.images, array_images=1)[0]
        for r in range(args.rounds):
            for t in counts if r % 2 == 0 else counts[::-1]:
                arms = ("loader", "pool") if (r + t) % 2 == 0 else ("pool", "loader")
                for arm in arms:
                    rate = (loader_rate(png.dataset, png.batch_transform, t, args.batches) if arm == "loader"
                            else pool_rate(png.dataset, t, args.batches * BATCH))
                    rates[arm].setdefault(str(t), []).append(rate)
                    print(f"round {r + 1} {arm:>6} {t:>2} threads: {rate:8.0f} samples/s", flush=True)
    medians = {arm: {t: statistics.median(v) for t, v in per.items()} for arm, per in rates.items()}
    doc = {"what": "samples/s of PNG decode: cupy_nwt thread workers against a ThreadPoolExecutor of __getitem__ alone",
           "command": "python bench/studies/why_are_threads_slower_on_png/threads_vs_gil.py " + " ".join(argv or sys.argv[1:]),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
           "python": sys.version.split()[0], "rounds": args.rounds, "rates": rates, "medians": medians}
    out = args.out or HERE / f"threads_vs_gil-{system.host_tag()}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'threads':>7} {'loader':>9} {'pool':>9}")
    for t in map(str, counts):
        print(f"{t:>7} {medians['loader'][t]:9.0f} {medians['pool'][t]:9.0f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
