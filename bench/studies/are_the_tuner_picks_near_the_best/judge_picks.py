"""Judge the picks of several ``cupy-nwt reproduce`` runs against one precise steady curve.

A single run judges its picks with a few rounds, and on a small, noisy machine
the counts near the best lie within that judge's own error, so whether a pick "reached 95%"
depends on the draw. Here every count 0..N-1 of the runs' workload is measured warm in many
rounds, each round in a fresh random order, and the rounds are split: the best count is chosen on
the odd rounds and each pick's share of it is judged on the even ones (a best judged on the
numbers that chose it looks better than it is). A share is the median over judging rounds of the
pick's samples/s over the best's in the same round (the two ran minutes apart at most, so drift
cancels), with a bootstrap 90% interval. Writes ``judge_picks-<host>.json`` beside this script and
``.png``:

    .venv/bin/python bench/studies/are_the_tuner_picks_near_the_best/judge_picks.py bench/studies/are_the_tuner_picks_near_the_best/vm-2cpu-reproduce-n8-paired-run*

``--curve`` judges further runs against a saved result's rounds without measuring again.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cupy_nwt import system
from cupy_nwt.reporting import tables as report
from cupy_nwt.reporting.figures import median_interval
from cupy_nwt.reporting.progress import ProgressBar

RESULTS = Path(__file__).resolve().parent  # this study's folder
TARGET = 0.95


@dataclass(frozen=True)
class Run:
    """One reproduce folder's picks and cost."""

    name: str
    fast_pick: int
    paper_pick: int
    exhaustive_best: int
    fast_cost_vs_paper: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Share:
    """A count's share of the best: median of paired per-round ratios, and its bootstrap 90% interval."""

    workers: int
    ratio: float
    low: float
    high: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Judged:
    run: Run
    fast: Share
    paper: Share
    exhaustive: Share

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "fast": self.fast, "paper": self.paper, "exhaustive_best": self.exhaustive,
                "fast_within_target": self.fast.ratio >= TARGET, "fast_cost_within_target": self.run.fast_cost_vs_paper <= 0.30}


@dataclass(frozen=True)
class Result:
    host: Any
    config: dict[str, Any]
    rounds: dict[int, list[float]]
    best: int
    shares: dict[int, Share]
    judged: list[Judged]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "config": self.config, "rounds": {str(w): r for w, r in self.rounds.items()},
                "best_on_odd_rounds": self.best, "shares_on_even_rounds": {str(w): s for w, s in self.shares.items()},
                "judged": self.judged, "note": self.note}


