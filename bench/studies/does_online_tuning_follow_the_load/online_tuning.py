"""Online tuning against fixed worker counts, on a workload whose per-sample cost changes mid-run.

One epoch, read in order, in three phases of equal length: an I/O-like sleep per
sample, the same sleep four times longer, then a CPU-heavy decode (a busy loop of the given CPU
time per sample). The caller sleeps ``--step-ms`` per batch, like a training step on a GPU. Runs:

* fixed: ``num_workers`` = each of ``--workers``, the whole epoch, each phase's time taken apart;
* one-shot: the fixed count that was best in phase 1 (the least workers within 2 % of the best),
  what a pick made once before training gives; its time is that fixed run's;
* hindsight: per phase, the best fixed count's time for that phase, summed (no single run does it);
* online: ``DataLoader(num_workers=<the one-shot pick>, autotune=True)``, its decisions kept.

The claim checked: online within 10 % of hindsight, and faster than the one-shot pick. Times
include worker start-up for every run alike. Writes ``online_tuning-<host>.json`` beside this script
and ``.png``:

    .venv/bin/python bench/studies/does_online_tuning_follow_the_load/online_tuning.py
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cupy_nwt import DataLoader, system
from cupy_nwt.reporting import tables as report

RESULTS = Path(__file__).resolve().parent  # this study's folder
PHASES = ("io", "io x4", "decode")


class PhasedDataset:
    """Sample i costs what its third of the dataset says: a sleep, four times that sleep, or CPU time."""

    def __init__(self, n: int, io_s: float, decode_s: float) -> None:
        self.n, self.io_s, self.decode_s = n, io_s, decode_s

    def __len__(self) -> int:
        return self.n

    def phase(self, i: int) -> int:
        return min(2, 3 * i // self.n)

    def __getitem__(self, i: int) -> np.ndarray:
        p = self.phase(i)
        if p < 2:
            time.sleep(self.io_s * (4 if p == 1 else 1))
        else:
            end = time.thread_time() + self.decode_s
            x = np.arange(256, dtype=np.float64)
            while time.thread_time() < end:
                x = np.sqrt(x * x + 1.0)
        return np.full(16, i, np.float32)


@dataclass(frozen=True)
class Run:
    """One epoch: ``label``, its start count, the seconds of each phase and in all; online's decisions."""

    label: str
    num_workers: int
    phase_s: list[float]
    total_s: float
    decisions: list[dict[str, Any]] = field(default_factory=list)
    workers_at: list[int] = field(default_factory=list)  # online: active workers at each batch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Result:
    host: dict[str, Any]
    config: dict[str, Any]
    fixed: list[Run]
    online: Run
    one_shot_workers: int
    one_shot_s: float
    hindsight_s: float
    hindsight_workers: list[int]
    note: str = ""

    @property
    def vs_hindsight(self) -> float:
        return self.online.total_s / self.hindsight_s

    @property
    def vs_one_shot(self) -> float:
        return self.online.total_s / self.one_shot_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fixed": [r.to_dict() for r in self.fixed], "online": self.online.to_dict(),
                "online_vs_hindsight": self.vs_hindsight, "online_vs_one_shot": self.vs_one_shot,
                "within_10pct_of_hindsight": self.vs_hindsight <= 1.10, "beats_one_shot": self.vs_one_shot < 1.0}


def run_epoch(dataset: PhasedDataset, batch_size: int, step_s: float, num_workers: int, label: str,
              cpu_budget: int | None = None) -> Run:
    """One epoch in order; the caller sleeps ``step_s`` per batch. ``cpu_budget`` given: tuned online.

    A phase ends when the caller's step on its last batch does; the first includes worker start-up.
    """
    online = cpu_budget is not None
    dl: DataLoader[np.ndarray] = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, device="cpu", seed=0,
                    autotune=online, cpu_budget=cpu_budget)
    marks = [0.0, 0.0, 0.0, 0.0]
    workers_at: list[int] = []
    try:
        t0 = time.perf_counter()
        for batch in dl:
            time.sleep(step_s)
            marks[dataset.phase(int(batch[-1, 0])) + 1] = time.perf_counter() - t0
            if dl.decisions:  # each decision holds the setting it left: the last one is the setting now
                workers_at.append(dl.decisions[-1].workers)
        total = time.perf_counter() - t0
    finally:
        dl.close()
    for p in range(1, 4):
        marks[p] = max(marks[p], marks[p - 1])
    phase_s = [marks[p + 1] - marks[p] for p in range(3)]
    return Run(label, num_workers, phase_s, total, [d.to_dict() for d in dl.decisions], workers_at)


def one_shot_pick(fixed: list[Run]) -> Run:
    """The fixed run a pick made in phase 1 chooses: the fewest workers within 2 % of phase 1's best."""
    best = min(r.phase_s[0] for r in fixed)
    return min((r for r in fixed if r.phase_s[0] <= 1.02 * best), key=lambda r: r.num_workers)


