"""Records as columns: a list of dicts that forked workers read without copying it.

A list of 300,000 Python dicts is 300,000 objects, each with its values as objects of their own.
Forked workers share those pages copy-on-write, but merely reading a record writes its reference
counts, so every page a worker touches is copied: over a few shuffled epochs each worker ends up
with a private copy of most of the dataset (118 MB per worker measured on a list of dicts). PyTorch's
DataLoader does the same, to the MB.

:func:`pack_records` turns the list into a few NumPy arrays per key: numbers as typed columns,
``str`` and ``bytes`` as offsets into one byte buffer, flat lists of numbers and NumPy arrays as
offsets into one flat array. A worker reading a record touches only array data, never an object
header per record, so the pages stay shared. ``__getitem__`` rebuilds a record equal to the
original (same keys, values and types: Python ``int``/``float``/``bool``, ``str``, ``bytes``,
``list``/``tuple``, arrays as fresh copies, ``None`` where it was None). Values of any other shape
(nested lists, dicts, NumPy scalars, a key whose values mix types) are kept pickled, one buffer per
key: still shared, decoded on each read. Pickling the packed dataset (spawn and forkserver
workers) sends the arrays as raw buffers, without one object per record.
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, OutOfRangeError

_NUMBER = {bool: np.bool_, int: np.int64, float: np.float64}
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def _offsets(lengths: Iterable[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.fromiter(lengths, dtype=np.int64))]).astype(np.int64)


def _mask(flags: Sequence[bool]) -> np.ndarray | None:
    """A boolean array of ``flags``, or None when no flag is set (the common case costs nothing)."""
    return np.array(flags, dtype=np.bool_) if any(flags) else None


class _Column:
    """One key's values, rebuilt one record at a time from arrays only."""

    kind = ""

    def get(self, i: int) -> Any:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))


class _Numbers(_Column):
    def __init__(self, py: type, values: Sequence[Any]) -> None:
        self.kind = py.__name__
        self.py = py
        self.values: np.ndarray = np.array(values, dtype=_NUMBER[py])

    def get(self, i: int) -> Any:
        return self.py(self.values[i])


class _Text(_Column):
    """``str`` (UTF-8) or ``bytes``: one buffer, record i at ``buf[off[i]:off[i + 1]]``."""

    def __init__(self, py: type, values: Sequence[Any]) -> None:
        self.kind = py.__name__
        raw = [v.encode("utf-8", "surrogatepass") for v in values] if py is str else list(values)
        self.off = _offsets(len(b) for b in raw)
        self.buf = np.frombuffer(b"".join(raw), dtype=np.uint8).copy()

    def get(self, i: int) -> Any:
        raw = self.buf[self.off[i]:self.off[i + 1]].tobytes()
        return raw.decode("utf-8", "surrogatepass") if self.kind == "str" else raw


class _Sequences(_Column):
    """Flat lists (or tuples) whose items are all of one number type."""

    def __init__(self, container: type, item: type, values: Sequence[Sequence[Any]]) -> None:
        self.kind = f"{container.__name__}[{item.__name__}]"
        self.tuple = container is tuple
        self.off = _offsets(len(v) for v in values)
        self.flat: np.ndarray = np.array([x for v in values for x in v], dtype=_NUMBER[item])

    def get(self, i: int) -> Any:
        items = self.flat[self.off[i]:self.off[i + 1]].tolist()  # tolist gives Python int / float / bool
        return tuple(items) if self.tuple else items


class _Arrays(_Column):
    """NumPy arrays of one dtype and number of dimensions; each read returns a copy."""

    def __init__(self, values: Sequence[np.ndarray]) -> None:
        self.kind = f"ndarray[{values[0].dtype}]"
        self.off = _offsets(v.size for v in values)
        self.shapes = np.array([v.shape for v in values], dtype=np.int64).reshape(len(values), values[0].ndim)
        self.flat = np.concatenate([v.reshape(-1) for v in values]) if values else np.empty(0)

    def get(self, i: int) -> Any:
        return self.flat[self.off[i]:self.off[i + 1]].reshape(tuple(self.shapes[i])).copy()


