"""Iterable-style datasets: each worker reads its own replica, batches come round-robin, through the ring."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from cupy_nwt import DataLoader, IterableDataset, WorkerError, get_worker_info
from cupy_nwt.loader.ring.ring import live_segments

pytestmark = pytest.mark.usefixtures("worker_type")


class Stream(IterableDataset):
    """Items 0..n-1 as (4-float image, label); with ``shard``, worker w of W reads items w, w+W, ..."""

    def __init__(self, n: int, shard: bool = True, sized: bool = False) -> None:
        self.n, self.shard, self.sized = n, shard, sized

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if self.shard and info is not None else (0, 1)
        for i in range(start, self.n, step):
            yield np.full(4, i, np.float32), i

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("this stream has no length")
        return self.n


class Plain:
    """Duck-typed: ``__iter__`` and no ``__getitem__`` is iterable-style too."""

    def __iter__(self):
        return iter(range(5))


class Uneven(IterableDataset):
    """Worker 0 has 7 items, the others 2: the epoch goes on with worker 0 after the others end."""

    def __iter__(self):
        info = get_worker_info()
        w = 0 if info is None else info.id
        yield from (w * 100 + k for k in range(7 if w == 0 else 2))


class WhoAmI(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        assert info is not None and info.dataset is self  # the worker's own copy, the one iterating
        yield {"id": info.id, "of": info.num_workers, "rank": info.rank, "world": info.world_size,
               "seed": info.seed, "pid": os.getpid(), "thread": threading.get_ident()}


class FailsOnce(IterableDataset):
    """An iterator (not a generator) that raises on item 3 and goes on after it."""

    def __iter__(self):
        return _Items()


class _Items:
    def __init__(self) -> None:
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        i, self.i = self.i, self.i + 1
        if i == 3:
            raise KeyError(f"item {i} is missing")
        if i >= 8:
            raise StopIteration
        return i


class NoIter(IterableDataset):
    pass


def labels(batches) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_worker_reads_its_shard_and_batches_alternate_round_robin(num_workers):
    with DataLoader(Stream(20), batch_size=3, num_workers=num_workers, device="cpu") as dl:
        got = labels(dl)
    if num_workers == 0:
        assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14], [15, 16, 17], [18, 19]]
    else:  # worker 0 reads 0, 2, 4, ..; worker 1 reads 1, 3, ..; batch b comes from worker b % 2
        assert got == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 14, 16], [13, 15, 17], [18], [19]]


def test_an_epoch_ends_only_when_every_worker_is_exhausted():
    with DataLoader(Uneven(), batch_size=2, num_workers=3, device="cpu") as dl:
        got = [b.tolist() for b in dl]
    assert got == [[0, 1], [100, 101], [200, 201], [2, 3], [4, 5], [6]]


def test_unsharded_replicas_each_yield_the_whole_stream_as_in_pytorch():
    with DataLoader(Stream(6, shard=False), batch_size=4, num_workers=2, device="cpu") as dl:
        flat = sorted(np.concatenate(labels(dl)).tolist())
    assert flat == sorted(list(range(6)) * 2)


@pytest.mark.process_only("counts shared rings; a thread ring is this process's anonymous memory")
def test_stream_batches_travel_through_the_ring_after_the_first():
    before = live_segments(os.getpid())
    with DataLoader(Stream(400), batch_size=8, num_workers=2, device="cpu") as dl:
        it = iter(dl)
        first = [next(it) for _ in range(3)]
        assert len(live_segments(os.getpid()) - before) == 1
        assert dl.layout is not None and [f.shape for f in dl.layout.fields] == [(4,), ()]
        rest = list(it)
    flat = np.concatenate([b[1] for b in first + rest])
    assert sorted(flat.tolist()) == list(range(400))
    assert all((b[0][:, 0] == b[1]).all() for b in first + rest)
    assert live_segments(os.getpid()) == before


def test_worker_info_says_who_each_worker_is_and_is_none_in_the_main_process():
    assert get_worker_info() is None
    with DataLoader(WhoAmI(), batch_size=None, num_workers=2, device="cpu", rank=1, world_size=3) as dl:
        infos = list(dl)
    assert sorted(i["id"] for i in infos) == [0, 1]
    assert {(i["of"], i["rank"], i["world"]) for i in infos} == {(2, 1, 3)}
    assert len({i["seed"] for i in infos}) == 2
    assert (os.getpid(), threading.get_ident()) not in {(i["pid"], i["thread"]) for i in infos}


def test_batch_size_none_drop_last_and_duck_typed_streams():
    with DataLoader(Plain(), batch_size=None, num_workers=2, device="cpu") as dl:
        assert sorted(dl) == sorted(list(range(5)) * 2)  # plain ints, unbatched, one stream per worker
    assert labels(DataLoader(Stream(7), batch_size=3, drop_last=True, device="cpu")) == [[0, 1, 2], [3, 4, 5]]
    with DataLoader(Stream(10), batch_size=3, drop_last=True, num_workers=2, device="cpu") as dl:
        assert labels(dl) == [[0, 2, 4], [1, 3, 5]]  # each worker drops its own short last batch


def test_samplers_and_shuffle_are_refused_and_len_needs_a_sized_stream():
    for kw in (dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0, 1]])):
        with pytest.raises(ValueError, match="IterableDataset: expected unspecified"):
            DataLoader(Stream(4), device="cpu", **kw)
    with pytest.raises(TypeError):
        len(DataLoader(Stream(4), batch_size=2, device="cpu"))
    assert len(DataLoader(Stream(7, sized=True), batch_size=2, device="cpu")) == 4
    assert len(DataLoader(Stream(7, sized=True), batch_size=2, drop_last=True, device="cpu")) == 3
    assert len(DataLoader(Stream(7, sized=True), batch_size=None, device="cpu")) == 7


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_error_in_the_stream_names_its_type_and_iteration_goes_on(num_workers):
    with DataLoader(FailsOnce(), batch_size=None, num_workers=num_workers, device="cpu") as dl:
        it = iter(dl)
        got = [next(it) for _ in range(3)]
        with pytest.raises(WorkerError, match=r"failed on batch 3.*KeyError.*item 3 is missing") as ei:
            next(it)
        assert ei.value.exc_type == "KeyError" and "__next__" in ei.value.traceback_text
        got += list(it)
    assert got == [0, 1, 2, 4, 5, 6, 7]


def test_persistent_workers_start_a_fresh_stream_each_epoch():
    with DataLoader(Stream(9), batch_size=4, num_workers=2, persistent_workers=True, device="cpu") as dl:
        one, two = labels(dl), labels(dl)
        assert one == two == [[0, 2, 4, 6], [1, 3, 5, 7], [8]]


def test_a_stream_without_iter_fails_in_the_worker_with_the_reason():
    with DataLoader(NoIter(), num_workers=1, device="cpu") as dl:
        with pytest.raises(WorkerError, match="NotImplementedError.*must define __iter__"):
            list(dl)
