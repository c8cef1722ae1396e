"""PNG plots of experiment results, drawn with matplotlib's Agg canvas.

A ``Figure`` is built directly (no pyplot), so plotting never switches the process-wide backend
and works on headless machines. matplotlib is an optional dependency (``cupy-nwt[plot]``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from .units import fmt_bytes

if TYPE_CHECKING:
    from .transfers import BandwidthResult

_COLORS = {"h2d": "tab:blue", "d2h": "tab:orange"}
_STYLES = {"pinned": "-", "pageable": "--"}


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _figure_class():
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'cupy-nwt[plot]'") from exc
    return Figure


def plot_bandwidth(result: BandwidthResult, path: str | Path) -> Path:
    """GB/s against copy size (log2 axis): H2D and D2H, pinned and pageable, and the link limit.

    Lines are medians; the shaded band around each is the inter-quartile range of the samples.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: PLC0415

    fig = _figure_class()(figsize=(11, 5.5), layout="constrained")
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
    top = max([p.gbps.p75 for p in result.points] + [result.link_gbps or 0.0])
    ax.set_ylim(0, 1.1 * top if top > 0 else 1.0)
    ax.grid(True, which="major", alpha=0.3)
    d = result.device
    ax.set_title(f"Host <-> device bandwidth: {d.name} (GPU {d.index})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # outside: never on data
    ax.tick_params(axis="x", labelrotation=45)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=120)
    return out
