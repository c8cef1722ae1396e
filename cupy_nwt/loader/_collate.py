"""Turning a list of samples into a batch of arrays, straight into preallocated memory.

A sample is a nest of tuples / lists / dicts whose leaves are arrays or Python scalars. The nest's
shape (its "treedef") is flattened once; every leaf then becomes one array field of the batch with a
leading row axis. Collating into given views (a ring slot) means workers never build a batch twice
and never pickle its payload. The rules are strict on purpose: a sample whose shape or dtype differs
from the first one is an error naming that sample, never a silent upcast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BatchLayoutError

# A treedef is a small picklable nest: ("leaf",), ("tuple", children), ("list", children),
# ("dict", keys, children) or ("namedtuple", cls, children).
Treedef = tuple


def flatten(obj: Any) -> tuple[list[Any], Treedef]:
    """The leaves of a sample or batch, depth first, and the structure to rebuild it."""
    leaves: list[Any] = []
    return leaves, _flatten(obj, leaves)


def _flatten(obj: Any, leaves: list[Any]) -> Treedef:
    if isinstance(obj, tuple):
        children = tuple(_flatten(x, leaves) for x in obj)
        if hasattr(obj, "_fields"):
            return ("namedtuple", type(obj), children)
        return ("tuple", children)
    if isinstance(obj, list):
        return ("list", tuple(_flatten(x, leaves) for x in obj))
    if isinstance(obj, dict):
        keys = tuple(obj.keys())
        return ("dict", keys, tuple(_flatten(obj[k], leaves) for k in keys))
    leaves.append(obj)
    return ("leaf",)


def unflatten(treedef: Treedef, leaves: Sequence[Any]) -> Any:
    """Rebuild the nest described by ``treedef`` from ``leaves`` (inverse of ``flatten``)."""
    it = iter(leaves)
    out = _unflatten(treedef, it)
    if next(it, None) is not None:
        raise ValueError("more leaves than the structure holds")
    return out


def _unflatten(td: Treedef, it) -> Any:
    kind = td[0]
    if kind == "leaf":
        return next(it)
    if kind == "tuple":
        return tuple(_unflatten(c, it) for c in td[1])
    if kind == "list":
        return [_unflatten(c, it) for c in td[1]]
    if kind == "dict":
        return {k: _unflatten(c, it) for k, c in zip(td[1], td[2])}
    if kind == "namedtuple":
        return td[1](*(_unflatten(c, it) for c in td[2]))
    raise ValueError(f"unknown structure node {kind!r}")


def leaf_paths(treedef: Treedef) -> list[str]:
    """Human-readable paths of the leaves, e.g. ``[0]`` or ``['image']``, for error messages."""
    out: list[str] = []
    _paths(treedef, "", out)
    return out


def _paths(td: Treedef, prefix: str, out: list[str]) -> None:
    kind = td[0]
    if kind == "leaf":
        out.append(prefix or "<sample>")
    elif kind in ("tuple", "list"):
        for i, c in enumerate(td[1]):
            _paths(c, f"{prefix}[{i}]", out)
    elif kind == "dict":
        for k, c in zip(td[1], td[2]):
            _paths(c, f"{prefix}[{k!r}]", out)
    elif kind == "namedtuple":
        for name, c in zip(td[1]._fields, td[2]):
            _paths(c, f"{prefix}.{name}", out)


def as_leaf(value: Any) -> np.ndarray:
    """One sample field as an array: Python int -> int64, float -> float64, bool -> bool."""
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, bool):
        arr = np.asarray(value, dtype=np.bool_)
    elif isinstance(value, int):
        arr = np.asarray(value, dtype=np.int64)
    elif isinstance(value, float):
        arr = np.asarray(value, dtype=np.float64)
    else:
        arr = np.asarray(value)
    if arr.dtype.kind in "OUSV" or arr.dtype.hasobject:
        raise TypeError(f"a {type(value).__name__} field (dtype {arr.dtype}) cannot be batched into arrays")
    return arr


def _describe(td: Treedef) -> str:
    kind = td[0]
    if kind == "leaf":
        return "array"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(c)}" for k, c in zip(td[1], td[2])) + "}"
    inner = ", ".join(_describe(c) for c in td[-1])
    if kind == "list":
        return f"[{inner}]"
    if kind == "namedtuple":
        return f"{td[1].__name__}({inner})"
    return f"({inner})"


def collate_into(samples: Sequence[Any], indices: Sequence[int] | np.ndarray, treedef: Treedef, out: Sequence[np.ndarray]) -> None:
    """Write sample ``i`` into row ``i`` of every field array in ``out``, checking shape and dtype.

    ``indices`` are the dataset indices of ``samples`` and only serve the error messages. Common
    structures (one flat tuple / list / dict of arrays and Python scalars) take a column-wise fast
    path that is exactly as strict; anything it does not accept is redone sample by sample, which
    either succeeds or names the offending sample.
    """
    try:
        if _collate_columns(samples, treedef, out):
            return
    except (ValueError, TypeError, OverflowError):
        pass
    _collate_rows(samples, indices, treedef, out)


_SCALAR_DTYPES = {int: np.dtype(np.int64), float: np.dtype(np.float64), bool: np.dtype(np.bool_)}


def _columns(samples: Sequence[Any], treedef: Treedef) -> list[list[Any]] | None:
    kind = treedef[0]
    if kind == "leaf":
        return [list(samples)]
    if kind not in ("tuple", "list", "dict") or any(c[0] != "leaf" for c in treedef[-1]):
        return None
    k = len(treedef[-1])
    if kind == "dict":
        keys = treedef[1]
        if not all(type(s) is dict and len(s) == k for s in samples):
            return None
        try:
            return [[s[key] for s in samples] for key in keys]
        except KeyError:
            return None
    typ = tuple if kind == "tuple" else list
    if not all(type(s) is typ and len(s) == k for s in samples):
        return None
    return [list(c) for c in zip(*samples)]


def _collate_columns(samples: Sequence[Any], treedef: Treedef, out: Sequence[np.ndarray]) -> bool:
    cols = _columns(samples, treedef)
    if cols is None:
        return False
    for col, dst in zip(cols, out):
        t = type(col[0])
        if not all(type(v) is t for v in col):
            return False
        if t is np.ndarray:
            np.stack(col, out=dst, casting="no")
        elif dst.ndim == 1 and (_SCALAR_DTYPES.get(t) == dst.dtype
                                or (issubclass(t, np.generic) and np.dtype(t) == dst.dtype)):
            dst[:] = col
        else:
            return False
    return True


def _collate_rows(samples: Sequence[Any], indices: Sequence[int] | np.ndarray, treedef: Treedef, out: Sequence[np.ndarray]) -> None:
    paths: list[str] | None = None
    for row, sample in enumerate(samples):
        leaves, td = flatten(sample)
        index = int(indices[row])
        if td != treedef:
            raise BatchLayoutError(
                f"sample index {index} has the structure {_describe(td)}, expected {_describe(treedef)}", index
            )
        for j, (leaf, dst) in enumerate(zip(leaves, out)):
            try:
                arr = as_leaf(leaf)
            except (TypeError, OverflowError) as exc:
                paths = paths or leaf_paths(treedef)
                raise BatchLayoutError(f"sample index {index}, field {paths[j]}: {exc}", index) from None
            if arr.shape != dst.shape[1:] or arr.dtype != dst.dtype:
                paths = paths or leaf_paths(treedef)
                raise BatchLayoutError(
                    f"sample index {index}, field {paths[j]}: expected shape {dst.shape[1:]} dtype {dst.dtype}, "
                    f"got shape {arr.shape} dtype {arr.dtype}",
                    index,
                )
            dst[row] = arr


def default_collate(samples: Sequence[Any], indices: Sequence[int] | np.ndarray | None = None) -> Any:
    """Stack each field of the samples into a new array; the structure of the samples is kept."""
    if len(samples) == 0:
        raise ValueError("cannot collate an empty list of samples")
    if indices is None:
        indices = range(len(samples))
    leaves, treedef = flatten(samples[0])
    try:
        firsts = [as_leaf(x) for x in leaves]
    except TypeError as exc:
        raise BatchLayoutError(f"sample index {int(indices[0])}: {exc}", int(indices[0])) from None
    out = [np.empty((len(samples), *a.shape), dtype=a.dtype) for a in firsts]
    collate_into(samples, indices, treedef, out)
    return unflatten(treedef, out)