class _Pickled(_Text):
    """Anything else, pickled per record into one shared buffer."""

    def __init__(self, values: Sequence[Any]) -> None:
        super().__init__(bytes, [pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL) for v in values])
        self.kind = "pickled"

    def get(self, i: int) -> Any:
        return pickle.loads(self.buf[self.off[i]:self.off[i + 1]].tobytes())


def _column(values: Sequence[Any]) -> _Column:
    """The most compact column that gives every value back with its type (None: filled, masked)."""
    present = [v for v in values if v is not None]
    types = {type(v) for v in present}
    if len(types) == 1:
        (py,) = types
        if py in _NUMBER and (py is not int or all(_INT64[0] <= v <= _INT64[1] for v in present)):
            return _Numbers(py, [py() if v is None else v for v in values])
        if py in (str, bytes):
            return _Text(py, [py() if v is None else v for v in values])
        if py in (list, tuple):
            items = {type(x) for v in present for x in v}
            if not items or (len(items) == 1 and next(iter(items)) in _NUMBER and
                             (items != {int} or all(_INT64[0] <= x <= _INT64[1] for v in present for x in v))):
                item = next(iter(items)) if items else int
                return _Sequences(py, item, [() if v is None else v for v in values])
        if py is np.ndarray and present[0].dtype != object and len(
                {(v.dtype, v.ndim) for v in present}) == 1:
            blank = np.zeros((0,) * present[0].ndim, dtype=present[0].dtype)
            return _Arrays([blank if v is None else v for v in values])
    return _Pickled(values)


class PackedRecords:
    """A map-style dataset of records kept as NumPy columns (see the module doc); from :func:`pack_records`."""

    def __init__(self, n: int, keys: tuple[str, ...], columns: dict[str, _Column],
                 nones: dict[str, np.ndarray], missing: dict[str, np.ndarray]) -> None:
        self._n, self.keys, self._columns, self._nones, self._missing = n, keys, columns, nones, missing

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise OutOfRangeError(f"record {index} out of range for {self._n} records")
        out: dict[str, Any] = {}
        for key in self.keys:
            missing = self._missing.get(key)
            if missing is not None and missing[i]:
                continue
            nones = self._nones.get(key)
            out[key] = None if nones is not None and nones[i] else self._columns[key].get(i)
        return out

    @property
    def kinds(self) -> dict[str, str]:
        """How each key is stored: ``int``, ``str``, ``list[float]``, ``ndarray[uint8]``, ``pickled``, ..."""
        return {k: c.kind for k, c in self._columns.items()}

    @property
    def nbytes(self) -> int:
        """Bytes held in arrays: what workers share."""
        masks = [*self._nones.values(), *self._missing.values()]
        return sum(c.nbytes for c in self._columns.values()) + sum(m.nbytes for m in masks)

    def __repr__(self) -> str:
        return f"PackedRecords({self._n} records, {len(self.keys)} keys, {self.nbytes:,} bytes)"


def pack_records(records: Sequence[Mapping[str, Any]]) -> PackedRecords:
    """Pack a list of records (mappings of str keys) into columns that forked workers share.

    Keys are taken in first-seen order; a record lacking a key gives a record without it.

    Args:
        records: mappings of str keys; values of one key become one NumPy column.
    """
    records = list(records)
    keys: dict[str, None] = {}
    for r in records:
        if not isinstance(r, Mapping):
            raise ArgumentTypeError(f"records must be mappings (dicts), got {type(r).__name__}")
        keys.update(dict.fromkeys(r))
    columns: dict[str, _Column] = {}
    nones: dict[str, np.ndarray] = {}
    missing: dict[str, np.ndarray] = {}
    absent = object()
    for key in keys:
        raw = [r.get(key, absent) for r in records]
        gone = _mask([v is absent for v in raw])
        values = [None if v is absent else v for v in raw]
        none = _mask([v is None and was is not absent for v, was in zip(values, raw)])
        columns[key] = _column(values)
        if gone is not None:
            missing[key] = gone
        if none is not None:
            nones[key] = none
    return PackedRecords(len(records), tuple(keys), columns, nones, missing)
