"""Do repeated ``cupy-nwt tune`` runs on an unchanged machine agree?

Runs ``cupy-nwt tune`` ``--runs`` times in a row (default 5), each a fresh process as a user would
run it, all sharing one pick store (a private one: the machine's own store is left alone). After
each run it reads the pick in force (a later search replaces a saved pick only when faster beyond
both measurements' uncertainty). Then it measures the steady curve the picks are judged against:
every count from 0 to the highest any run searched, warm, interleaved, ``--rounds`` rounds, each
in a fresh random order, with the same main-process load the searches represented. A pick's share
is the median over rounds of its samples/s over the steady best's in the same round, with a
bootstrap 90% interval. The claim checked: every pick in force reaches 95% of the throughput of
every other (the smallest pairwise ratio of their steady medians).

Writes ``<host>/tune_stability.json`` and ``.png`` beside this script. The quiet-machine command:

    .venv/bin/python bench/studies/do_repeated_tunes_agree/tune_stability.py

(5 searches and 10 rounds of the steady curve on the synthetic CIFAR-10 PNGs, 20,000 images,
batch 128, decode only: about 6 to 8 minutes on a 2-CPU VM, the dataset's one-time build included.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cupy_nwt import system
from cupy_nwt.nwt.measure import LoaderMeasure
from cupy_nwt.nwt.trials import Measurement, whole_rounds
from cupy_nwt.picks.store import TuneResult, pick_store
from cupy_nwt.reporting import tables as report
from cupy_nwt.reporting.figures import median_interval
from cupy_nwt.reporting.progress import ProgressBar

RESULTS = Path(__file__).resolve().parent  # this study's folder
TARGET = 0.95


@dataclass(frozen=True)
class TuneRun:
    """One ``cupy-nwt tune``: the search's own pick and figures, and the pick in force after it."""

    run: int
    search_pick: int
    search_samples_per_s: float
    search_rel_error: float | None
    in_force: int
    replaced: bool
    searched_to: int
    search_end: str
    main_process: str
    search_seconds: float
    wall_seconds: float
    warning: str | None = None  # the run's own warning that its pick is unreliable (None: steady trials)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tune_args(args: argparse.Namespace) -> list[str]:
    """The ``cupy-nwt tune`` command line every run uses (the store is chosen by the environment)."""
    cmd = ["tune", "--synthetic-n", str(args.synthetic_n), "--batch-size", str(args.batch_size),
           "--iterations", str(args.iterations), "--device", args.device, "--json", "--no-progress"]
    if args.no_transform:
        cmd.append("--no-transform")
    if args.max_workers is not None:
        cmd += ["--max-workers", str(args.max_workers)]
    if args.main_process != "auto":
        cmd += ["--main-process", args.main_process]
    return cmd


def run_tunes(args: argparse.Namespace, cache: Path) -> list[TuneRun]:
    env = {**os.environ, "CUPY_NWT_CACHE_DIR": str(cache)}
    runs = []
    for i in range(1, args.runs + 1):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "cupy_nwt", *tune_args(args)], env=env, capture_output=True,
                              text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"tune_stability: run {i}: cupy-nwt tune failed: {proc.stderr.strip()[-500:]}")
        result = TuneResult.from_dict(json.loads(proc.stdout))
        (record,) = pick_store(cache).records(strict=True).values()
        in_force = TuneResult.from_dict(record)
        runs.append(TuneRun(i, result.best_workers, result.samples_per_second, result.rel_error,
                            in_force.best_workers, in_force == result,
                            result.max_workers - 1, result.search_end, result.main_process,
                            result.search_seconds, wall, result.warning))
        print(f"run {i}: search picked {result.best_workers} ({result.samples_per_second:,.0f} samples/s), "
              f"in force {in_force.best_workers}" + (", warned: unreliable" if result.warning else ""),
              file=sys.stderr, flush=True)
    return runs


def steady_curve(args: argparse.Namespace, counts: Sequence[int], main_process: str) -> dict[int, list[float]]:
    """Samples/s of each count per round, rounds in fresh random orders (drift hits every count alike)."""
    from cupy_nwt.data import (
        CifarTrainTransform,  # noqa: PLC0415
        SyntheticCIFAR10,  # noqa: PLC0415 - the cache the runs built
    )

    data = SyntheticCIFAR10(n=args.synthetic_n)
    measure = LoaderMeasure(data, batch_size=args.batch_size, device=args.device, main_process=main_process or "waits",
                            batch_transform=None if args.no_transform else CifarTrainTransform())
    rates: dict[int, list[float]] = {w: [] for w in counts}
    order = list(counts)
    rng = random.Random(0)
    with ProgressBar(len(counts) * args.rounds, "steady curve", unit="trial") as bar:
        for _ in range(args.rounds):
            rng.shuffle(order)
            for w in order:
                m = measure(w, whole_rounds(args.compare_iterations, w), w + 1)
                spi = m.seconds_per_iteration if isinstance(m, Measurement) else float(m)
                rates[w].append(args.batch_size / spi)
                bar.step(f"{w} workers")
    return rates


