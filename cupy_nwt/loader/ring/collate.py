"""Turning a list of samples into a batch: NumPy arrays for numbers, lists (or tuples) for str and bytes.

``default_collate`` follows PyTorch's rules on NumPy: arrays and numbers are stacked into arrays with
a leading row axis, str and bytes are gathered as torch gathers them (a list, or a tuple inside a
sequence, where torch's collate transposes the samples with ``zip``), and dicts, lists, tuples and namedtuples are recursed
and keep their type, as other mappings and sequences do where torch keeps theirs (``containers``). The arrays can be written straight into preallocated memory (a ring slot), so
workers never build a batch twice and never pickle its arrays. The rules are strict on purpose: a
sample whose structure, shape or dtype differs from the first one is an error naming that sample,
never a silent upcast.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from ...errors import ArgumentTypeError, BatchLayoutError, BatchStructureError, BatchTypeError, OutOfRangeError
from .containers import Make, items_only, plain_items
from .frameworks import framework_of, host_view, refuse_uncollatable, to_framework
from .tree import (
    LEAF,
    OBJ,
    TEXT_TUPLE,
    TYPED,
    Treedef,
    as_sample_treedef,
    describe,
    flatten,
    join,
    leaf_dtypes,
    leaf_kinds,
    leaf_of,
    leaf_paths,
    obj_nodes,
    retag,
    without_types,
)

Indices = Sequence[Any] | np.ndarray | None  # the samples' dataset keys, for messages; None: a stream's


# array-likes whose items carry labels (an index, coordinates) that stacking by position would drop
_LABELLED = frozenset({"pandas", "xarray"})


def as_leaf(value: Any) -> tuple[np.ndarray, str | None]:
    """One sample field as an array (Python int -> int64, float -> float64, bool -> bool), and the torch
    dtype its items are the bits of where NumPy lacks it (``frameworks.host_view``; None: its own)."""
    dtype = None
    if isinstance(value, np.ndarray):
        arr = value
    elif isinstance(value, bool):
        arr = np.asarray(value, dtype=np.bool_)
    elif isinstance(value, int):
        arr = np.asarray(value, dtype=np.int64)
    elif isinstance(value, float):
        arr = np.asarray(value, dtype=np.float64)
    elif framework_of(value) == "torch":
        host = host_view(value, "torch")
        if host is None:
            where = ("that requires grad" if value.requires_grad else f"on {value.device}" if value.device.type != "cpu"
                     else f"of {value.dtype} and layout {value.layout}")
            raise ArgumentTypeError(f"a torch tensor {where} cannot be batched in shared memory: detach it or move "
                                    "it to the CPU in the dataset, or pass a collate_fn")
        arr, dtype = host
    elif type(value).__module__.partition(".")[0] in _LABELLED:
        raise BatchTypeError(f"a {type(value).__name__} field is labelled ({type(value).__module__.partition('.')[0]}): "
                             "stacked by position its labels would be dropped and mixed; torch refuses it too. "
                             "Return its values (.to_numpy(), or a dict) from the dataset")
    else:
        arr = np.asarray(value)
    if arr.dtype.kind in "OUSV" or arr.dtype.hasobject:
        raise ArgumentTypeError(f"a {type(value).__name__} field (dtype {arr.dtype}) cannot be batched into arrays")
    return arr, dtype


def _unequal(td: Treedef, first: Treedef) -> str:
    """torch's words for two samples that are sequences of different lengths, which a filter may look for."""
    td, first = without_types(td), without_types(first)
    if td[0] == first[0] and td[0] in ("list", "tuple") and len(td[1]) != len(first[1]):
        return "each element in list of batch should be of equal size: "
    return ""


def _in_order(sample: Any, td: Treedef) -> Any:
    """``sample`` with each dict that holds the keys of its node in ``td`` listing them in that node's order:
    torch's collate looks each key of the first sample up in the others, so their own order does not matter."""
    kind, t = td[0], type(sample)
    if kind == "dict" and t is dict and len(sample) == len(td[1]) and sample.keys() == set(td[1]):
        return {k: _in_order(sample[k], c) for k, c in zip(td[1], td[2])}
    if kind in ("tuple", "list") and t is (tuple if kind == "tuple" else list) and len(sample) == len(td[1]):
        return t(_in_order(x, c) for x, c in zip(sample, td[1]))
    if kind == "namedtuple" and t is td[1] and len(sample) == len(td[2]):
        return t(*(_in_order(x, c) for x, c in zip(sample, td[2])))
    return sample


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, bytes))


