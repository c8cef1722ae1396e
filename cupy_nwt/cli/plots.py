"""PNG plots of the commands' results (bandwidth sweeps; the tuner like the NWT paper's Fig. 2 and 3).

Drawn with ``cupy_nwt.reporting.plots`` (no pyplot; matplotlib an optional dependency). Every plot sets its own limits with room for the markers (autoscale
cut the circled pick at the top) and keeps its legend outside the axes, where it cannot cover data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..reporting.plots import figure_class, legend_outside, matplotlib_available, save_figure
from ..reporting.units import fmt_bytes

if TYPE_CHECKING:
    from ..experiments.transfers import BandwidthResult
    from ..picks.store import TuneResult

__all__ = ["bandwidth_figure", "matplotlib_available", "plot_bandwidth", "plot_tune", "tune_figure"]

_COLORS = {"h2d": "tab:blue", "d2h": "tab:orange"}
_STYLES = {"pinned": "-", "pageable": "--"}


def bandwidth_figure(result: BandwidthResult) -> Any:
    """GB/s against copy size (log2 axis): H2D and D2H, pinned and pageable, and the link limit.

    Lines are medians; the shaded band around each is the inter-quartile range of the samples.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: PLC0415

    fig = figure_class()(figsize=(11, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            pts = sorted((p for p in result.points if p.direction == direction and p.memory == memory),
                         key=lambda p: p.nbytes)
            if not pts:
                continue
            x = [p.nbytes for p in pts]
            ax.plot(x, [p.gbps.median for p in pts], _STYLES[memory], marker="o", markersize=3,
                    color=_COLORS[direction], label=f"{direction.upper()} {memory}")
            ax.fill_between(x, [p.gbps.p25 for p in pts], [p.gbps.p75 for p in pts],
                            color=_COLORS[direction], alpha=0.15, linewidth=0)
    if result.link_gbps:
        ax.axhline(result.link_gbps, color="black", linestyle=":", linewidth=1.2,
                   label=f"PCIe {result.link_label}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_bytes(v) if v >= 1 else ""))
    ax.set_xlabel("copy size")
    ax.set_ylabel("GB/s (1e9 B/s), median")
    sizes = [p.nbytes for p in result.points]
    if sizes:
        lo, hi = math.log2(min(sizes)), math.log2(max(sizes))
        pad = max(0.5, 0.04 * (hi - lo))
        ax.set_xlim(2 ** (lo - pad), 2 ** (hi + pad))
    ax.set_ylim(0, _top([p.gbps.p75 for p in result.points] + [result.link_gbps or 0.0]))
    ax.grid(True, which="major", alpha=0.3)
    d = result.device
    ax.set_title(f"Host <-> device bandwidth: {d.name} (GPU {d.index})")
    legend_outside(ax)
    ax.tick_params(axis="x", labelrotation=45)
    return fig


def plot_bandwidth(result: BandwidthResult, path: str | Path) -> Path:
    """:func:`bandwidth_figure` as a PNG at ``path``."""
    return save_figure(bandwidth_figure(result), path, dpi=120)


MiB = 1024 * 1024
_PICK = {"marker": "o", "markersize": 13, "markerfacecolor": "none", "markeredgecolor": "tab:red",
         "markeredgewidth": 2, "linestyle": "none"}


def tune_figure(result: TuneResult) -> Any:
    """Left: milliseconds per iteration by worker count; right: peak PSS and USS (MiB).

    The pick is circled in red and the fastest measured count marked; a fast search shows only the
    counts it measured, which is the point of it.
    """
    make_figure = figure_class()
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - importable once the figure class is

    trials = result.trials
    fig = make_figure(figsize=(13, 4.8), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    if not trials:  # N = 1: the fast search picks 0 without measuring
        for ax in (ax_t, ax_m):
            ax.text(0.5, 0.5, f"nothing measured: only {result.max_workers} count possible, pick "
                    f"{result.best_workers}", ha="center", va="center", transform=ax.transAxes)
        return fig
    workers = [t.workers for t in trials]
    ms = [t.seconds_per_iteration * 1e3 for t in trials]
    fastest = min(trials, key=lambda t: (t.seconds_per_iteration, t.workers))
    pick = result.best_trial

    style = "-o" if result.strategy == "paper" else "o"
    ax_t.plot(workers, ms, style, markersize=4, color="tab:blue", label="time per iteration")
    ax_t.plot([fastest.workers], [fastest.seconds_per_iteration * 1e3], "v", markersize=9, color="tab:green",
              label=f"fastest: {fastest.workers}")
    if pick is not None:
        ax_t.plot([pick.workers], [pick.seconds_per_iteration * 1e3], label=f"pick: {pick.workers}", **_PICK)
    ax_t.set_xlabel("worker processes")
    ax_t.set_ylabel("ms per iteration (batch delivered" + (" + H2D copy)" if result.device == "cuda" else ")"))
    ax_t.set_ylim(0, _top(ms))
    ax_t.set_title(f"Time over workers ({result.strategy}, batch {result.batch_size})")

    pss = [(t.workers, t.peak_memory_bytes / MiB) for t in trials if t.peak_memory_bytes is not None]
    uss = [(t.workers, t.peak_uss_bytes / MiB) for t in trials if t.peak_uss_bytes is not None]
    if pss:
        ax_m.plot(*zip(*pss), style, markersize=4, color="tab:purple", label="peak PSS, all processes")
    if uss:
        ax_m.plot(*zip(*uss), "--" if result.strategy == "paper" else "x", color="tab:gray",
                  label="peak USS, all processes")
    if pick is not None and pick.peak_memory_bytes is not None:
        ax_m.plot([pick.workers], [pick.peak_memory_bytes / MiB], label=f"pick: {pick.workers}", **_PICK)
    if not pss and not uss:
        ax_m.text(0.5, 0.5, "memory not measured", ha="center", va="center", transform=ax_m.transAxes)
    ax_m.set_xlabel("worker processes")
    ax_m.set_ylabel("MiB")
    ax_m.set_ylim(0, _top([m for _, m in pss + uss]))
    ax_m.set_title("Memory over workers (main process + workers)")
    pad = max(0.5, 0.04 * (max(workers) - min(workers)))
    for ax in (ax_t, ax_m):
        ax.set_xlim(min(workers) - pad, max(workers) + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        legend_outside(ax)
    return fig


def plot_tune(result: TuneResult, path: str | Path) -> Path:
    """:func:`tune_figure` as a PNG at ``path``."""
    return save_figure(tune_figure(result), path, dpi=110)


def _top(values: Sequence[float]) -> float:
    """An upper y limit 15% above the highest value: room for the largest marker (the circled pick)."""
    top = max(values, default=0.0)
    return 1.15 * top if top > 0 else 1.0

