"""Nests of tuples, lists, dicts and namedtuples: flattened to leaves plus a small picklable structure.

Two views of one idea. ``flatten`` treats every non-container as a leaf: that is how a *sample* is
read by the collation; a mapping or sequence of another type is recursed too, as torch recurses it
(``containers``). ``split`` / ``join`` cut a *batch* for transport: its NumPy arrays go through the
shared-memory ring, every other leaf (a str list, None, any object a custom ``collate_fn`` returns)
travels pickled beside it. ``split`` recurses only into containers that ``join`` makes again exactly,
so any other container comes back as itself, pickled whole. A torch tensor or
JAX array leaf travels as NumPy bytes too, its framework kept as a tag on its leaf
(``("leaf", "torch")``): ``join`` gives it back in that framework (``frameworks``). A mutable container with
attributes of its own crosses as its items, its emptied copy (``containers.Make.remakes``) travelling
pickled beside them: ``("shell", T, (inner,))``, the copy the next of the other leaves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import ArgumentError
from .containers import Make, items_only, plain_items
from .frameworks import AUTO_TORCH, FRAMEWORKS, framework_of, host_view, to_framework

# A treedef is a small picklable nest: ("leaf",) an array (or, for samples, any leaf), ("leaf", fw)
# an array joined back as framework fw's ("torch", "jax"), ("obj",) a leaf that travels pickled
# (("obj", "tuple"): a str column collated as a tuple), ("tuple", children), ("list", children), ("dict", keys, children) or
# ("namedtuple", cls, children), or a mapping or sequence of another type around its plain items:
# ("typed", T, (inner,)) when it holds nothing else, ("typed_stateful", T, (inner,)) when it has attributes
# of its own, with T its type in a sample's structure and its ``containers.Make`` in a batch's.
Treedef = tuple
TYPED = ("typed", "typed_stateful")

LEAF: Treedef = ("leaf",)
OBJ: Treedef = ("obj",)
TEXT_TUPLE: Treedef = ("obj", "tuple")  # a batch's str or bytes gathered as a tuple (inside a sequence, as torch does)
_RING_KINDS = frozenset("biufcmM")  # dtypes with a fixed item size and no Python objects inside


def flatten(obj: Any) -> tuple[list[Any], Treedef]:
    """The leaves of a sample or batch, depth first, and the structure to rebuild it."""
    leaves: list[Any] = []
    return leaves, _flatten(obj, leaves)


def _flatten(obj: Any, leaves: list[Any]) -> Treedef:
    t = type(obj)
    if t is tuple:
        return ("tuple", tuple(_flatten(x, leaves) for x in obj))
    if t is list:
        return ("list", tuple(_flatten(x, leaves) for x in obj))
    if t is dict:
        keys = tuple(obj.keys())
        return ("dict", keys, tuple(_flatten(obj[k], leaves) for k in keys))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("namedtuple", t, tuple(_flatten(x, leaves) for x in obj))
    items = plain_items(obj)
    if items is not None:
        return ("typed" if items_only(obj) else "typed_stateful", t, (_flatten(items, leaves),))
    leaves.append(obj)
    return LEAF


def without_types(td: Treedef) -> Treedef:
    """``td`` with each typed container replaced by its plain items' node: what every sample of a batch
    must share (torch takes the batch's container types from its first sample alone)."""
    kind = td[0]
    if kind in ("leaf", "obj"):
        return td
    if kind in TYPED:
        return without_types(td[2][0])
    if kind in ("dict", "namedtuple"):
        return (kind, td[1], tuple(without_types(c) for c in td[2]))
    return (kind, tuple(without_types(c) for c in td[1]))


_PLAIN_ARRAYS = (np.ndarray, np.memmap)


def is_ring_array(x: Any) -> bool:
    """An array the ring can carry: a NumPy array (or memory map) of numbers, bools or datetimes (no objects,
    no str). A subclass (a masked array's mask, a matrix's shape rules) is more than its buffer: it travels
    pickled, as the user's object, and comes back of its class."""
    return type(x) in _PLAIN_ARRAYS and x.dtype.kind in _RING_KINDS


def split(batch: Any) -> tuple[Treedef, list[np.ndarray], list[Any]]:
    """A batch as (structure, its ring arrays, its other leaves), both lists depth first."""
    arrays: list[np.ndarray] = []
    objects: list[Any] = []
    return _split(batch, arrays, objects), arrays, objects


def _split(obj: Any, arrays: list[np.ndarray], objects: list[Any]) -> Treedef:
    t = type(obj)
    if t is tuple:
        return ("tuple", tuple(_split(x, arrays, objects) for x in obj))
    if t is list:
        return ("list", tuple(_split(x, arrays, objects) for x in obj))
    if t is dict:
        keys = tuple(obj.keys())
        return ("dict", keys, tuple(_split(obj[k], arrays, objects) for k in keys))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("namedtuple", t, tuple(_split(x, arrays, objects) for x in obj))
    items = plain_items(obj)
    if items is not None:
        make = Make.like(obj)
        if make.gives_back(obj, items) or (make.proto is None and make.remakes(obj, items)):
            return ("typed", make, (_split(items, arrays, objects),))
        if make.remakes(obj, items):
            objects.append(make.proto)
            return ("shell", t, (_split(items, arrays, objects),))
    if is_ring_array(obj):
        arrays.append(obj)
        return LEAF
    framework = framework_of(obj)
    if framework is not None:
        host = host_view(obj, framework)
        if host is not None and is_ring_array(host[0]):
            arrays.append(host[0])
            return leaf_of(framework, host[1])
    objects.append(obj)
    return OBJ


def leaf_of(framework: str | None, dtype: str | None = None) -> Treedef:
    """The leaf of an array that ``join`` gives back as ``framework``'s (None: as it is); ``dtype``, the torch
    dtype whose bits the array carries (``frameworks.host_view``)."""
    if framework is None:
        return LEAF
    return ("leaf", framework) if dtype is None else ("leaf", framework, dtype)


def retag(td: Treedef, framework: str | None, plain_only: bool = False) -> Treedef:
    """``td`` with every array leaf joined as ``framework``'s (None: as it is, NumPy or CuPy); with
    ``plain_only``, only the leaves that carry no framework of their own."""
    kind = td[0]
    if kind == "leaf":  # bits of a dtype only torch has stay torch's
        return td if (plain_only and len(td) > 1) or len(td) > 2 else leaf_of(framework)
    if kind == "obj":
        return td
    if kind in ("dict", "namedtuple", "shell", *TYPED):
        return (kind, td[1], tuple(retag(c, framework, plain_only) for c in td[2]))
    return (kind, tuple(retag(c, framework, plain_only) for c in td[1]))


class OutputTree:
    """A batch structure as ``output`` wants it joined: as it is ("auto"), its NumPy leaves as torch's
    (``frameworks.AUTO_TORCH``), else every array leaf in one framework (None for "numpy" and "cupy").
    Remembers the last structure: it rarely changes."""

    def __init__(self, output: str) -> None:
        self.output = output
        self._last: tuple[Any, Any] = (None, None)

    def __call__(self, treedef: Any) -> Any:
        if self.output == "auto":
            return treedef
        if self._last[0] is not treedef:
            if self.output == AUTO_TORCH:
                self._last = (treedef, retag(treedef, "torch", plain_only=True))
            else:
                self._last = (treedef, retag(treedef, self.output if self.output in FRAMEWORKS else None))
        return self._last[1]


def leaf_frameworks(td: Treedef) -> list[str | None]:
    """The framework of every array leaf of ``td``, depth first (None: NumPy, or CuPy on the GPU)."""
    return [leaf[1] if len(leaf) > 1 else None for leaf in _leaves(td) if leaf[0] == "leaf"]


def join(treedef: Treedef, arrays: Sequence[Any], objects: Sequence[Any] = ()) -> Any:
    """Rebuild a batch from ``split``'s parts (the arrays may have moved: copies, device arrays)."""
    if treedef == LEAF and len(arrays) == 1 and not objects:  # a batch that is one array
        return arrays[0]
    a, o = iter(arrays), iter(objects)
    out = _build(treedef, a, o)
    if next(a, None) is not None or next(o, None) is not None:
        raise ArgumentError("more leaves than the structure holds")
    return out


def _build(td: Treedef, arrays: Iterator[Any], objects: Iterator[Any]) -> Any:
    kind = td[0]
    if kind == "leaf":
        return next(arrays) if len(td) == 1 else to_framework(next(arrays), *td[1:])
    if kind == "obj":
        return next(objects)
    if kind == "tuple":
        return tuple(_build(c, arrays, objects) for c in td[1])
    if kind == "list":
        return [_build(c, arrays, objects) for c in td[1]]
    if kind == "dict":
        return {k: _build(c, arrays, objects) for k, c in zip(td[1], td[2])}
    if kind == "namedtuple":
        return td[1](*(_build(c, arrays, objects) for c in td[2]))
    if kind in TYPED:
        return td[1](_build(td[2][0], arrays, objects))
    if kind == "shell":
        make = Make(td[1], next(objects))
        return make(_build(td[2][0], arrays, objects))
    raise ArgumentError(f"unknown structure node {kind!r}")


def as_sample_treedef(td: Treedef) -> Treedef:
    """The structure of one sample of a batch with structure ``td`` (every leaf a plain leaf)."""
    kind = td[0]
    if kind in ("leaf", "obj"):
        return LEAF
    if kind == "shell":  # a kind no sample has: its batch is never written straight into a slot (``has_shell``)
        return td
    if kind in ("dict", "namedtuple"):
        return (kind, td[1], tuple(as_sample_treedef(c) for c in td[2]))
    if kind in TYPED:
        return (kind, td[1].cls, (as_sample_treedef(td[2][0]),))
    return (kind, tuple(as_sample_treedef(c) for c in td[1]))


def has_shell(td: Treedef) -> bool:
    """Whether ``td`` holds a container whose emptied copy travels beside its items (``"shell"``)."""
    return td[0] == "shell" or (td[0] not in ("leaf", "obj") and any(map(has_shell, td[-1])))


def leaf_dtypes(td: Treedef) -> list[str | None]:
    """The torch dtype whose bits each array leaf of ``td`` carries (None: the array's own), depth first."""
    return [leaf[2] if len(leaf) > 2 else None for leaf in _leaves(td) if leaf[0] == "leaf"]


def _leaves(td: Treedef) -> Iterator[Treedef]:
    """Every leaf node of ``td`` (array or pickled), depth first."""
    if td[0] in ("leaf", "obj"):
        yield td
    else:
        for c in td[-1]:
            yield from _leaves(c)


def obj_nodes(td: Treedef) -> list[Treedef]:
    """Every leaf of ``td`` that travels pickled, depth first."""
    return [leaf for leaf in _leaves(td) if leaf[0] == "obj"]


def leaf_kinds(td: Treedef) -> list[str]:
    """"leaf" or "obj" for every leaf of ``td``, depth first."""
    return [leaf[0] for leaf in _leaves(td)]


def leaf_paths(treedef: Treedef) -> list[str]:
    """Human-readable paths of the leaves, e.g. ``[0]`` or ``['image']``, for error messages."""
    out: list[str] = []
    _paths(treedef, "", out)
    return out


def _paths(td: Treedef, prefix: str, out: list[str]) -> None:
    kind = td[0]
    if kind in ("leaf", "obj"):
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
    elif kind in (*TYPED, "shell"):
        _paths(td[2][0], prefix, out)


def describe(td: Treedef) -> str:
    """A short picture of a structure for error messages, e.g. ``(array, {'y': array})``."""
    kind = td[0]
    if kind in ("leaf", "obj"):
        return "array"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {describe(c)}" for k, c in zip(td[1], td[2])) + "}"
    if kind in (*TYPED, "shell"):
        return f"{getattr(td[1], 'cls', td[1]).__name__}({describe(td[2][0])})"
    inner = ", ".join(describe(c) for c in td[-1])
    if kind == "list":
        return f"[{inner}]"
    if kind == "namedtuple":
        return f"{td[1].__name__}({inner})"
    return f"({inner})"
