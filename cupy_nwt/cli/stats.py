"""``cupy-nwt stats``: run the loader on a dataset and watch ``loader.stats()`` interval by interval.

Why a command: before tuning anything, one wants to know which stage a pipeline waits on (reading
samples, collating, the transform, the copy) and whether its workers copy the dataset as they read
it; this runs the real loader for a number of batches and prints the figures every few batches,
as a table and, with ``--plot``, over time.

The first row is the warm-up: the first batch of every worker (one batch with no workers), which
carries one-time costs (imports, a JIT compile of the transform, the first reads of a file). A
0.57 s Numba compile in a 4 s run would otherwise be "the stage that took longest"; the footer
reports the warm-up apart and names the longest stage of the steady state after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ArgumentError
from ..loader import DataLoader, LoaderStats
from ..reporting.units import plural

MIB = 1 << 20
_STAGES = (("fetch_s", "fetch"), ("collate_s", "collate"), ("transform_s", "transform"), ("copy_s", "copy"))


@dataclass(frozen=True)
class WatchConfig:
    """The loader to watch (its usual arguments) and how long: ``batches`` in all, a row every ``every``."""

    batch_size: int = 128
    num_workers: int = 2
    worker_type: str = "process"
    device: str = "auto"
    batches: int = 200
    every: int = 20
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WatchRow:
    """One interval: the batches delivered by its end, the seconds since the start, and its figures.

    ``warmup``: an interval within the first batch of every worker, one-time costs included.
    """

    batches: int
    elapsed_s: float
    stats: LoaderStats
    warmup: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "elapsed_s": self.elapsed_s, "warmup": self.warmup,
                "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class WatchResult:
    dataset: str
    config: WatchConfig
    loader: str
    rows: tuple[WatchRow, ...]
    interrupted: bool = False  # Ctrl-C ended the run: the last row is where it stood then

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "config": self.config.to_dict(), "loader": self.loader,
                "rows": [r.to_dict() for r in self.rows], "interrupted": self.interrupted}


def run_watch(dataset: Any, name: str, config: WatchConfig, *, batch_transform: Callable | None = None,
              step: Callable[[], None] | None = None, on_row: Callable[[WatchRow], None] | None = None) -> WatchResult:
    """Iterate ``config.batches`` batches (as many epochs as that takes; persistent workers, so their memory
    is followed across epochs), taking ``stats()`` after the warm-up (``warmup_batches``), every
    ``config.every`` batches and at the end. Ctrl-C after the first batch ends the run with a last row
    where it stood (``interrupted``): a long watch keeps what it saw."""
    import time  # noqa: PLC0415 - only the run needs it

    rows: list[WatchRow] = []
    dl: DataLoader[Any]
    interrupted = False
    with DataLoader(dataset, batch_size=config.batch_size, shuffle=True, num_workers=config.num_workers,
                    worker_type=config.worker_type, device=config.device, seed=config.seed,
                    batch_transform=batch_transform, persistent_workers=config.num_workers > 0) as dl:
        described = repr(dl)
        dl.stats()  # the start: the first interval begins with the first iteration
        t0, done = time.perf_counter(), 0
        warmup = warmup_batches(config)

        def take_row() -> None:
            rows.append(WatchRow(done, time.perf_counter() - t0, dl.stats(), warmup=done <= warmup))
            if on_row is not None:
                on_row(rows[-1])

        try:
            while done < config.batches:
                delivered_this_epoch = 0
                for _ in dl:
                    done += 1
                    delivered_this_epoch += 1
                    if step is not None:
                        step()
                    if done == warmup or done % config.every == 0 or done == config.batches:
                        take_row()
                    if done >= config.batches:
                        break
                if delivered_this_epoch == 0:
                    raise ArgumentError(f"{name} gives no batch of {config.batch_size} samples")
        except KeyboardInterrupt:
            if done == 0:
                raise
            interrupted = True
            if not rows or rows[-1].batches != done:
                take_row()
    return WatchResult(name, config, described, tuple(rows), interrupted)


def warmup_batches(config: WatchConfig) -> int:
    """The batches of the warm-up: one from every worker (one with no workers), at most all of them."""
    return min(config.batches, max(1, config.num_workers))


HEADERS = ("batches", "s", "waited s", "blocked s", "busy %", "fetch s", "collate s", "transform s", "copy s", "workers",
           "depth", "worker MiB", "growth MiB", "stalls")


def row_cells(row: WatchRow) -> list[Any]:
    s = row.stats
    mem, grew = s.worker_private_bytes, s.worker_growth_bytes
    return [f"{row.batches}*" if row.warmup else row.batches, f"{row.elapsed_s:.2f}", f"{s.waited_s:.3f}", f"{s.blocked_s:.3f}",
            "-" if s.busy_fraction is None else f"{100 * s.busy_fraction:.0f}",
            *(f"{getattr(s, k):.3f}" for k, _ in _STAGES), s.num_workers, s.prefetch_depth,
            "-" if mem is None else f"{mem / MIB:.1f}", "-" if grew is None else f"{grew / MIB:+.1f}", len(s.stalls)]


def _line(cells: list[Any]) -> str:
    return "  ".join(str(c).rjust(max(len(h), 6)) for c, h in zip(cells, HEADERS))


def live_table() -> Callable[[WatchRow], None]:
    """Print each row as it is taken (fixed widths, so rows line up as they come), the header with the first:
    a run that fails before its first row (the loader refused, a bad first sample) prints no table at all."""
    started = False

    def show(row: WatchRow) -> None:
        nonlocal started
        if not started:
            print(_line(list(HEADERS)), flush=True)
            started = True
        print(_line(row_cells(row)), flush=True)

    return show


def footer(result: WatchResult) -> str:
    """The notes under the table: what 'copy' measured, where the time went, the tuner's decisions, stalls."""
    lines = []
    if result.rows:
        lines.append(f"copy: {result.rows[0].stats.copy}; memory: the workers' private memory (USS), "
                     "growth since their first batch" + (" (threads have none of their own)"
                                                        if result.rows[0].stats.memory is None else ""))
        warm = [r for r in result.rows if r.warmup]
        steady = [r for r in result.rows if not r.warmup]
        if warm:
            w = warm[-1]
            top, secs = _longest(warm)
            lines.append(f"* warm-up: the first {plural(w.batches, 'batch', 'batches')} (one from each worker; "
                         f"one-time costs: imports, JIT compiles, first reads) took {w.elapsed_s:.2f} s; "
                         f"its longest stage: {top} ({secs:.2f} s)")
        if steady:
            waited = sum(r.stats.waited_s for r in steady)
            blocked = sum(r.stats.blocked_s for r in steady)
            top, secs = _longest(steady)
            after = f" after the warm-up (batches {warm[-1].batches + 1}..{steady[-1].batches})" if warm else ""
            lines.append(f"steady state{after}: the caller waited {waited:.2f} s ({blocked:.2f} s of it for batches "
                         f"not yet made); the stage that took longest: {top} ({secs:.2f} s, summed over the workers)")
    over = [r.batches for r in result.rows if (r.stats.busy_fraction or 0.0) > 1.0]
    if over:
        lines.append(f"busy % past 100 (at batch {over[0]}{' and later' if len(over) > 1 else ''}): a batch counts "
                     "where it arrives, and batches made before a short interval arrived in it; a larger --every "
                     "spreads them out")
    for r in result.rows:
        for d in r.stats.decisions:
            lines.append(f"autotune at batch {r.batches}: {d['action']} -> {d['workers']} workers, "
                         f"{d['slots']} slots: {d['reason']}")
        for st in r.stats.stalls:
            lines.append(f"stall: waited {st.waited_s:.1f} s for batch {st.batch_index}, which {st.where}")
    return "\n".join(lines)


