"""cupy_nwt's DataLoader and torch.utils.data.DataLoader side by side: samples/s against num_workers.

Both loaders get the same dataset object, the same batch size, worker count and start method, and
the same per-batch work: default stacking of the samples, then ``CifarTrainTransform`` (random crop
with padding, flip, normalize, HWC uint8 -> CHW float32) with a fresh seed per batch. For torch the
transform runs in its ``collate_fn``, the place a torch user would put a batch transform. Two
workloads: PNG/JPEG decode from a tar shard (Pillow bound), and an in-memory uint8 array (the Numba
batch path; the loader's own overhead shows here).

Three loaders: cupy_nwt with process workers, cupy_nwt with thread workers (``worker_type="thread"``)
and torch, at equal worker counts. Each point is the median of ``--repeats`` fresh loaders, loaders
interleaved within a repeat so a neighbour's load hits all alike; the first ``--warmup`` batches
(worker start-up), and then the ``workers x prefetch_factor`` batches made while the first was awaited,
are not timed for samples/s. Each run also records the time from building the
loader to its first batch, and the CPU seconds (user + system, the main process and its workers)
spent per 1,000 timed samples.
Writes ``loader_compare-<host>.json`` and ``.png`` beside this script:

    .venv/bin/python bench/studies/is_the_loader_faster_than_torch/loader_compare.py --workers 0,1,2
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cupy_nwt import cuda, system
from cupy_nwt.experiments.timing import summarize
from cupy_nwt.nwt.footprint import MemorySampler
from cupy_nwt.reporting import tables as report
from cupy_nwt.reporting.figures import figure
from cupy_nwt.reporting.progress import ProgressBar

ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
sys.path.insert(0, str(ROOT))  # this checkout's bench.workloads (and package), also run from another worktree
from bench.workloads import (  # noqa: E402
    LOADERS,
    Workload,
    batch_stream,
    close_loader,
    default_workers,
    make_loader,
    make_workloads,
    parse_workers,
    timed_after,
    worker_pids,
)

RESULTS = Path(__file__).resolve().parent  # this study's folder
SPEEDUP_TARGET = {"cuda": 1.5, "cpu": 1.0}  # DESIGN.md: >= 1.5x torch on the GPU, ahead of it on the host


@dataclass(frozen=True)
class Run:
    """One fresh loader: timed batches after warm-up."""

    samples: int
    seconds: float
    peak_memory_bytes: int | None
    first_batch_s: float = math.nan
    cpu_s: float = math.nan  # CPU seconds of the main process and its workers over the timed batches

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_s_per_1000(self) -> float:
        return 1000 * self.cpu_s / self.samples if self.samples else math.nan


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of this process (all its threads) and of ``pids``, per pid."""
    import psutil  # noqa: PLC0415

    out = {}
    for pid in (os.getpid(), *pids):
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out[pid] = t.user + t.system
    return out


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two ``cpu_seconds`` snapshots by the processes in both."""
    return sum(after[p] - before[p] for p in before.keys() & after.keys())


def measure(kind: str, workload: Workload, num_workers: int, batch_size: int = 128, batches: int = 30,
            warmup: int = 3, device: str = "cpu", seed: int = 0) -> Run:
    t_build = time.perf_counter()
    loader = make_loader(kind, workload, num_workers, batch_size, device, seed)
    stream = batch_stream(loader, kind, device)
    pids = worker_pids(loader)
    try:
        next(stream)
        first = time.perf_counter() - t_build
        for _ in range(timed_after(warmup, num_workers) - 1):
            next(stream)
        with MemorySampler(pids) as sampler:
            cpu0 = cpu_seconds(pids())
            t0 = time.perf_counter()
            samples = sum(next(stream) for _ in range(batches))
            seconds = time.perf_counter() - t0
            cpu = cpu_between(cpu0, cpu_seconds(pids()))
        peak = sampler.peak
    finally:
        stream.close()
        close_loader(loader)
    return Run(samples, seconds, peak.bytes if peak.samples else None, first, cpu)


@dataclass(frozen=True)
class Point:
    workload: str
    loader: str
    num_workers: int
    samples_per_s: dict[str, Any]
    peak_memory_bytes: int | None
    runs: int
    first_batch_s: float = math.nan  # median over the runs
    cpu_s_per_1000: float = math.nan  # median over the runs
    per_repeat: list[float] = field(default_factory=list)  # samples/s, one per repeat, in repeat order
    first_batch_per_repeat: list[float] = field(default_factory=list)  # seconds, likewise

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    host: dict[str, Any]
    device: str
    batch_size: int
    batches: int
    warmup: int
    repeats: int
    torch_version: str | None
    workloads: dict[str, str]
    points: list[Point] = field(default_factory=list)
    note: str = ""

    def speedups(self, loader: str = "cupy_nwt", first_batch: bool = False) -> dict[str, dict[int, float]]:
        """``loader``'s median samples/s over torch's (``first_batch``: torch's time to the first batch
        over ``loader``'s), per workload and worker count."""
        if first_batch:
            med = {(p.workload, p.loader, p.num_workers): 1 / p.first_batch_s for p in self.points if p.first_batch_s > 0}
        else:
            med = {(p.workload, p.loader, p.num_workers): p.samples_per_s["median"] for p in self.points}
        out: dict[str, dict[int, float]] = {}
        for (w, kind, n), v in med.items():
            other = med.get((w, "torch", n))
            if kind == loader and other:
                out.setdefault(w, {})[n] = v / other
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [p.to_dict() for p in self.points]

        def table(x: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
            return {w: {str(n): s for n, s in v.items()} for w, v in x.items()}

        d["speedup_vs_torch"] = table(self.speedups())
        d["thread_speedup_vs_torch"] = table(self.speedups("cupy_nwt-thread"))
        d["first_batch_speedup_vs_torch"] = {k: table(self.speedups(k, first_batch=True))
                                             for k in ("cupy_nwt", "cupy_nwt-thread")}
        d["intervals_vs_torch"] = self.intervals()
        return d

    def intervals(self) -> dict[str, Any]:
        """Per loader, workload and worker count: the paired per-repeat ratios to torch (the loaders of a
        repeat ran side by side) as median, 90 % interval and verdict: samples/s against the target
        (>= 1.5x torch on the GPU, ahead of it on the host), and the first batch (torch's seconds over
        this loader's, >= 1: no slower than torch's)."""
        target = SPEEDUP_TARGET[self.device]
        torch_pts = {(p.workload, p.num_workers): p for p in self.points if p.loader == "torch"}
        out: dict[str, Any] = {}
        for p in self.points:
            other = torch_pts.get((p.workload, p.num_workers))
            if p.loader == "torch" or other is None:
                continue
            rate = [a / b for a, b in zip(p.per_repeat, other.per_repeat) if b > 0]
            first = [b / a for a, b in zip(p.first_batch_per_repeat, other.first_batch_per_repeat) if a > 0]
            out.setdefault(p.loader, {}).setdefault(p.workload, {})[str(p.num_workers)] = {
                "samples_per_s_ratio": figure(rate, target), "first_batch_ratio": figure(first, 1.0)}
        return out


def compare(workloads: Sequence[Workload], workers: Sequence[int], loaders: Sequence[str] = LOADERS,
            batch_size: int = 128, batches: int = 30, warmup: int = 3, repeats: int = 3, device: str = "cpu",
            progress: Callable[[str], None] | None = None, note: str = "") -> Comparison:
    runs: dict[tuple[str, str, int], list[Run]] = {}
    for r in range(repeats):
        for wl in workloads:
            for n in workers:
                for kind in loaders:
                    run = measure(kind, wl, n, batch_size, batches, warmup, device, seed=r)
                    runs.setdefault((wl.name, kind, n), []).append(run)
                    if progress:
                        progress(f"repeat {r + 1}/{repeats} {wl.name:12s} {kind:8s} workers={n:<3d} "
                                 f"{run.samples_per_s:10.0f} samples/s")
    points = []
    for (w, kind, n), rs in runs.items():
        mem = [x.peak_memory_bytes for x in rs if x.peak_memory_bytes is not None]
        points.append(Point(w, kind, n, summarize([x.samples_per_s for x in rs]).to_dict(),
                            max(mem) if mem else None, len(rs), statistics.median(x.first_batch_s for x in rs),
                            statistics.median(x.cpu_s_per_1000 for x in rs), [x.samples_per_s for x in rs],
                            [x.first_batch_s for x in rs]))
    torch_version = None
    if "torch" in loaders:
        import torch  # noqa: PLC0415

        torch_version = torch.__version__
    return Comparison(host=system.host_info().to_dict(), device=device, batch_size=batch_size, batches=batches,
                      warmup=warmup, repeats=repeats, torch_version=torch_version,
                      workloads={w.name: w.description for w in workloads}, points=points, note=note)


def plot(result: Comparison, path: Path) -> Path:
    """samples/s against num_workers, one panel per workload, a line per loader (IQR shaded)."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    names = list(result.workloads)
    fig = Figure(figsize=(6 * len(names), 4.5), layout="constrained")
    styles = {"cupy_nwt": ("tab:green", "-"), "cupy_nwt-thread": ("tab:blue", "-."), "torch": ("tab:red", "--")}
    for i, w in enumerate(names):
        ax = fig.add_subplot(1, len(names), i + 1)
        for kind in LOADERS:
            pts = sorted((p for p in result.points if p.workload == w and p.loader == kind), key=lambda p: p.num_workers)
            if not pts:
                continue
            x = [p.num_workers for p in pts]
            color, style = styles[kind]
            ax.plot(x, [p.samples_per_s["median"] for p in pts], style, marker="o", color=color, label=kind)
            ax.fill_between(x, [p.samples_per_s["p25"] for p in pts], [p.samples_per_s["p75"] for p in pts],
                            color=color, alpha=0.15, linewidth=0)
        ax.set_xticks(sorted({p.num_workers for p in result.points}))
        ax.set_xlabel("num_workers")
        ax.set_ylabel("samples/s (median)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(w)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # beside the data, not on it
    host = result.host
    fig.suptitle(f"{host.get('cpu_model', '?')}, {host.get('usable_cpus', '?')} CPUs; batch {result.batch_size}, "
                 f"device {result.device}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=parse_workers, default=None, help="comma-separated counts (default 0,1,2,4,..,CPUs)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=30, help="timed batches per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches per run (worker start-up; the first is timed as time to first batch)")
    p.add_argument("--repeats", type=int, default=3, help="fresh loaders per point; the median is reported")
    p.add_argument("--decode-images", type=int, default=5000)
    p.add_argument("--array-images", type=int, default=8192)
    p.add_argument("--fmt", choices=("png", "jpeg"), default="png")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: batches to the GPU (cupy_nwt pinned ring; torch needs a CUDA build)")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated subset of " + ",".join(LOADERS))
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--note", default="", help="free text kept in the JSON (e.g. what else ran on the host)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    bad = [x for x in loaders if x not in LOADERS]
    if bad or not loaders:
        print(f"loader_compare: unknown loaders {bad or loaders}; use some of {', '.join(LOADERS)}", file=sys.stderr)
        return 2
    for name in ("batch_size", "batches", "warmup", "repeats", "decode_images", "array_images"):
        if getattr(args, name) < 1:
            print(f"loader_compare: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if "torch" in loaders:
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            print("loader_compare: torch is not installed (pip install torch), or pass --loaders cupy_nwt",
                  file=sys.stderr)
            return 2
        if args.device == "cuda" and not torch.cuda.is_available():
            print(f"loader_compare: torch {torch.__version__} has no CUDA here; a fair GPU comparison needs a "
                  "CUDA build of torch", file=sys.stderr)
            return 3
    if args.device == "cuda":
        try:
            cuda.require_gpu()
        except cuda.NoGPUError as exc:
            print(f"loader_compare: {exc}", file=sys.stderr)
            return 3
    workers = args.workers or default_workers()
    with tempfile.TemporaryDirectory(prefix="loader_compare-") as tmp:
        workloads = make_workloads(Path(tmp), args.decode_images, args.array_images, args.fmt)
        steps = args.repeats * len(workloads) * len(workers) * len(loaders)
        with ProgressBar(steps, "loader_compare", unit="run") as bar:
            result = compare(workloads, workers, loaders, args.batch_size, args.batches, args.warmup, args.repeats,
                             args.device, progress=bar.step, note=args.note)
        for wl in workloads:
            close = getattr(wl.dataset, "close", None)
            if close:
                close()
    stem = args.out_dir / f"loader_compare-{system.host_tag()}"
    report.write_json(result, stem.with_suffix(".json"))
    rows = []
    for p in sorted(result.points, key=lambda p: (p.workload, p.num_workers, p.loader)):
        s = result.speedups(p.loader).get(p.workload, {}).get(p.num_workers) if p.loader != "torch" else None
        f = result.speedups(p.loader, first_batch=True).get(p.workload, {}).get(p.num_workers)
        rows.append([p.workload, p.loader, p.num_workers, round(p.samples_per_s["median"]),
                     f"{p.samples_per_s['spread']:.1%}", f"{(p.peak_memory_bytes or 0) / 2**20:.0f}",
                     f"{s:.2f}x" if s else "", f"{p.first_batch_s:.3f}", f"{f:.1f}x" if f else "",
                     f"{p.cpu_s_per_1000:.2f}"])
    print(report.table(["workload", "loader", "workers", "samples/s", "IQR/median", "peak MiB (PSS)", "vs torch",
                        "first batch s", "vs torch", "CPU s/1000"],
                       rows, title=f"loader comparison, batch {result.batch_size}, device {result.device}"))
    judged = [[kind, w, n, f"{f['samples_per_s_ratio']['median']:.2f}x",
               f"{f['samples_per_s_ratio']['low']:.2f}-{f['samples_per_s_ratio']['high']:.2f}",
               f['samples_per_s_ratio']['verdict'], f"{f['first_batch_ratio']['median']:.2f}x",
               f"{f['first_batch_ratio']['low']:.2f}-{f['first_batch_ratio']['high']:.2f}", f['first_batch_ratio']['verdict']]
              for kind, per in result.intervals().items() for w, counts in per.items() for n, f in counts.items()
              if f["samples_per_s_ratio"]["median"] is not None and f["first_batch_ratio"]["median"] is not None]
    if judged:
        print(report.table(["loader", "workload", "workers", "vs torch", "90% interval",
                            f">= {SPEEDUP_TARGET[result.device]}x?", "first batch vs torch", "90% interval", ">= 1x?"],
                           judged, title=f"paired per-repeat ratios to torch, {result.repeats} repeats"))
    print(report.wrote(stem.with_suffix(".json"), lambda png: plot(result, png)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