def _where(indices: Indices, row: int) -> tuple[str, Any]:
    """How a message names sample ``row`` of a batch, and its dataset key if it has one."""
    if indices is None:
        return f"sample {row} of the batch", None
    index = indices[row]
    if isinstance(index, (int, np.integer)):
        index = int(index)
        return f"sample index {index}", index
    return f"sample index {index!r}", index


def collate_into(samples: Sequence[Any], indices: Indices, treedef: Treedef, out: Sequence[np.ndarray]) -> list[list[Any]]:
    """Write sample ``i`` into row ``i`` of every array field in ``out``; return the str/bytes columns.

    ``treedef`` is the batch's structure (``("obj",)`` where the samples hold str or bytes).
    ``indices`` are the dataset indices of ``samples`` and only serve the error messages. Common
    structures (one flat tuple / list / dict of leaves) take a column-wise fast path that is exactly
    as strict; anything it does not accept is redone sample by sample, which either succeeds or
    names the offending sample.
    """
    if treedef == LEAF and type(samples[0]) is np.ndarray and len(set(map(type, samples))) == 1:
        if _same_arrays(samples, out[0]):  # samples that are plain arrays: the one column, without the walk
            out[0][...] = samples
            return []
        return _collate_rows(samples, indices, treedef, out)
    try:
        objects = _collate_columns(samples, treedef, out)
        if objects is not None:
            return objects
    except (ValueError, TypeError, OverflowError):
        pass
    return _collate_rows(samples, indices, treedef, out)


_SCALAR_DTYPES = {int: np.dtype(np.int64), float: np.dtype(np.float64), bool: np.dtype(np.bool_)}
_dtype, _shape = attrgetter("dtype"), attrgetter("shape")


def _same_arrays(col: Sequence[np.ndarray], dst: np.ndarray) -> bool:
    """Every array of ``col`` has exactly the dtype and shape of a row of ``dst``: then assigning the list
    copies each into its row with no cast and no broadcast (checked in C; ``np.stack`` costs ten times more)."""
    return set(map(_dtype, col)) == {dst.dtype} and set(map(_shape, col)) == {dst.shape[1:]}


def _columns(samples: Sequence[Any], treedef: Treedef) -> list[list[Any]] | None:
    kind = treedef[0]
    if kind in ("leaf", "obj"):
        return [list(samples)]
    if kind in TYPED:  # samples of one container type around a flat dict, list or tuple: their plain items
        cls = treedef[1].cls
        if not all(type(s) is cls for s in samples) or (kind == "typed") != items_only(samples[0]):
            return None
        return _columns([plain_items(s) for s in samples], treedef[2][0])
    if kind not in ("tuple", "list", "dict") or any(c[0] not in ("leaf", "obj") for c in treedef[-1]):
        return None
    k = len(treedef[-1])
    if kind == "dict":
        keys = treedef[1]
        if not all(type(s) is dict and len(s) == k for s in samples) or tuple(samples[0]) != keys:
            return None  # (a batch's keys are in its first sample's order, as torch's collate lists them)
        try:
            return [[s[key] for s in samples] for key in keys]
        except KeyError:
            return None
    typ = tuple if kind == "tuple" else list
    if not all(type(s) is typ and len(s) == k for s in samples):
        return None
    return [list(c) for c in zip(*samples)]


def _collate_columns(samples: Sequence[Any], treedef: Treedef, out: Sequence[np.ndarray]) -> list[list[Any]] | None:
    cols = _columns(samples, treedef)
    if cols is None:
        return None
    dsts: Iterator[np.ndarray] = iter(out)
    tags = iter(leaf_dtypes(treedef))
    objects = []
    for col, kind in zip(cols, leaf_kinds(treedef)):
        if kind == "obj":
            if not all(_is_text(v) for v in col):
                return None
            objects.append(col)
            continue
        dst = next(dsts)
        if next(tags) is not None:  # the bits of a dtype NumPy lacks: an array of their integer dtype is not one
            return None
        t = type(col[0])
        if len(set(map(type, col))) != 1:  # one type in the column (checked in C: it runs per sample)
            return None
        if t is np.ndarray:
            if not _same_arrays(col, dst):
                return None
            dst[...] = col
        elif dst.ndim == 1 and (_SCALAR_DTYPES.get(t) == dst.dtype
                                or (issubclass(t, np.generic) and np.dtype(t) == dst.dtype)):
            dst[:] = col
        elif framework_of(col[0]) == "torch":
            if not _stack_tensors(col, dst):
                return None
        else:
            return None
    return objects


