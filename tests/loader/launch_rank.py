"""One rank of the multi-process tests in test_scaleout.py: run by torchrun or mpiexec, never by pytest itself.

Builds a DataLoader from the launcher's environment, iterates a few epochs and writes what it saw to
``<out>/rank<R>.json``: the sample indices per epoch, the transform seeds, its layout, worker count
and PIDs, and with ``num_workers="auto"`` why it runs that count (``stats().num_workers_why``). ``--quick-online``
makes a miss's online tuning ask its policy every other batch, so a few epochs of a tiny dataset settle it.
``--fail`` makes rank 1 die mid-epoch (an exception, or SIGKILL) once every rank has started its
epoch, while the others keep loading.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import psutil


class Indexed:
    """Sample i is a tiny image filled with i and the label i: batches reveal their indices."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full((4, 4, 3), i % 251, dtype=np.uint8), int(i)


def tag_seed(batch, seed: int):
    """A batch transform that records the seed it was given next to each sample."""
    images, labels = batch
    return images, labels, np.full(len(labels), seed, dtype=np.int64)


def _wait_for_every_rank(out: Path, world: int, limit_s: float = 60.0) -> None:
    """Fail only once every rank is mid-epoch with its workers (their .pids files exist)."""
    deadline = time.monotonic() + limit_s
    while not all((out / f"rank{r}.pids").exists() for r in range(world)) and time.monotonic() < deadline:
        time.sleep(0.02)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=101)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", default="0")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--gloo", action="store_true", help="initialise torch.distributed (gloo) first")
    p.add_argument("--quick-online", action="store_true", help="autotune every other batch, from no minimum time")
    p.add_argument("--also-seed-none", action="store_true", help="record the seed a seed=None loader gets")
    p.add_argument("--fail", choices=["raise", "kill"], help="rank 1 dies after its second batch")
    p.add_argument("--delay", type=float, default=0.0, help="seconds per batch on the other ranks")
    args = p.parse_args()

    if args.gloo:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    from cupy_nwt import DataLoader
    from cupy_nwt.loader import Autotune
    from cupy_nwt.ranks import rank_layout

    rank = rank_layout().rank  # torchrun's RANK or mpiexec's OMPI_COMM_WORLD_RANK / PMI_RANK
    workers = args.workers if args.workers == "auto" else int(args.workers)
    quick = Autotune(interval_steps=2, min_interval_s=0.0) if args.quick_online else False
    record: dict = {"pid": os.getpid(), "epochs": [], "transform_seeds": []}
    with DataLoader(Indexed(args.samples), batch_size=args.batch_size, shuffle=not args.no_shuffle, seed=args.seed,
                    drop_last=args.drop_last, num_workers=workers, device="cpu", batch_transform=tag_seed,
                    persistent_workers=True, autotune=quick) as loader:
        record.update(layout=loader.rank_layout.to_dict(), num_workers=loader.num_workers, batches=len(loader),
                      padding=loader.sampler.padding, why=loader.stats().num_workers_why)
        if args.also_seed_none:
            record["seed_none"] = DataLoader(Indexed(args.samples), seed=None, num_workers=0, device="cpu").seed
        for _ in range(args.epochs):
            seen, seeds = [], []
            for b, (_, labels, tseeds) in enumerate(loader):
                seen += labels.tolist()
                seeds.append(int(tseeds[0]))
                if b == 0:
                    me = psutil.Process()
                    record["children"] = [c.pid for c in me.children(recursive=True)]
                    record["worker_pids"] = loader.worker_pids()
                    tmp = args.out / f".rank{rank}.pids"
                    tmp.write_text(json.dumps(record["children"] + [me.pid]))
                    os.replace(tmp, args.out / f"rank{rank}.pids")  # whole, or not there at all
                if args.fail and rank == 1 and b == 1:
                    _wait_for_every_rank(args.out, loader.world_size)
                    if args.fail == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise RuntimeError("rank 1 fails on purpose")
                if args.delay and rank != 1:
                    time.sleep(args.delay)
            record["epochs"].append(seen)
            record["transform_seeds"].append(seeds)
    (args.out / f"rank{rank}.json").write_text(json.dumps(record))
    if args.gloo:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