def _longest(rows: list[WatchRow]) -> tuple[str, float]:
    """The stage with the most seconds over ``rows`` (summed over the workers), and those seconds."""
    totals = {k: sum(getattr(r.stats, k) for r in rows) for k, _ in _STAGES}
    top = max(totals, key=lambda k: totals[k])
    return dict(_STAGES)[top], totals[top]


def plot_watch(result: WatchResult, path: str | Path) -> Path:
    """Seconds per stage in each interval (stacked) and the workers' busy fraction, against batches."""
    from ..reporting.plots import figure_class, legend_outside, save_figure  # noqa: PLC0415 - optional matplotlib

    fig = figure_class()(figsize=(8.5, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    x = [r.batches for r in result.rows]
    top.stackplot(x, *([getattr(r.stats, k) for r in result.rows] for k, _ in _STAGES),
                  labels=[label for _, label in _STAGES], alpha=0.8)
    top.plot(x, [r.stats.waited_s for r in result.rows], color="black", marker=".", label="caller waited")
    top.plot(x, [r.stats.blocked_s for r in result.rows], color="black", ls="--", label="of it, blocked for workers")
    top.set_ylabel("seconds per interval\n(stages: summed over workers)")
    top.set_title(f"{result.dataset}: {result.config.num_workers} {result.config.worker_type} workers, "
                  f"batch {result.config.batch_size}")
    legend_outside(top)
    bottom.plot(x, [100 * (r.stats.busy_fraction or 0.0) for r in result.rows], marker=".", color="tab:green")
    bottom.set_ylabel("workers busy %")
    bottom.set_xlabel("batches delivered")
    bottom.set_ylim(0, 105)
    return save_figure(fig, path, dpi=110)
