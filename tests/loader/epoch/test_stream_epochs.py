"""The loader's epoch reaches every worker's copy of an iterable dataset that has ``set_epoch``.

``ShardedTarStream`` (and WebDataset's deterministic shuffle, and any stream seeded by the epoch)
reshuffles per epoch only if its copy in each worker learns the epoch. Persistent workers keep
their copies across epochs, so a ``set_epoch`` in the main process cannot reach them: the loader
calls ``set_epoch`` itself, in the main process and then in each worker, at the
start of every epoch. Epoch 2 then differs from epoch 1, deterministically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.data.datasets import write_tar_shard
from cupy_nwt.data.streaming import ShardedTarStream

SIZES = [6, 7, 8, 9]
N = sum(SIZES)
LAYOUTS = [pytest.param({"num_workers": 0}, id="inline"),
           pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent-processes"),
           pytest.param({"num_workers": 2}, id="processes"),
           pytest.param({"num_workers": 2, "persistent_workers": True, "worker_type": "thread"},
                        id="persistent-threads"),
           pytest.param({"num_workers": 1}, id="one-process"),
           pytest.param({"num_workers": 1, "persistent_workers": True}, id="one-persistent-process")]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder, paths, start = tmp_path_factory.mktemp("shards"), [], 0
    for k, n in enumerate(SIZES):
        ids = np.arange(start, start + n)
        img = np.zeros((n, 2, 2, 3), np.uint8)
        img[:, 0, 0, 0] = ids
        paths.append(write_tar_shard(folder / f"shard-{k}.tar", img, ids % 3))
        start += n
    return paths


@pytest.fixture(autouse=True)
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)


def epochs(shards: list[Path], layout: dict, count: int = 3) -> list[list[int]]:
    stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8)
    with cupy_nwt.DataLoader(stream, batch_size=4, **layout) as loader:
        return [[int(x) for img, _ in loader for x in img[:, 0, 0, 0]] for _ in range(count)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_epoch_reshuffles_deterministically(shards: list[Path], layout: dict) -> None:
    runs = epochs(shards, layout)
    for order in runs:
        assert sorted(order) == list(range(N))  # every sample once per epoch
    assert runs[0] != runs[1] != runs[2]
    assert epochs(shards, layout) == runs  # the same seed gives the same epochs


@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_set_epoch_on_the_loader_chooses_the_streams_epoch(shards: list[Path], layout: dict) -> None:
    runs = epochs(shards, layout)
    stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8)
    with cupy_nwt.DataLoader(stream, batch_size=4, **layout) as loader:
        loader.set_epoch(2)
        assert [int(x) for img, _ in loader for x in img[:, 0, 0, 0]] == runs[2]


class EpochTagged(cupy_nwt.IterableDataset):
    """A stream that says which epoch its copy was told, per worker."""

    def __init__(self) -> None:
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        info = cupy_nwt.get_worker_info()
        w = 0 if info is None else info.id
        return iter([(self.epoch, w)] * 3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_worker_copy_is_told_the_epoch(layout: dict) -> None:
    with cupy_nwt.DataLoader(EpochTagged(), batch_size=None, **layout) as loader:
        for epoch in range(3):
            told = {tuple(sample) for sample in loader}
            workers = max(1, layout["num_workers"])
            assert told == {(epoch, w) for w in range(workers)}


def test_a_resumed_stream_keeps_the_saved_epoch(shards: list[Path]) -> None:
    layout = {"num_workers": 2, "persistent_workers": True}
    runs = epochs(shards, layout, 2)
    stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8)
    with cupy_nwt.DataLoader(stream, batch_size=4, **layout) as loader:
        list(loader)
        got = []
        for i, (img, _) in enumerate(loader):
            got += [int(x) for x in img[:, 0, 0, 0]]
            if i == 2:
                break
        state = loader.state_dict()
    assert state["epoch"] == 1
    with cupy_nwt.DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, **layout) as again:
        again.load_state_dict(state)
        rest = [int(x) for img, _ in again for x in img[:, 0, 0, 0]]
    assert sorted(got + rest) == list(range(N))
    assert got == runs[1][: len(got)]


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[1], LAYOUTS[3], LAYOUTS[5]])
def test_a_state_saved_between_epochs_resumes_the_next_epoch_whole(shards: list[Path], layout: dict) -> None:
    """The readers' states saved after an epoch ran out are those of the epoch before: the resumed loader gives
    them back and then tells the new epoch, as the uninterrupted run did, so the next epoch is read whole."""
    runs = epochs(shards, layout, 2)
    with cupy_nwt.DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, **layout) as loader:
        list(loader)
        state = loader.state_dict()
    with cupy_nwt.DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, **layout) as again:
        again.load_state_dict(state)
        assert [int(x) for img, _ in again for x in img[:, 0, 0, 0]] == runs[1]


@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_a_state_saved_after_a_break_and_set_epoch_resumes_the_chosen_epoch(shards: list[Path], layout: dict) -> None:
    """Left early, then ``loader.set_epoch(2)``: the state is epoch 2's start, and its readers' states are of
    the epoch left; resumed, epoch 2 is read whole, not the rest of the epoch left."""
    runs = epochs(shards, layout)
    with cupy_nwt.DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, **layout) as loader:
        for k, _ in enumerate(loader):
            if k == 2:
                break
        loader.set_epoch(2)
        state = loader.state_dict()
    with cupy_nwt.DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, **layout) as again:
        again.load_state_dict(state)
        assert [int(x) for img, _ in again for x in img[:, 0, 0, 0]] == runs[2]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_loop_that_sets_the_stream_s_epoch_itself_gets_that_epoch(shards: list[Path], layout: dict) -> None:
    """Hugging Face's and WebDataset's docs have the loop call ``dataset.set_epoch(epoch)``; a run resumed at
    epoch 2 that way got epoch 0's order and then epoch 1's: the loader told the copies its own count."""
    runs = epochs(shards, layout)
    stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8)
    with cupy_nwt.DataLoader(stream, batch_size=4, **layout) as loader:
        got = []
        for epoch in (2, 1):
            stream.set_epoch(epoch)
            got.append([int(x) for img, _ in loader for x in img[:, 0, 0, 0]])
        assert got == [runs[2], runs[1]]
        assert [int(x) for img, _ in loader for x in img[:, 0, 0, 0]] == runs[2]  # not told again: the count goes on


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stream_whose_epoch_was_set_before_the_loader_was_made_starts_there(layout: dict) -> None:
    stream = EpochTagged()
    stream.set_epoch(5)
    with cupy_nwt.DataLoader(stream, batch_size=None, **layout) as loader:
        assert {epoch for epoch, _ in map(tuple, loader)} == {5}
        assert {epoch for epoch, _ in map(tuple, loader)} == {6}


class SharedEpoch(cupy_nwt.IterableDataset):
    """A stream whose epoch lives in memory its forked workers share, so that a ``set_epoch`` in the main
    process reaches persistent workers (Hugging Face's ``IterableDataset`` keeps its epoch so)."""

    def __init__(self) -> None:
        import multiprocessing as mp

        self._epoch = mp.get_context("fork").Value("i", 0)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value += epoch - self._epoch.value  # Hugging Face's read-modify-write

    def __iter__(self):
        info = cupy_nwt.get_worker_info()
        return iter([(self.epoch, 0 if info is None else info.id)] * 3)


@pytest.mark.parametrize("layout", [p for p in LAYOUTS if "thread" not in str(p.id)])  # threads copy it: no Value
def test_a_stream_whose_epoch_the_workers_share_runs_each_epoch_once(layout: dict) -> None:
    """The workers' ``set_epoch`` wrote the main process's value too, which the next ``iter()`` took for the
    loop's own: epochs ran 0, 1, 1, 2, 2 (and Hugging Face's read-modify-write, raced by several workers,
    gave them different epochs: shards repeated, others lost)."""
    stream = SharedEpoch()
    with cupy_nwt.DataLoader(stream, batch_size=None, **layout) as loader:
        for epoch in range(4):
            assert {tuple(sample) for sample in loader} == {(epoch, w) for w in range(max(1, layout["num_workers"]))}
            assert stream.epoch == epoch
        stream.set_epoch(7)  # the loop's own call still wins
        assert {epoch for epoch, _ in map(tuple, loader)} == {7}


class FailsOnce(EpochTagged):
    """A stream whose ``set_epoch`` fails once, at epoch 2 (a transient error listing its shards)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def set_epoch(self, epoch: int) -> None:
        if epoch == 2 and not self.failed:
            self.failed = True
            raise OSError("could not list the shards")
        super().set_epoch(epoch)


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[2]])  # persistent workers' copies would each fail once
def test_an_epoch_whose_set_epoch_failed_runs_next_and_no_epoch_comes_twice(layout: dict) -> None:
    """With ``num_workers=0`` the iteration after the failure ran epoch 1's data again (the stale epoch the
    stream read back taken for the caller's own), then epoch 2, the loader's count going back; with workers
    epoch 2 was skipped."""
    with cupy_nwt.DataLoader(FailsOnce(), batch_size=None, **layout) as loader:
        seen: list[object] = []
        for _ in range(5):
            try:
                seen.append({epoch for epoch, _ in map(tuple, loader)})
            except OSError:
                seen.append("failed")
        assert seen == [{0}, {1}, "failed", {2}, {3}]
