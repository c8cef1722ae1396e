"""What every PNG plot shares: matplotlib found or named as the extra to install, a legend outside the axes,
an atomic write of the rendered picture.

A ``Figure`` is built directly (no pyplot) and drawn with matplotlib's Agg canvas, so plotting never
switches the process-wide backend and works on headless machines. matplotlib is an optional dependency
(``cupy-nwt[plot]``).
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

from .._files import atomic_open
from ..errors import MissingExtraError


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (plots are skipped, said in one line, where it cannot); takes no arguments."""
    return importlib.util.find_spec("matplotlib") is not None


def figure_class():
    """matplotlib's Figure class (no pyplot state), or an ImportError naming the extra to install."""
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise MissingExtraError("plots need matplotlib: pip install 'cupy-nwt[plot]'") from exc
    return Figure


def legend_outside(ax: Any) -> None:
    """The legend to the right of the axes, beside the data instead of on it; none without labels.

    Args:
        ax: a matplotlib ``Axes``.
    """
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")


def save_figure(fig: Any, path: str | Path, dpi: int) -> Path:
    """Render first, then write atomically: a failed render leaves no file and no empty folder.

    Args:
        fig: a matplotlib ``Figure``.
        path: the PNG to write (its folder is made).
        dpi: the resolution.

    Returns:
        ``path``.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})  # the same bytes for the same drawing
    with atomic_open(path) as f:
        f.write(buf.getbuffer())
    return Path(path)