def judge(runs: Sequence[TuneRun], rounds: dict[int, list[float]]) -> dict[str, Any]:
    median = {w: float(np.median(r)) for w, r in rounds.items()}
    best = max(median, key=lambda w: (median[w], -w))

    def share(w: int) -> dict[str, Any]:
        ratio, lo, hi = median_interval(np.asarray(rounds[w]) / np.asarray(rounds[best]))
        return {"workers": w, "share_of_best": ratio, "interval_90": [lo, hi]}

    def spread(picks: Sequence[int]) -> float:
        rates = [median[w] for w in picks]
        return min(rates) / max(rates)

    in_force = [r.in_force for r in runs]
    searched = [r.search_pick for r in runs]
    return {
        "steady_median": {str(w): v for w, v in median.items()}, "steady_best": best,
        "in_force": [share(w) for w in in_force], "search_picks": [share(w) for w in searched],
        "in_force_agreement": spread(in_force), "search_pick_agreement": spread(searched),
        "in_force_within_5pct_of_each_other": spread(in_force) >= TARGET,
        "runs_warned": sum(r.warning is not None for r in runs),
        "search_picks_within_5pct_of_each_other": spread(searched) >= TARGET,
    }


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    from cupy_nwt.reporting.plots import figure_class, matplotlib_available, save_figure  # noqa: PLC0415

    if not matplotlib_available():
        return None
    rounds = {int(w): r for w, r in doc["steady_rounds"].items()}
    fig = figure_class()(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    ws = sorted(rounds)
    med = [float(np.median(rounds[w])) for w in ws]
    lo = [float(np.quantile(rounds[w], 0.25)) for w in ws]
    hi = [float(np.quantile(rounds[w], 0.75)) for w in ws]
    ax.fill_between(ws, lo, hi, alpha=0.2, label="steady curve, interquartile range")
    ax.plot(ws, med, marker="o", label="steady curve, median of rounds")
    steady = doc["judged"]["steady_median"]
    for k, r in enumerate(doc["runs"]):
        y = steady[str(r["in_force"])]
        ax.annotate(f"run {r['run']}", (r["in_force"], y), textcoords="offset points", xytext=(6, 8 + 10 * k),
                    fontsize=8, arrowprops={"arrowstyle": "-", "lw": 0.5})
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s")
    j = doc["judged"]
    ax.set_title(f"{len(doc['runs'])} tune runs: picks in force agree to {j['in_force_agreement']:.1%} "
                 f"({doc['config']['host_tag']})", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="cupy-nwt tune runs in a row (default 5)")
    p.add_argument("--synthetic-n", type=int, default=20000, help="synthetic CIFAR-10 images (default 20000)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--iterations", type=int, default=100, help="tune --iterations (default 100)")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-workers", type=int, default=None, help="bound the searches (default: the open search)")
    p.add_argument("--main-process", choices=("auto", "waits", "busy"), default="auto",
                   help="tune --main-process: the training step's load in trials and the steady curve (default auto)")
    p.add_argument("--augment", action="store_true",
                   help="the CIFAR augmentation as batch transform (default: decode only, tune --no-transform)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of the steady curve (default 10)")
    p.add_argument("--compare-iterations", type=int, default=50, help="batches per count per round (default 50)")
    p.add_argument("--out", type=Path, default=None, help="folder (default <host>/ beside this script)")
    args = p.parse_args(argv)
    args.no_transform = not args.augment
    for name in ("runs", "synthetic_n", "batch_size", "iterations", "rounds", "compare_iterations"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    tag = system.host_tag()
    out = args.out or RESULTS / tag
    name = "tune_stability" if args.main_process == "auto" else f"tune_stability-{args.main_process}"
    cache = Path(tempfile.mkdtemp(prefix="tune-stability-"))
    t0 = time.perf_counter()
    try:
        runs = run_tunes(args, cache)
        os.environ["CUPY_NWT_CACHE_DIR"] = str(cache)  # the steady curve reads the dataset the runs built
        counts = list(range(max(r.searched_to for r in runs) + 1))
        rounds = steady_curve(args, counts, runs[0].main_process)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "augment")}
    config.update(host_tag=tag, command="cupy-nwt " + " ".join(tune_args(args)))
    doc = {"config": config, "host": system.host_info(), "runs": [r.to_dict() for r in runs],
           "steady_rounds": {str(w): r for w, r in rounds.items()}, "judged": judge(runs, rounds),
           "wall_seconds": time.perf_counter() - t0}
    path = report.write_json(doc, out / f"{name}.json")
    png = plot(doc, out / f"{name}.png")
    j = doc["judged"]
    print(f"picks in force: {[r.in_force for r in runs]}, agree to {j['in_force_agreement']:.1%} "
          f"(target >= {TARGET:.0%}); search picks {[r.search_pick for r in runs]}, agree to "
          f"{j['search_pick_agreement']:.1%}; steady best {j['steady_best']}; {doc['wall_seconds']:.0f} s")
    print(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
