"""Argument checks shared by the public entry points, so that every bad integer or number is refused
the same way: an ``ArgumentError`` (a ``ValueError``) whose one line names the argument, what it
must be and what it got, e.g. ``batch_size must be a positive integer, got 0``.

``bool`` is refused where an integer or number is wanted (``True`` is an ``int`` to Python, never a
meant worker count); NumPy integers and floats are accepted and returned as Python ``int`` /
``float``, so what a caller stores is plain and JSON-ready.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal, overload

import numpy as np

from .errors import ArgumentError, ArgumentTypeError


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _int_kind(ge: int | None, le: int | None) -> str:
    if ge is not None and le is not None:
        return f"an integer from {ge} to {le}"
    if ge == 0:
        return "a non-negative integer"
    if ge == 1:
        return "a positive integer"
    if ge is not None:
        return f"an integer >= {ge}"
    if le is not None:
        return f"an integer <= {le}"
    return "an integer"


def _number_kind(gt: float | None, ge: float | None, lt: float | None, le: float | None, unit: str | None) -> str:
    noun = f"number of {unit}" if unit else "number"
    low = (f"({_fmt(gt)}" if gt is not None else f"[{_fmt(ge)}" if ge is not None else None)
    high = (f"{_fmt(lt)})" if lt is not None else f"{_fmt(le)}]" if le is not None else None)
    if low is not None and high is not None:
        return f"a {noun} in {low}, {high}"
    if gt == 0 and high is None:
        return f"a positive {noun}"
    if ge == 0 and high is None:
        return f"a non-negative {noun}"
    bound = (f"> {_fmt(gt)}" if gt is not None else f">= {_fmt(ge)}" if ge is not None
             else f"< {_fmt(lt)}" if lt is not None else f"<= {_fmt(le)}" if le is not None else None)
    return f"a {noun} {bound}" if bound else f"a finite {noun}"


def _refuse(name: str, kind: str, value: object, optional: bool, also: str | None,
            wrong_type: bool = False) -> ArgumentError:
    """The one-line refusal; of a value of the wrong type, an ``ArgumentTypeError``: a ``TypeError`` too, as
    torch raises for ``num_workers=1.0``, and still the ``ValueError`` every bad value is."""
    others = [*([also] if also else []), *(["None"] if optional else [])]
    accepted = " or ".join([kind, *others])
    cls = ArgumentTypeError if wrong_type else ArgumentError
    return cls(f"{name} must be {accepted}, got {value!r}")


@overload
def check_int(name: str, value: object, *, ge: int | None = ..., le: int | None = ...,
              optional: Literal[False] = ..., also: str | None = ...) -> int: ...
@overload
def check_int(name: str, value: object, *, ge: int | None = ..., le: int | None = ...,
              optional: Literal[True], also: str | None = ...) -> int | None: ...
def check_int(name: str, value: object, *, ge: int | None = None, le: int | None = None,
              optional: bool = False, also: str | None = None) -> int | None:
    """``value`` as a Python int if it is an integer within ``ge <= value <= le`` (either bound may be
    left out), else raise ``ArgumentError`` naming ``name``.

    ``optional=True`` lets ``None`` through (returned as ``None``). ``also`` only words the message
    for values the caller accepts before calling (``also="'auto'"`` gives "... or 'auto', got ...").
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise _refuse(name, _int_kind(ge, le), value, optional, also, wrong_type=True)
    if (ge is not None and value < ge) or (le is not None and value > le):
        raise _refuse(name, _int_kind(ge, le), value, optional, also)
    return int(value)


@overload
def check_number(name: str, value: object, *, gt: float | None = ..., ge: float | None = ...,
                 lt: float | None = ..., le: float | None = ..., optional: Literal[False] = ...,
                 unit: str | None = ...) -> float: ...
@overload
def check_number(name: str, value: object, *, gt: float | None = ..., ge: float | None = ...,
                 lt: float | None = ..., le: float | None = ..., optional: Literal[True],
                 unit: str | None = ...) -> float | None: ...
def check_number(name: str, value: object, *, gt: float | None = None, ge: float | None = None,
                 lt: float | None = None, le: float | None = None, optional: bool = False,
                 unit: str | None = None) -> float | None:
    """``value`` as a Python float if it is a finite real number within the given bounds (``gt`` /
    ``ge`` below, ``lt`` / ``le`` above, any left out), else raise ``ArgumentError`` naming ``name``.

    NaN and infinities are refused: no bound check can catch a NaN, and no caller here means one.
    ``optional=True`` lets ``None`` through; ``unit`` words the message ("a positive number of seconds").
    """
    if value is None and optional:
        return None
    kind = _number_kind(gt, ge, lt, le, unit)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _refuse(name, kind, value, optional, None, wrong_type=True)
    try:
        x = float(value)
    except OverflowError:  # an int too large for a float
        x = math.inf
    if (not math.isfinite(x) or (gt is not None and not x > gt) or (ge is not None and not x >= ge)
            or (lt is not None and not x < lt) or (le is not None and not x <= le)):
        raise _refuse(name, kind, value, optional, None)
    return x


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool (NumPy's too), else ``ArgumentTypeError`` naming ``name``: a switch given a
    string (``progress="no"``) would otherwise be read as on."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_callable(name: str, value: object, *, optional: bool = False) -> None:
    """Refuse a ``value`` that cannot be called (``transform=5``), at once and naming ``name``, rather
    than where it is first used, inside a worker and far from the mistake. ``optional`` lets ``None`` through."""
    if not callable(value) and not (optional and value is None):
        raise ArgumentTypeError(f"{name} must be a callable{' or None' if optional else ''}, got {value!r}")


def check_path(name: str, value: object) -> Path:
    """``value`` as a ``Path`` if it is a ``str`` or ``os.PathLike``, else ``ArgumentTypeError`` naming
    ``name`` (``Path(None)`` would raise a ``TypeError`` that names no argument)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name} must be a path (str or os.PathLike), got {value!r}")
    return Path(value)