def _stack_tensors(col: list[Any], dst: np.ndarray) -> bool:
    """A torch dataset's tensors stacked straight into ``dst`` by torch, as its own collate stacks them (one call
    for the column). False for anything torch refuses there (another dtype or shape, a GPU tensor, one that
    requires grad, a dtype NumPy lacks): the rows path then takes each sample and names the one at fault."""
    torch = sys.modules["torch"]
    try:
        out = torch.from_numpy(dst)
        if set(map(_dtype, col)) != {out.dtype} or set(map(_shape, col)) != {out.shape[1:]}:
            return False  # torch.stack would cast into ``out``: a sample of another dtype is an error, never cast
        torch.stack(col, out=out)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def _collate_rows(samples: Sequence[Any], indices: Indices, treedef: Treedef, out: Sequence[np.ndarray]) -> list[list[Any]]:
    paths: list[str] | None = None
    sample_td = as_sample_treedef(treedef)
    kinds = leaf_kinds(treedef)
    tagged = leaf_dtypes(treedef)
    objects: list[list[Any]] = [[] for k in kinds if k == "obj"]
    for row, sample in enumerate(samples):
        leaves, td = flatten(sample)
        if td != sample_td and row > 0:
            leaves, td = flatten(_in_order(sample, sample_td))
        if td != sample_td and (row == 0 or without_types(td) != without_types(sample_td)):
            what, index = _where(indices, row)
            raise BatchStructureError(f"{_unequal(td, sample_td)}{what} has the structure {describe(td)}, expected "
                                      f"{describe(sample_td)}", index)
        dsts, cols, tags = iter(out), iter(objects), iter(tagged)
        for j, (leaf, kind) in enumerate(zip(leaves, kinds)):
            if kind == "obj":
                if not _is_text(leaf):
                    paths = paths or leaf_paths(treedef)
                    what, index = _where(indices, row)
                    raise BatchLayoutError(f"{what}, field {paths[j]}: expected str or bytes like the first sample, "
                                           f"got {type(leaf).__name__}", index)
                next(cols).append(leaf)
                continue
            dst, expected = next(dsts), next(tags)
            try:
                arr, dtype = as_leaf(leaf)
            except (TypeError, OverflowError) as exc:
                paths = paths or leaf_paths(treedef)
                what, index = _where(indices, row)
                error = BatchTypeError if isinstance(exc, TypeError) else BatchLayoutError
                raise error(f"{what}, field {paths[j]}: {exc}", index) from None
            if arr.shape != dst.shape[1:] or arr.dtype != dst.dtype or dtype != expected:
                paths = paths or leaf_paths(treedef)
                what, index = _where(indices, row)
                raise BatchLayoutError(
                    f"{what}, field {paths[j]}: expected shape {dst.shape[1:]} dtype {expected or dst.dtype}, "
                    f"got shape {arr.shape} dtype {dtype or arr.dtype}",
                    index,
                )
            dst[row] = arr
    return objects


def batch_structure(sample: Any, index_text: str = "the first sample", index: int | None = None
                    ) -> tuple[Treedef, list[np.ndarray]]:
    """The batch structure ``default_collate`` makes from samples like ``sample``, and its array leaves.

    A sample holding torch tensors (or JAX arrays) makes every array field of the batch one of that
    framework's, numbers included, as torch's ``default_collate`` does (``frameworks``).
    """
    leaves, td = flatten(sample)
    framework = next((f for f in map(framework_of, leaves) if f is not None), None)
    if framework == "torch":
        refuse_uncollatable(leaves, index_text)
    marks: list[Treedef] = []
    firsts = []
    for x in leaves:
        if _is_text(x):
            marks.append(OBJ)
            continue
        try:
            arr, dtype = as_leaf(x)
        except (TypeError, OverflowError) as exc:  # as _collate_rows words a later sample's
            error = BatchTypeError if isinstance(exc, TypeError) else BatchLayoutError
            raise error(f"{index_text}: {exc}", index) from None
        firsts.append(arr)
        marks.append(leaf_of(framework, dtype))
    return _mark(td, sample, iter(marks)), firsts