def compare(workers: list[int], batches: int, batch_size: int, step_s: float, io_s: float, decode_s: float,
            note: str = "") -> Result:
    dataset = PhasedDataset(3 * batches * batch_size, io_s, decode_s)
    fixed = []
    for n in workers:
        fixed.append(run_epoch(dataset, batch_size, step_s, n, f"fixed {n}"))
        print(f"  fixed {n:2d} workers: phases {' '.join(f'{s:6.2f}' for s in fixed[-1].phase_s)} s, "
              f"total {fixed[-1].total_s:6.2f} s", file=sys.stderr, flush=True)  # progress, as the tables under --json
    pick = one_shot_pick(fixed)
    online = run_epoch(dataset, batch_size, step_s, pick.num_workers, f"online from {pick.num_workers}",
                       cpu_budget=max(workers))  # the same range the fixed runs cover
    best = [min(fixed, key=lambda r: r.phase_s[p]) for p in range(3)]  # noqa: B023 - used at once
    config = {"batches_per_phase": batches, "batch_size": batch_size, "step_s": step_s, "io_s_per_sample": io_s,
              "decode_cpu_s_per_sample": decode_s, "workers": workers, "phases": list(PHASES)}
    return Result(system.host_info().to_dict(), config, fixed, online, pick.num_workers, pick.total_s,
                  sum(b.phase_s[p] for p, b in enumerate(best)), [b.num_workers for b in best], note)


def plot(result: Result, path: Path) -> Path:
    """Left: time per phase, stacked, for online, hindsight and one-shot; right: online's workers per batch."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax = fig.add_subplot(1, 2, 1)
    pick = next(r for r in result.fixed if r.num_workers == result.one_shot_workers)
    hind = [min(r.phase_s[p] for r in result.fixed) for p in range(3)]
    bars = {"online": result.online.phase_s, "hindsight": hind, f"one-shot ({result.one_shot_workers})": pick.phase_s}
    bottom = np.zeros(len(bars))
    for p, name in enumerate(PHASES):
        vals = np.array([v[p] for v in bars.values()])
        ax.bar(list(bars), vals, bottom=bottom, label=name)
        bottom += vals
    ax.set_ylabel("seconds")
    ax.set_title(f"online {result.vs_hindsight:.2f}x hindsight, {result.vs_one_shot:.2f}x one-shot")
    ax.legend()
    ax = fig.add_subplot(1, 2, 2)
    ax.step(range(len(result.online.workers_at)), result.online.workers_at, where="post", color="tab:green",
            label="online: active workers")
    per = result.config["batches_per_phase"]
    for p, n in enumerate(result.hindsight_workers):
        ax.hlines(n, p * per, (p + 1) * per, colors="tab:gray", linestyles="--",
                  label="best fixed per phase" if p == 0 else "_")
    ax.set_xlabel("batch")
    ax.set_ylabel("workers")
    ax.set_ylim(bottom=0)
    ax.legend()
    host = result.host
    fig.suptitle(f"{host.get('cpu_model', '?')}, {host.get('usable_cpus', '?')} CPUs; batch "
                 f"{result.config['batch_size']}, step {result.config['step_s'] * 1e3:.0f} ms")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path


def parse_workers(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated worker counts, got {text!r}") from None
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=parse_workers, default=None,
                   help="fixed counts to run (default 1 .. the usable CPUs less one)")
    p.add_argument("--batches", type=int, default=300, help="batches per phase")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=10.0, help="the caller's time per batch")
    p.add_argument("--io-ms", type=float, default=1.0, help="phase 1's sleep per sample (phase 2: four times it)")
    p.add_argument("--decode-ms", type=float, default=0.5, help="phase 3's CPU time per sample")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON on stdout, alone; the tables go to stderr")
    p.add_argument("--note", default="", help="free text kept in the JSON (e.g. what else ran on the host)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("batches", "batch_size"):
        if getattr(args, name) < 1:
            print(f"online_tuning: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if min(args.step_ms, args.io_ms, args.decode_ms) < 0:
        print("online_tuning: --step-ms, --io-ms and --decode-ms must be >= 0", file=sys.stderr)
        return 2
    workers = args.workers or list(range(1, max(1, system.usable_cpus() - 1) + 1))
    result = compare(workers, args.batches, args.batch_size, args.step_ms / 1e3, args.io_ms / 1e3,
                     args.decode_ms / 1e3, note=args.note)
    stem = args.out_dir / f"online_tuning-{system.host_tag()}"
    report.write_json(result, stem.with_suffix(".json"))
    rows = [[r.label, *(f"{s:.2f}" for s in r.phase_s), f"{r.total_s:.2f}"] for r in (*result.fixed, result.online)]
    rows.append(["hindsight (best per phase)", *(f"{min(r.phase_s[p] for r in result.fixed):.2f}" for p in range(3)),
                 f"{result.hindsight_s:.2f}"])
    text = sys.stderr if args.json else sys.stdout  # with --json, stdout is the JSON alone
    print(report.table(["run", *PHASES, "total s"], rows, title="online tuning vs fixed num_workers"), file=text)
    print(f"online: {result.vs_hindsight:.3f}x hindsight, {result.vs_one_shot:.3f}x the one-shot pick "
          f"({result.one_shot_workers} workers)", file=text)
    print(report.wrote(stem.with_suffix(".json"), lambda png: plot(result, png)), file=text)
    if args.json:
        print(report.to_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
