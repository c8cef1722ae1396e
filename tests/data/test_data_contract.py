"""The dataset contract (``cupy_nwt.data.contract``): the Protocols say what each style provides, and the one
check the loader and the tuner share tells the styles apart and refuses what is neither, in one line."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from cupy_nwt import (
    ArgumentError,
    BatchedMapDataset,
    DataLoader,
    IterableDataset,
    MapDataset,
    StreamDataset,
    tune_num_workers,
)
from cupy_nwt.data import ArrayDataset, PackedRecords, ShardedTarStream, pack_records
from cupy_nwt.data.contract import (
    EpochAware,
    ResumableStream,
    batch_getter,
    dataset_style,
    epoch_setter,
    map_length,
    stream_state_getter,
)


class Plain:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.full(2, i)


class Batched(Plain):
    def __init__(self):
        self.calls = 0

    def __getitems__(self, indices):
        self.calls += 1
        return [np.full(2, i) for i in indices]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(np.arange(5))


class Neither:
    pass


def test_the_protocols_describe_each_style():
    assert isinstance(Plain(), MapDataset) and not isinstance(Plain(), BatchedMapDataset)
    assert isinstance(Batched(), BatchedMapDataset)
    assert isinstance(Stream(), StreamDataset) and not isinstance(Stream(), MapDataset)
    assert isinstance(ArrayDataset(np.zeros((4, 2))), MapDataset)
    assert isinstance(pack_records([{"a": 1}]), PackedRecords) and isinstance(pack_records([{"a": 1}]), MapDataset)
    assert issubclass(ShardedTarStream, StreamDataset) and issubclass(ShardedTarStream, EpochAware)
    assert issubclass(ShardedTarStream, ResumableStream)


def test_one_check_tells_the_styles_apart():
    assert dataset_style(Plain()) == "map"
    assert dataset_style(np.zeros((3, 2))) == "map"
    assert dataset_style(Stream()) == "iterable"
    assert dataset_style(iter([1, 2])) == "iterable"
    with pytest.raises(ArgumentError, match="Neither is neither"):
        dataset_style(Neither())
    with pytest.raises(ValueError, match="map-style"):  # the loader refuses it through the same check
        DataLoader(Neither())


def test_what_the_loader_may_call_is_found_in_one_place():
    b = Batched()
    assert batch_getter(Plain()) is None and batch_getter(b) is not None
    assert epoch_setter(Plain()) is None and stream_state_getter(Plain()) is None
    assert [x.tolist() for x in DataLoader(b, batch_size=3, device="cpu")] == [[[0, 0], [1, 1], [2, 2]],
                                                                              [[3, 3], [4, 4], [5, 5]]]
    assert b.calls == 2  # one __getitems__ per batch, as the contract promises


def test_lengths_the_tuner_needs_come_from_the_same_check():
    assert map_length(Plain(), "tuning") == 6
    with pytest.raises(ArgumentError, match="tuning needs a map-style dataset"):
        map_length(Stream(), "tuning")
    with pytest.raises(ArgumentError, match="needs a map-style dataset"):  # the tuner asks before any trial
        tune_num_workers(Stream(), batch_size=2, max_workers=1, iterations=1, device="cpu", progress=False)


def test_the_contract_objects_cross_to_workers():
    for obj in (Batched(), Stream(), ArrayDataset(np.zeros((4, 2)))):
        assert type(pickle.loads(pickle.dumps(obj))) is type(obj)
