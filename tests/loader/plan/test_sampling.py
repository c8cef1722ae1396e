"""PyTorch's sampling contract: sampler, batch_sampler, batch_size=None, generator, len, fixed attributes."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from toy_data import Squares

from cupy_nwt import DataLoader, system

pytestmark = pytest.mark.usefixtures("worker_type")


class Unsized:
    """A sampler with no ``len``: any iterable of indices will do."""

    def __init__(self, order) -> None:
        self.order = list(order)

    def __iter__(self):
        return iter(self.order)


class Lengths:
    """Sample i is a ragged pair: a vector of i % 3 + 1 values, and i."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i):
        return np.full(i % 3 + 1, i, np.int32), i


def labels(loader) -> list[list[int]]:
    return [b[1].tolist() for b in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_orders_the_samples_with_or_without_a_length(num_workers):
    order = [9, 3, 7, 1, 0, 5, 2]
    with DataLoader(Squares(10), batch_size=3, sampler=order, num_workers=num_workers, device="cpu") as dl:
        assert len(dl) == 3 and dl.sampler is order
        assert labels(dl) == [[9, 3, 7], [1, 0, 5], [2]]
    with DataLoader(Squares(10), batch_size=3, sampler=Unsized(order), drop_last=True, num_workers=num_workers,
                    device="cpu") as dl:
        assert labels(dl) == [[9, 3, 7], [1, 0, 5]]
        with pytest.raises(TypeError):
            len(dl)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_sampler_gives_batches_of_any_size(num_workers):
    batches = [[4], [0, 1, 2], [7, 8, 9, 3, 5], [6, 6]]  # larger than the first: travels pickled, still right
    with DataLoader(Squares(10), batch_sampler=batches, num_workers=num_workers, device="cpu") as dl:
        assert len(dl) == 4 and dl.batch_sampler is batches and dl.batch_size is None
        got = list(dl)
    assert [y.tolist() for _, y in got] == batches
    assert all((x[:, 0, 0, 0] == y).all() for x, y in got)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_hands_out_samples_as_they_are(num_workers):
    with DataLoader(Lengths(), batch_size=None, shuffle=True, seed=3, num_workers=num_workers, device="cpu") as dl:
        assert len(dl) == 12
        got = list(dl)
    assert sorted(i for _, i in got) == list(range(12))
    assert all(type(i) is int and x.tolist() == [i] * (i % 3 + 1) for x, i in got)
    ref = [i for _, i in DataLoader(Lengths(), batch_size=None, shuffle=True, seed=3, device="cpu")]
    assert [i for _, i in got] == ref


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], shuffle=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], sampler=[0]), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(sampler=[0], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_size=None, drop_last=True), "mutually exclusive with drop_last"),
    (dict(seed=1, generator=2), "seed or generator"),
    (dict(multiprocessing_context="fork"), "num_workers > 0"),
    (dict(num_workers=1, multiprocessing_context="teleport"), "valid start method"),
])
def test_pytorch_refusals_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(Squares(4), device="cpu", **kwargs)


@pytest.mark.process_only("start methods are for processes; test_loader_threads checks the refusal")
def test_a_multiprocessing_context_is_a_name_or_a_context():
    with pytest.raises(TypeError, match="valid context object"):
        DataLoader(Squares(4), num_workers=1, multiprocessing_context=object(), device="cpu")
    for ctx in ("spawn", mp.get_context("forkserver")):
        with DataLoader(Squares(8), batch_size=4, num_workers=1, multiprocessing_context=ctx, device="cpu") as dl:
            assert dl.start_method == ("spawn" if ctx == "spawn" else "forkserver")
            assert labels(dl) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_generator_seeds_the_shuffle():
    def order(**kw):
        return np.concatenate(labels(DataLoader(Squares(30), batch_size=30, shuffle=True, device="cpu", **kw)))

    assert np.array_equal(order(generator=5), order(seed=5))
    a, b = order(generator=np.random.default_rng(1)), order(generator=np.random.default_rng(1))
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(30))
    assert not np.array_equal(a, order(generator=np.random.default_rng(2)))


def test_len_is_read_from_the_dataset_when_asked():
    ds = Squares(10)
    dl = DataLoader(ds, batch_size=4, device="cpu")
    assert len(dl) == 3
    ds.n = 17
    assert len(dl) == 5 and len(labels(dl)) == 5


@pytest.mark.parametrize("name", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"])
def test_sampling_attributes_are_fixed_after_construction(name):
    dl = DataLoader(Squares(4), device="cpu")
    with pytest.raises(ValueError, match=f"{name} attribute should not be set after DataLoader is initialized"):
        setattr(dl, name, None)
    dl.timeout = 3  # others may change, as in PyTorch


def test_pytorch_defaults_and_type_hints():
    dl: DataLoader[tuple[np.ndarray, np.ndarray]] = DataLoader(Squares(3), device="cpu")
    assert DataLoader[int] is not None and dl.batch_size == 1 and len(dl) == 3
    x, y = next(iter(dl))
    assert x.shape == (1, 4, 4, 3) and y.tolist() == [0]
    assert dl.timeout == 0 and dl.multiprocessing_context is None and not dl.drop_last  # 0: no limit, as torch reads it


def test_more_workers_than_cpus_warns(monkeypatch):
    monkeypatch.setattr(system, "usable_cpus", lambda: 1)
    with pytest.warns(UserWarning, match="2 worker processes will share the 1 CPUs"):
        DataLoader(Squares(4), num_workers=2, worker_type="process", device="cpu")
    with pytest.warns(UserWarning, match="2 worker threads will share the 1 CPUs") as seen:
        DataLoader(Squares(4), num_workers=2, worker_type="thread", device="cpu")
    assert "worker processes will share" not in str(seen[0].message)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DataLoader(Squares(4), num_workers=1, device="cpu")


def test_the_samplers_list_the_epoch_the_loader_runs_next():
    """``loader.batch_sampler`` and ``loader.sampler`` read back the next epoch's batches and order,
    the ones iterating then yields, shuffled, after ``set_epoch`` too."""
    dl = DataLoader(Squares(10), batch_size=4, shuffle=True, seed=3, device="cpu")
    for epoch in (0, 5):
        dl.set_epoch(epoch)
        batches, order = list(dl.batch_sampler), list(dl.sampler)
        assert len(dl.batch_sampler) == 3 and len(dl.sampler) == 10 and sum(batches, []) == order
        assert [y.tolist() for _, y in dl] == batches  # Squares' label is its index
    assert list(dl.batch_sampler) != batches  # epoch 6 now: another order
