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
workers) sends the arrays as raw buffers, without one object per record; a pickle read back (a worker's
copy, a file) is checked whole, so a cut or edited one, or one of another layout, is one ``DataError``.
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError, DataError, OutOfRangeError

_NUMBER = {bool: np.bool_, int: np.int64, float: np.float64}
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
FORMAT = 1  # the layout of a pickled PackedRecords: its attributes and its columns' arrays


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

    def check(self, n: int) -> str | None:
        """What is wrong with this column as one of ``n`` records (read back from a pickle), or None."""
        return _spans(getattr(self, "off", None), getattr(self, "buf", getattr(self, "flat", None)), n)


def _spans(off: Any, data: Any, n: int) -> str | None:
    """What is wrong with offsets ``off`` into ``data`` for ``n`` records, or None."""
    if not isinstance(off, np.ndarray) or not isinstance(data, np.ndarray) or off.shape != (n + 1,):
        return f"expected {n + 1} offsets and their data"
    if off[0] != 0 or off[-1] != data.size or bool(np.any(np.diff(off) < 0)):
        return f"its offsets do not cut its {data.size} values in order"
    return None


class _Numbers(_Column):
    def __init__(self, py: type, values: Sequence[Any]) -> None:
        self.kind = py.__name__
        self.py = py
        self.values: np.ndarray = np.array(values, dtype=_NUMBER[py])

    def get(self, i: int) -> Any:
        return self.py(self.values[i])

    def check(self, n: int) -> str | None:
        values = getattr(self, "values", None)
        ok = isinstance(values, np.ndarray) and values.shape == (n,) and getattr(self, "py", None) in _NUMBER
        return None if ok else f"expected {n} values of one number type"


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

    def check(self, n: int) -> str | None:
        wrong = super().check(n)
        shapes = getattr(self, "shapes", None)
        if wrong is None and (not isinstance(shapes, np.ndarray) or shapes.ndim != 2 or len(shapes) != n
                              or not np.array_equal(np.prod(shapes, axis=1), np.diff(self.off))):
            wrong = "its shapes do not match its arrays' sizes"
        return wrong


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

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "format": FORMAT}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Read back from a pickle (a spawned worker's copy, or a file): a pickle of another layout, or one whose
        arrays were cut or edited, is one ``DataError`` rather than records read from the wrong bytes."""
        found = state.get("format", FORMAT)  # a pickle without the field has this layout
        if found != FORMAT:
            raise DataError(f"PackedRecords: this pickle has layout {found!r}, this cupy_nwt reads layout {FORMAT}: "
                            "pack the records again with pack_records")
        self.__dict__.update({k: v for k, v in state.items() if k != "format"})
        wrong = _damage(self)
        if wrong is not None:
            raise DataError(f"PackedRecords: the pickle is damaged or of another version ({wrong}): pack the records "
                            "again with pack_records")


def _damage(packed: PackedRecords) -> str | None:
    """What is inconsistent in a ``PackedRecords`` read back from a pickle, or None."""
    n, keys = getattr(packed, "_n", None), getattr(packed, "keys", None)
    columns = getattr(packed, "_columns", None)
    nones, missing = getattr(packed, "_nones", None), getattr(packed, "_missing", None)
    if (not isinstance(n, int) or n < 0 or not isinstance(keys, tuple) or not isinstance(columns, dict)
            or not isinstance(nones, dict) or not isinstance(missing, dict)):
        return "its record count, keys or columns are missing"
    masks = (nones, missing)
    if set(columns) != set(keys):
        return "its columns are not its keys"
    for key in keys:
        wrong = columns[key].check(n) if isinstance(columns[key], _Column) else "not a column"
        if wrong is None and any(key in m and (not isinstance(m[key], np.ndarray) or m[key].shape != (n,)
                                               or m[key].dtype != np.bool_) for m in masks):
            wrong = f"expected a flag for each of its {n} records"
        if wrong is not None:
            return f"key {key!r}: {wrong}"
    return None


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