def load_run(folder: Path) -> tuple[Run, dict[str, Any]]:
    """A reproduce folder's picks, and its workload (config and the device its trials ran on)."""
    path = Path(folder) / "report.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        c = doc["comparison"]
        rates = {t["workers"]: t["samples_per_second"] for t in doc["tune_paper"]["trials"]}
        exhaustive = c.get("exhaustive_best")
        if exhaustive is None:
            exhaustive = max(rates, key=lambda w: (rates[w], -w))
        run = Run(Path(folder).name, int(c["fast_pick"]), int(c["paper_pick"]), int(exhaustive),
                  float(doc["fast_cost_vs_paper"]))
        workload = {k: doc["config"][k] for k in ("synthetic_n", "batch_size")}
        workload.update(max_workers=int(doc["tune_paper"]["max_workers"]), device=doc["tune_paper"]["device"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"judge_picks: {path} is not a cupy-nwt reproduce report ({type(e).__name__}: {e})") from None
    return run, workload


def saved_curve(path: Path, workload: dict[str, Any]) -> tuple[dict[int, list[float]], dict[str, Any], Any, str]:
    """The rounds, config, host and note of an earlier result, refused in one line for another workload."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        rounds = {int(w): [float(x) for x in r] for w, r in doc["rounds"].items()}
        config = dict(doc["config"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"judge_picks: {path} is not a judge_picks result ({type(e).__name__}: {e})") from None
    if {k: config.get(k) for k in workload} != workload:
        raise SystemExit(f"judge_picks: {path} measured another workload than the reports ({config})")
    return rounds, config, doc.get("host"), doc.get("note", "")


def split(rounds: dict[int, list[float]]) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Odd rounds (1st, 3rd, ...: choose the best) and even rounds (judge), per count."""
    return ({w: np.asarray(r[0::2]) for w, r in rounds.items()}, {w: np.asarray(r[1::2]) for w, r in rounds.items()})


def best_count(choose: dict[int, np.ndarray]) -> int:
    return max(choose, key=lambda w: (float(np.median(choose[w])), -w))


def share(judge: dict[int, np.ndarray], workers: int, best: int) -> Share:
    return Share(workers, *median_interval(judge[workers] / judge[best]))


def measure_rounds(workload: dict[str, Any], rounds: int, iterations: int, progress: bool) -> dict[int, list[float]]:
    """Samples/s of every count in each round, each round in a fresh (seeded) random order."""
    from cupy_nwt.data import (
        CifarTrainTransform,  # noqa: PLC0415
        SyntheticCIFAR10,  # noqa: PLC0415 - heavy imports only to measure
    )
    from cupy_nwt.nwt.measure import LoaderMeasure, interleaved_rates  # noqa: PLC0415 - with the loader

    warnings.filterwarnings("ignore", message="This DataLoader will create")  # oversubscribing is the point here
    dataset = SyntheticCIFAR10(n=workload["synthetic_n"], progress=progress)
    measure = LoaderMeasure(dataset, batch_size=workload["batch_size"], device=workload["device"],
                            batch_transform=CifarTrainTransform())
    counts = list(range(workload["max_workers"]))
    order = random.Random(0)
    out: dict[int, list[float]] = {w: [] for w in counts}
    with ProgressBar(rounds * len(counts), "judge", enabled=progress) as bar:
        def stepped(workers: int, its: int, warmup: int) -> Any:
            m = measure(workers, its, warmup)
            bar.step(f"{workers} workers")
            return m

        for _ in range(rounds):
            order.shuffle(counts)
            one = interleaved_rates(stepped, counts, batch_size=workload["batch_size"], iterations=iterations, repeats=1)
            for w, r in one.items():
                out[w].append(r[0])
    return dict(sorted(out.items()))


def judge(runs: Sequence[Run], rounds: dict[int, list[float]], host: Any, config: dict[str, Any],
          note: str = "") -> Result:
    choose, on = split(rounds)
    best = best_count(choose)
    shares = {w: share(on, w, best) for w in rounds}
    judged = [Judged(r, shares[r.fast_pick], shares[r.paper_pick], shares[r.exhaustive_best]) for r in runs]
    return Result(host, config, rounds, best, shares, judged, note)


def plot(result: Result, path: Path) -> Path:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ws = sorted(result.shares)
    s = [result.shares[w] for w in ws]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(ws, [x.ratio for x in s], yerr=[[x.ratio - x.low for x in s], [x.high - x.ratio for x in s]],
                fmt="o-", capsize=3, label="share of the best (90% interval)")
    ax.axhline(TARGET, color="grey", ls="--", label=f"{TARGET:.0%} target")
    picks = [j.run.fast_pick for j in result.judged]
    ax.scatter(picks, [result.shares[w].ratio for w in picks], s=120, facecolors="none", edgecolors="tab:red",
               label="fast picks of the runs")
    ax.set_xlabel("workers")
    ax.set_ylabel(f"samples/s / best ({result.best} workers)")
    n = len(next(iter(result.rounds.values())))
    ax.set_title(f"best chosen on {(n + 1) // 2} rounds, shares judged on {n // 2} others ({result.config['host_tag']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path, help="cupy-nwt reproduce folders (same workload)")
    p.add_argument("--rounds", type=int, default=30, help="rounds of every count (half choose the best, half judge)")
    p.add_argument("--curve", type=Path, default=None,
                   help="judge against the rounds of an earlier judge_picks JSON (same workload) instead of measuring")
    p.add_argument("--iterations", type=int, default=50, help="timed batches per trial (whole worker rounds)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON on stdout, alone; the tables go to stderr")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--note", default="", help="free text kept in the JSON (e.g. what else ran on the host)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 2 or args.iterations < 1:
        print("judge_picks: --rounds must be >= 2 and --iterations >= 1", file=sys.stderr)
        return 2
    loaded = [load_run(f) for f in args.reports]
    workloads = {json.dumps(w, sort_keys=True) for _, w in loaded}
    if len(workloads) > 1:
        print(f"judge_picks: the reports ran different workloads: {sorted(workloads)}", file=sys.stderr)
        return 2
    workload = loaded[0][1]
    if args.curve is not None:
        rounds, config, host, note = saved_curve(args.curve, workload)
    else:
        rounds = measure_rounds(workload, args.rounds, args.iterations, not args.no_progress)
        config = {**workload, "rounds": args.rounds, "iterations": args.iterations, "host_tag": system.host_tag()}
        host, note = system.host_info(), args.note
    result = judge([r for r, _ in loaded], rounds, host, config, note)
    stem = args.out_dir / f"judge_picks-{system.host_tag()}"
    report.write_json(result, stem.with_suffix(".json"))
    pct = lambda s: f"{s.ratio:.1%} [{s.low:.1%}, {s.high:.1%}]"  # noqa: E731
    text = sys.stderr if args.json else sys.stdout  # with --json, stdout is the JSON alone
    print(report.table(["workers", "share of the best (90% interval)"],
                       [[w, pct(s)] for w, s in result.shares.items()], title=f"best: {result.best} workers"),
          file=text)
    print(report.table(["run", "fast pick", "fast share", "paper pick", "paper share", "exhaustive best",
                        "its share", "fast cost"],
                       [[j.run.name, j.run.fast_pick, pct(j.fast), j.run.paper_pick, pct(j.paper),
                         j.run.exhaustive_best, pct(j.exhaustive), f"{j.run.fast_cost_vs_paper:.0%}"]
                        for j in result.judged], title="the runs' picks"), file=text)
    print(report.wrote(stem.with_suffix(".json"), lambda png: plot(result, png)), file=text)
    if args.json:
        print(report.to_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
