"""Turning results into text people read and JSON machines read, and writing result files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._files import atomic_open
from ..errors import ArgumentTypeError


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """A plain fixed-width table; numbers right-aligned, text left-aligned.

    Args:
        headers: the column names.
        rows: the cells, row by row (numbers formatted with thousands separators).
        title: a line above the table.
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out += [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, Any]], title: str | None = None) -> str:
    """Names and values in two aligned columns, for a result with one value per name.

    Args:
        pairs: ``(name, value)`` in the order shown.
        title: a line above them.
    """
    width = max((len(k) for k, _ in pairs), default=0)
    out = [title] if title else []
    out += [f"{k.ljust(width)}  {_cell(v)}" for k, v in pairs]
    return "\n".join(out)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 and v != 0 else f"{v:,.2f}"
    return str(v)


def to_json(obj: Any) -> str:
    """``obj`` as indented JSON; objects with ``to_dict()`` and NumPy scalars as their plain equivalents.

    Args:
        obj: the result.
    """
    return json.dumps(obj, indent=2, sort_keys=False, default=_default)


def write_json(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``obj`` as JSON atomically: a reader never sees half a result file.

    Args:
        obj: the result.
        path: the file (its folder is made).

    Returns:
        ``path``.
    """
    with atomic_open(path) as f:
        f.write((to_json(obj) + "\n").encode("utf-8"))
    return Path(path)


def wrote(json_path: Path, plot: Callable[[Path], Path]) -> str:
    """The closing line of a command that wrote ``json_path``: it draws the plot beside it (a
    ``.png``), or says there is none when matplotlib is not installed (an optional extra).

    Args:
        json_path: the result file written.
        plot: draws the picture at the path it is given and returns it.
    """
    try:
        return f"wrote {json_path} and {plot(json_path.with_suffix('.png'))}"
    except ImportError:
        return f"wrote {json_path} (no plot: matplotlib is not installed)"


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    raise ArgumentTypeError(f"cannot serialise {type(o).__name__}")
