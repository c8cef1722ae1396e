"""Copy-on-read: what forked workers' memory does over shuffled epochs of a list of dicts, and of it packed.

The experiment: 300,000 Python dicts read by 2 forked, persistent workers for 3 shuffled
epochs. Reading a dict writes its reference counts (and the collector's), so every page a worker
touches is copied: the workers' private memory grows toward a copy of the dataset each. The same
records packed by ``cupy_nwt.pack_records`` (NumPy columns) are read without writing to their
pages. Both loaders run each form: cupy_nwt's DataLoader (device="cpu") and, where torch imports,
``torch.utils.data.DataLoader``; the batch is only the records' ids (the collate takes one field), so
what is measured is reading the records.

Memory is taken with psutil after the first batch (the baseline: workers up) and after each epoch:
the summed PSS of the main process and the workers, and each worker's USS. Writes
``copy_on_read-<host>.json`` beside this script:

    .venv/bin/python bench/studies/do_workers_copy_what_they_read/copy_on_read.py
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from cupy_nwt import DataLoader, pack_records, system
from cupy_nwt.reporting import tables as report

RESULTS = Path(__file__).resolve().parent  # this study's folder
MB = 1 << 20
WORDS = ("cat", "dog", "bird", "tree", "car", "road", "sky", "river", "house", "person", "red", "blue", "small")


class ListDataset:
    """The records as they usually arrive: a Python list, indexed."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        return self.records[i]


def make_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Annotation-like records: ids, a label, a score, a path, a caption, tags and a box."""
    rng = random.Random(seed)
    return [{
        "id": i,
        "label": rng.randrange(1000),
        "score": rng.random(),
        "path": f"images/{i // 1000:04d}/{i:08d}.jpg",
        "caption": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 9))),
        "tags": [rng.randrange(100) for _ in range(rng.randrange(1, 5))],
        "box": [rng.random() for _ in range(4)],
    } for i in range(n)]


def ids(samples: list[Any]) -> np.ndarray:
    """The batch as its records' ids: one row per sample, as cupy_nwt's batch layout wants."""
    return np.fromiter((s["id"] for s in samples), dtype=np.int64, count=len(samples))


def make_loader(kind: str, dataset: Any, workers: int, batch_size: int, seed: int) -> tuple[Any, Any]:
    """A loader and a function giving its worker PIDs; both fork persistent workers and shuffle."""
    if kind == "cupy_nwt":
        dl = DataLoader(dataset, batch_size=batch_size, shuffle=True, seed=seed, num_workers=workers, device="cpu",
                        collate_fn=ids, persistent_workers=True,
                        multiprocessing_context="fork" if workers else None)
        return dl, dl.worker_pids
    import torch  # noqa: PLC0415

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=False)}  # e.g. a resource tracker: not a worker
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                     collate_fn=ids, persistent_workers=True, multiprocessing_context="fork",
                                     generator=torch.Generator().manual_seed(seed))
    return dl, lambda: [c.pid for c in me.children(recursive=False) if c.pid not in before]


def snapshot(pids: list[int]) -> dict[str, Any]:
    main = psutil.Process().memory_full_info()
    workers = [psutil.Process(p).memory_full_info() for p in pids]
    return {"pss_total_bytes": main.pss + sum(w.pss for w in workers), "main_pss_bytes": main.pss,
            "worker_uss_bytes": [w.uss for w in workers], "worker_pss_bytes": [w.pss for w in workers]}


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def run(kind: str, form: str, dataset: Any, workers: int, epochs: int, batch_size: int, seed: int) -> dict[str, Any]:
    loader, pids = make_loader(kind, dataset, workers, batch_size, seed)
    snaps, samples, seen = [], 0, set()
    t0 = time.perf_counter()
    try:
        for epoch in range(epochs):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            for batch in loader:
                samples += len(batch)
                if not snaps:
                    snaps.append(snapshot(pids()))
            seen.update(pids())
            snaps.append(snapshot(pids()))
        seconds = time.perf_counter() - t0  # the epochs only, not the shutdown below
    finally:
        if hasattr(loader, "close"):
            loader.close()
        del loader
        # torch's persistent workers go with the loader's last reference: wait for them, or their exit
        # during the next run would move shared pages' PSS onto that run's main process. Only the
        # workers: the resource tracker the first shared-memory ring starts is a child that stays
        # (waiting for it cost 30 s, the timeout, in the first cupy_nwt run before this was fixed)
        gc.collect()
        psutil.wait_procs([p for p in (_process(pid) for pid in seen) if p is not None], timeout=30)
    first, last = snaps[0], snaps[-1]
    uss_growth = [b - a for a, b in zip(first["worker_uss_bytes"], last["worker_uss_bytes"])]
    return {"loader": kind, "form": form, "samples": samples, "seconds": seconds,
            "pss_growth_bytes": last["pss_total_bytes"] - first["pss_total_bytes"],
            "worker_uss_growth_bytes": uss_growth, "snapshots": snaps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    if min(args.records, args.workers, args.epochs, args.batch_size) < 1:
        print("records, workers, epochs and batch size must be >= 1", file=sys.stderr)
        return 2
    records = make_records(args.records, args.seed)
    packed = pack_records(records)
    kinds = ["cupy_nwt"]
    try:
        import torch  # noqa: F401, PLC0415

        kinds.append("torch")
    except ImportError:
        print("torch does not import: cupy_nwt's DataLoader only", file=sys.stderr)
    runs = []
    for kind in kinds:
        for form, dataset in (("list of dicts", ListDataset(records)), ("packed", packed)):
            r = run(kind, form, dataset, args.workers, args.epochs, args.batch_size, args.seed)
            runs.append(r)
            print(f"{kind:9s} {form:14s} PSS {r['pss_growth_bytes'] / MB:+8.1f} MB  worker USS "
                  + ", ".join(f"{u / MB:+.1f}" for u in r["worker_uss_growth_bytes"]) + f" MB  ({r['seconds']:.1f} s)",
                  flush=True)
    result = {"records": args.records, "workers": args.workers, "epochs": args.epochs, "batch_size": args.batch_size,
              "packed_bytes": packed.nbytes, "packed_kinds": packed.kinds, "host": system.host_info(),
              "growth": "from the first batch (workers up) to the end of the last epoch",
              "note": args.note, "runs": runs}
    path = report.write_json(result, args.output or RESULTS / f"copy_on_read-{system.host_tag()}.json")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
