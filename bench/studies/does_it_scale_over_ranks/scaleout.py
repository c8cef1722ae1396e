"""Aggregate loader throughput of 1, 2, 4 ... ranks on one machine, each rank with its share of the cores.

For each rank count k this launches ``torchrun --standalone --nproc-per-node k`` on this same file
(``--as-rank``). Every rank builds the project's DataLoader the way a training script would
(rank and world size from torchrun's variables, its shard of the synthetic CIFAR-10 PNGs,
``CifarTrainTransform``, batches on its GPU or on the host without one) with ``num_workers`` =

* ``auto`` (default): the saved pick, else online tuning within the rank's budget (``ranks.worker_budget``:
  usable CPUs // ranks on the node, at least 1; up to budget-1 workers, none for a budget of 1);
* ``budget``: budget - 1 workers, so the rank's main process plus its workers fill its share;
* a number: that many on every rank.

Ranks line up on a gloo barrier (torch is there, since torchrun is), take ``--warmup`` untimed
batches and every batch the workers made ahead during start-up, meet again, then time ``--batches`` batches. A run's aggregate is the sum of the ranks'
samples/s; ``wall`` is all samples over the span from the first rank's start to the last one's end
(lower when ranks finish unevenly). Each k is launched ``--repeats`` times, interleaved; medians are
reported. Writes ``scaleout-<host>.json`` beside this script:

    .venv/bin/python bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2,4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent  # this study's folder
ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
sys.path.insert(0, str(ROOT))  # the shared workloads: bench.workloads
FORMAT = "cupy_nwt.scaleout/1"


# ---------------------------------------------------------------- one rank (run by torchrun)


def run_rank(args: argparse.Namespace) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    from bench.workloads import endless, timed_after  # noqa: PLC0415
    from cupy_nwt import DataLoader, cuda  # noqa: PLC0415
    from cupy_nwt.data import (
        CifarTrainTransform,  # noqa: PLC0415
        SyntheticCIFAR10,  # noqa: PLC0415
    )
    from cupy_nwt.ranks import rank_layout, worker_budget  # noqa: PLC0415
    from cupy_nwt.reporting.tables import write_json  # noqa: PLC0415

    dist.init_process_group("gloo")
    layout = rank_layout()
    budget = worker_budget(layout)
    workers: int | str = args.workers
    if workers == "budget":
        workers = budget - 1
    elif workers != "auto":
        workers = int(workers)
    data = SyntheticCIFAR10(args.samples)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True,
                        num_workers=workers, persistent_workers=True, pin_memory=True,
                        batch_transform=CifarTrainTransform())
    sync = lambda: None  # noqa: E731
    if loader.device == "cuda":
        sync = cuda.stream_synchronizer(loader.device_id)  # the stream this rank's batches arrive on
    untimed = timed_after(args.warmup, loader.num_workers, loader.prefetch_factor)
    with loader:
        it = endless(loader)
        dist.barrier()
        for _ in range(untimed):
            next(it)
        sync()
        dist.barrier()
        start = time.time()
        for _ in range(args.batches):
            next(it)
        sync()
        end = time.time()
        it.close()
    record = {"rank": layout.rank, "local_world_size": layout.local_world_size, "budget": budget,
              "num_workers": loader.num_workers, "device": loader.device, "device_id": loader.device_id,
              "pin_path": loader.pin_path, "samples": args.batches * args.batch_size, "start": start, "end": end,
              "samples_per_second": args.batches * args.batch_size / (end - start)}
    write_json(record, args.out / f"rank{layout.rank}.json")
    dist.destroy_process_group()


# ---------------------------------------------------------------- the launcher


def torchrun_path() -> str:
    local = Path(sys.executable).with_name("torchrun")
    found = str(local) if local.is_file() else shutil.which("torchrun")
    if found is None:
        raise SystemExit("torchrun was not found: install PyTorch (the CPU build is enough) for this benchmark")
    return found


def sharing_refusal(k: int) -> str | None:
    """Why ``k`` ranks cannot run here, in one line: some would share a GPU that admits one process only.

    Ranks take GPU ``local_rank % device_count``; a GPU in an exclusive (or prohibited) compute mode
    refuses the second rank's context with cudaErrorDevicesUnavailable, deep inside a rank.
    """
    from cupy_nwt import cuda  # noqa: PLC0415

    status = cuda.gpu_status()
    if not status.available or k <= status.device_count:
        return None
    for device in range(min(status.device_count, k - status.device_count)):
        mode = cuda.compute_mode(device)
        if mode != "default":
            return (f"{k} ranks would share GPU {device}, which is in {mode} compute mode (one process at a time): "
                    f"skipped; 'nvidia-smi -i {device} -c DEFAULT' lets ranks share it")
    return None


UNAVAILABLE = ("cudaErrorDevicesUnavailable", "busy or unavailable")


def launch(k: int, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True)
    cmd = [torchrun_path(), "--standalone", f"--nproc-per-node={k}", "--monitor-interval=0.1", __file__,
           "--as-rank", "--out", str(out), "--samples", str(args.samples), "--batch-size", str(args.batch_size),
           "--batches", str(args.batches), "--warmup", str(args.warmup), "--workers", args.workers]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 and any(u in proc.stdout + proc.stderr for u in UNAVAILABLE):
        raise SystemExit(f"scaleout: {k} ranks failed: a GPU refused another process (cudaErrorDevicesUnavailable); "
                         "is it in an exclusive compute mode? (nvidia-smi -q -d COMPUTE)")
    if proc.returncode != 0:
        raise SystemExit(f"{k} ranks failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(k)]


def aggregate(k: int, repeat: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    span = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
    return {"ranks": k, "repeat": repeat, "sum_samples_per_second": sum(r["samples_per_second"] for r in ranks),
            "wall_samples_per_second": sum(r["samples"] for r in ranks) / span, "per_rank": ranks}


def summarize_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for k in sorted({r["ranks"] for r in runs}):
        mine = [r for r in runs if r["ranks"] == k]
        rows.append({
            "ranks": k,
            "budget_per_rank": mine[0]["per_rank"][0]["budget"],
            "workers_per_rank": sorted({p["num_workers"] for r in mine for p in r["per_rank"]}),
            "median_sum_samples_per_second": statistics.median(r["sum_samples_per_second"] for r in mine),
            "median_wall_samples_per_second": statistics.median(r["wall_samples_per_second"] for r in mine),
        })
    base = rows[0]["median_sum_samples_per_second"] if rows and rows[0]["ranks"] == 1 else None
    for row in rows:
        row["speedup_vs_1_rank"] = row["median_sum_samples_per_second"] / base if base else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    p.add_argument("--workers", default="auto", help="'auto', 'budget' or a number per rank (default auto)")
    p.add_argument("--samples", type=int, default=50000, help="synthetic CIFAR-10 size (default 50000)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=300, help="timed batches per rank, across epochs (default 300)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches per rank")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", type=Path, help="result JSON (default scaleout-<host>.json beside this script)")
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.workers not in ("auto", "budget") and not args.workers.isdigit():
        p.error(f"--workers must be 'auto', 'budget' or a number, got {args.workers!r}")
    if args.warmup < 1 or args.batches < 1:
        p.error(f"--warmup and --batches must be >= 1, got {args.warmup} and {args.batches}")
    if args.as_rank:
        run_rank(args)
        return 0

    from cupy_nwt import cuda, system  # noqa: PLC0415
    from cupy_nwt.reporting import tables as report
    from cupy_nwt.reporting.units import plural  # noqa: PLC0415

    counts = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        p.error(f"--ranks needs positive rank counts, got {args.ranks!r}")
    skipped = {}
    for k in counts:
        if (why := sharing_refusal(k)) is not None:
            skipped[str(k)] = why
            print(f"scaleout: {why}", file=sys.stderr)
    counts = [k for k in counts if str(k) not in skipped]
    if not counts:
        return 3
    runs = []
    with tempfile.TemporaryDirectory(prefix="cupy_nwt_scaleout_") as tmp:
        for repeat in range(args.repeats):
            for k in counts:  # interleaved, so drift on a shared machine hits every k alike
                runs.append(aggregate(k, repeat, launch(k, args, Path(tmp) / f"k{k}-r{repeat}")))
                print(f"repeat {repeat}, {plural(k, 'rank')}: {runs[-1]['sum_samples_per_second']:,.0f} samples/s",
                      file=sys.stderr)
    host = system.host_info()
    status = cuda.gpu_status()
    cpus = host.usable_cpus
    note = (f"{cpus} usable CPUs on this machine. A rank's budget is max(1, {cpus} // ranks on the node) and "
            "num_workers='auto' tunes up to budget-1 workers, so a budget of 1 means 0 workers: the rank's own "
            f"process loads; with more than {cpus} ranks they share cores (oversubscribed). "
            + ("Batches go to the GPU." if status.available else f"No GPU ({status.reason}): batches stay on the host."))
    rows = summarize_runs(runs)
    result = {"format": FORMAT, "host_tag": system.host_tag(), "host": host.to_dict(), "gpu": status.to_dict(),
              "note": note, "skipped_ranks": skipped,
              "config": {k: v for k, v in vars(args).items() if k not in ("as_rank", "out", "output")},
              "summary": rows, "runs": runs}
    path = report.write_json(result, args.output or RESULTS / f"scaleout-{system.host_tag()}.json")
    print(report.table(
        ["ranks", "budget/rank", "workers/rank", "sum samples/s", "wall samples/s", "vs 1 rank"],
        [[r["ranks"], r["budget_per_rank"], ",".join(map(str, r["workers_per_rank"])),
          round(r["median_sum_samples_per_second"]), round(r["median_wall_samples_per_second"]),
          r["speedup_vs_1_rank"]] for r in rows],
        title=f"DataLoader throughput by rank count ({system.host_tag()}, medians of {args.repeats})"))
    print(note)
    print(f"saved to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