def _mark(td: Treedef, sample: Any, marks: Iterator[Treedef], in_sequence: bool = False) -> Treedef:
    """The batch's structure from its first sample's: each leaf marked (a str list, a str tuple inside a
    sequence, or an array of its framework and dtype), and each typed container given its recipe
    (``containers.Make``), taken from that sample as torch takes it."""
    kind = td[0]
    if kind == "leaf":
        mark = next(marks)
        return TEXT_TUPLE if in_sequence and mark == OBJ else mark
    if kind == "dict":
        return ("dict", td[1], tuple(_mark(c, sample[k], marks) for k, c in zip(td[1], td[2])))
    if kind == "namedtuple":
        return ("namedtuple", td[1], tuple(_mark(c, x, marks, True) for c, x in zip(td[2], sample)))
    if kind in TYPED:
        return (kind, Make.like(sample), (_mark(td[2][0], plain_items(sample), marks),))
    return (kind, tuple(_mark(c, x, marks, True) for c, x in zip(td[1], sample)))


def default_collate(samples: Sequence[Any], indices: Indices = None) -> Any:
    """A batch from samples, as PyTorch's ``default_collate`` makes it, in NumPy.

    Arrays and Python or NumPy numbers are stacked along a new first axis (int -> int64, float ->
    float64, bool -> bool); str and bytes fields become lists, or tuples inside a tuple, list,
    namedtuple or other sequence (torch's collate gathers them with ``zip``); dicts, lists, tuples and
    namedtuples are recursed and keep their type; other mappings and sequences too, as torch's
    collate keeps them (``containers``). Every sample must have the first one's
    structure, shapes and dtypes: the first that does not is named in a ``BatchLayoutError``
    (by its dataset index when ``indices`` are given, else by its position).

    Args:
        samples: the batch's samples, each shaped like the first.
        indices: their dataset indices, so an error names the sample that differs (else its position).
    """
    return collate(samples, range(len(samples)) if indices is None else indices)


def torch_default_collate(samples: Sequence[Any], indices: Indices = None) -> Any:
    """``default_collate`` as the loader's batches come in a program that uses torch (``output="auto"``): NumPy
    arrays and numbers as tensors, as torch's ``default_collate`` gives them. It is what ``loader.collate_fn``
    reads there, so a ``collate_fn`` wrapping it gets tensors, as one wrapping torch's does.

    Args:
        samples: the batch's samples, each shaped like the first.
        indices: their dataset indices, so an error names the sample that differs (else its position).
    """
    return collate(samples, range(len(samples)) if indices is None else indices, framework="torch")


def collate(samples: Sequence[Any], indices: Indices, framework: str | None = None) -> Any:
    """``default_collate`` for the loader: ``indices=None`` for a stream's samples (no dataset index);
    ``framework="torch"``: the NumPy leaves joined as tensors."""
    if len(samples) == 0:
        raise OutOfRangeError("cannot collate an empty list of samples (an IndexError, as torch's default_collate "
                              "raises for an empty batch)")
    first = samples[0]
    if type(first) is np.ndarray and first.dtype.kind not in "OUSV" and not first.dtype.hasobject:
        batch = np.empty((len(samples), *first.shape), dtype=first.dtype)  # samples that are plain arrays: the
        collate_into(samples, indices, LEAF, [batch])  # structure batch_structure would find, without the walk
        return batch if framework is None else to_framework(batch, framework)
    what, index = _where(indices, 0)
    treedef, firsts = batch_structure(samples[0], what, index)
    out = [np.empty((len(samples), *a.shape), dtype=a.dtype) for a in firsts]
    columns = collate_into(samples, indices, treedef, out)
    objects = [tuple(c) if node == TEXT_TUPLE else c for c, node in zip(columns, obj_nodes(treedef))] if columns else []
    return join(treedef if framework is None else retag(treedef, framework, plain_only=True), out, objects)
