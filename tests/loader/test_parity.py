"""The same cases on cupy_nwt's DataLoader and, where torch is installed, on PyTorch's: they must agree.

Each case runs once per ``backend``; outputs are compared in NumPy, with tuples and lists treated
alike (PyTorch's default_collate turns a tuple of fields into a list; cupy_nwt keeps the tuple).
The expected values are written out, so a case that passes on both backends pins the same answer.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import namedtuple

import numpy as np
import pytest

import cupy_nwt

pytestmark = pytest.mark.usefixtures("worker_type")

try:
    import torch
    import torch.utils.data as tud
except ImportError:  # the cupy_nwt cases still run
    torch = None
    tud = None

Point = namedtuple("Point", "x y")
_StreamBase = tud.IterableDataset if tud is not None else object


def worker_info():
    """Whichever loader runs us: its worker info, or None in the main process."""
    info = cupy_nwt.get_worker_info()
    if info is None and tud is not None:
        info = tud.get_worker_info()
    return info


class Squares:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full(3, i, np.int64), i


class Nested(Squares):
    def __getitem__(self, i: int):
        return {"pair": (i, i / 2), "p": Point(np.full(2, i, np.float32), f"s{i}"), "raw": bytes([i]), "ok": i % 2 == 0}


class FailsAt(Squares):
    def __getitem__(self, i: int):
        if i == 5:
            raise KeyError(f"no sample {i}")
        return super().__getitem__(i)


class Stream(_StreamBase):  # type: ignore[misc, valid-type]
    """Items 0..n-1, worker w of W reading items w, w+W, ...: torch needs its own base class, which
    cupy_nwt takes as iterable-style too (as it takes any object with ``__iter__`` and no ``__getitem__``)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(start, self.n, step))


class Unsized:
    def __init__(self, order) -> None:
        self.order = order

    def __iter__(self):
        return iter(self.order)


def describe(samples):
    return {"count": len(samples), "first": samples[0][1]}


BACKENDS = ["cupy_nwt", pytest.param("torch", marks=pytest.mark.skipif(torch is None, reason="torch is not installed"))]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """A DataLoader factory: cupy_nwt's on the CPU, or torch's."""
    if request.param == "cupy_nwt":
        return lambda dataset, **kw: cupy_nwt.DataLoader(dataset, device="cpu", **kw)
    return tud.DataLoader


def np_tree(x):
    """Tensors to arrays, tuples to lists (namedtuples kept), recursively."""
    if torch is not None and isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(np_tree(v) for v in x))
    if isinstance(x, (list, tuple)):
        return [np_tree(v) for v in x]
    if isinstance(x, dict):
        return {k: np_tree(v) for k, v in x.items()}
    return x


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if isinstance(a, tuple):
        return type(a) is type(b) and all(same(u, v) for u, v in zip(a, b))
    return type(a) is type(b) and a == b


def labels(loader) -> list[list[int]]:
    return [np_tree(b)[1].tolist() for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_map_style_batches_and_drop_last(backend, num_workers):
    assert labels(backend(Squares(7), batch_size=3, num_workers=num_workers)) == [[0, 1, 2], [3, 4, 5], [6]]
    loader = backend(Squares(7), batch_size=3, drop_last=True, num_workers=num_workers)
    assert len(loader) == 2 and labels(loader) == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_sharded_by_worker_info_comes_round_robin(backend, num_workers):
    got = [np_tree(b).tolist() for b in backend(Stream(11), batch_size=2, num_workers=num_workers)]
    if num_workers == 0:
        assert got == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10]]
    else:
        assert got == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9]]
    assert [int(np_tree(x)) for x in backend(Stream(5), batch_size=None, num_workers=num_workers)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samplers_and_batch_samplers(backend, num_workers):
    assert labels(backend(Squares(10), batch_size=2, sampler=[7, 1, 4, 4, 0], num_workers=num_workers)) == \
        [[7, 1], [4, 4], [0]]
    assert labels(backend(Squares(10), batch_size=2, sampler=Unsized([3, 2, 1]), num_workers=num_workers)) == \
        [[3, 2], [1]]
    batches = [[9], [1, 2, 3], [0, 0]]
    loader = backend(Squares(10), batch_sampler=batches, num_workers=num_workers)
    assert len(loader) == 3 and labels(loader) == batches


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_gives_samples_unbatched(backend, num_workers):
    got = [np_tree(s) for s in backend(Squares(3), batch_size=None, num_workers=num_workers)]
    assert all(same(x, np.full(3, i, np.int64)) for i, (x, _) in enumerate(got))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_on_nested_samples(backend, num_workers):
    b = np_tree(next(iter(backend(Nested(4), batch_size=3, num_workers=num_workers))))
    want = {"pair": [np.array([0, 1, 2]), np.array([0.0, 0.5, 1.0])],
            "p": Point(np.array([[0, 0], [1, 1], [2, 2]], np.float32), ["s0", "s1", "s2"]),
            "raw": [b"\x00", b"\x01", b"\x02"], "ok": np.array([True, False, True])}
    assert same(b, want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_custom_collate_may_return_any_object(backend, num_workers):
    got = list(backend(Squares(5), batch_size=2, collate_fn=describe, num_workers=num_workers))
    assert got == [{"count": 2, "first": 0}, {"count": 2, "first": 2}, {"count": 1, "first": 4}]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_names_its_type_and_iteration_goes_on(backend, num_workers):
    it = iter(backend(FailsAt(8), batch_size=2, num_workers=num_workers))
    assert [np_tree(next(it))[1].tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(Exception) as ei:
        next(it)
    assert "KeyError" in type(ei.value).__name__ + str(ei.value) and "no sample 5" in str(ei.value)
    assert [np_tree(b)[1].tolist() for b in it] == [[6, 7]]


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_an_empty_batch_from_a_batch_sampler_is_an_index_error_at_any_worker_count(backend, num_workers):
    """torch's ``default_collate`` indexes the first sample: an empty batch is an ``IndexError`` in its turn."""
    it = iter(backend(Squares(5), batch_sampler=[[0], [], [1]], num_workers=num_workers))
    assert np_tree(next(it))[1].tolist() == [0]
    with pytest.raises(IndexError):
        next(it)
    assert np_tree(next(it))[1].tolist() == [1]
    assert next(it, None) is None  # the epoch ends: torch's workers shut down now, not in a later test's gc (20 s)


def test_len_rules(backend):
    assert len(backend(Squares(10), batch_size=4)) == 3
    assert len(backend(Squares(10), batch_size=None)) == 10
    assert len(backend(Squares(10), batch_size=4, sampler=[1, 2, 3, 4, 5])) == 2
    with pytest.raises(TypeError):
        len(backend(Stream(4), batch_size=2))
    with pytest.raises(TypeError):
        len(backend(Squares(10), batch_size=2, sampler=Unsized([1, 2])))


@pytest.mark.parametrize("kwargs", [
    dict(batch_sampler=[[0]], batch_size=2), dict(batch_sampler=[[0]], shuffle=True),
    dict(batch_sampler=[[0]], sampler=[0]), dict(batch_sampler=[[0]], drop_last=True),
    dict(sampler=[0], shuffle=True), dict(batch_size=None, drop_last=True),
    dict(multiprocessing_context="fork"), dict(num_workers=1, multiprocessing_context="no-such-method"),
], ids=lambda kw: ",".join(kw))
def test_refusals_are_value_errors(backend, kwargs):
    with pytest.raises(ValueError):
        backend(Squares(4), **kwargs)


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])], ids=str)
def test_an_iterable_refuses_samplers_and_shuffle(backend, kwargs):
    with pytest.raises(ValueError):
        backend(Stream(4), **kwargs)


@pytest.mark.process_only("start methods are for processes")
def test_multiprocessing_context_takes_a_name_or_a_context(backend):
    with pytest.raises(TypeError):
        backend(Squares(4), num_workers=1, multiprocessing_context=42)
    for ctx in ("fork", mp.get_context("fork")):  # fork: spawn would import torch anew in each worker
        assert labels(backend(Squares(4), batch_size=2, num_workers=1, multiprocessing_context=ctx)) == [[0, 1], [2, 3]]


def test_fixed_attributes_and_subscript(backend):
    loader = backend(Squares(4))
    for name in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"):
        with pytest.raises(ValueError):
            setattr(loader, name, None)
    assert type(loader)[int] is not None


def test_several_live_iterators_each_get_the_whole_epoch(backend):
    loader = backend(Squares(6), batch_size=2, num_workers=2)
    a, b = iter(loader), iter(loader)
    first = np_tree(next(a))[1].tolist()
    assert [np_tree(x)[1].tolist() for x in b] == [[0, 1], [2, 3], [4, 5]]
    assert [first] + [np_tree(x)[1].tolist() for x in a] == [[0, 1], [2, 3], [4, 5]]


def test_worker_options_without_workers_are_the_one_relaxed_rule(backend):
    """PyTorch refuses ``prefetch_factor`` and ``persistent_workers=True`` with ``num_workers=0``;
    cupy_nwt accepts them (they do nothing there), so a sweep over worker counts including 0 needs no
    special case. docs/loader.md says so; this pins both sides."""
    is_torch = tud is not None and backend is tud.DataLoader
    for kw in ({"prefetch_factor": 4}, {"persistent_workers": True}):
        if is_torch:
            with pytest.raises(ValueError, match="prefetch_factor|persistent_workers"):
                backend(Squares(4), batch_size=2, num_workers=0, **kw)
        else:
            labels = [np.asarray(b[1]).tolist() for b in np_tree(list(backend(Squares(4), batch_size=2, num_workers=0, **kw)))]
            assert labels == [[0, 1], [2, 3]]
