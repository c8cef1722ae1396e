"""Resume of iterable-style datasets: per-worker dataset state saved as of the last delivered batch and
restored before the stream re-opens; the sharded tar stream through the loader; refused layouts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from test_streaming import LAUNCHER_VARS, sample_id, write_shards

from cupy_nwt import get_worker_info
from cupy_nwt.data.streaming import ShardedTarStream
from cupy_nwt.errors import StateError, WorkerError
from cupy_nwt.loader import DataLoader, IterableDataset

pytestmark = pytest.mark.usefixtures("worker_type")  # each test once per kind of worker


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


class Counting(IterableDataset):
    """Worker w of k yields w, w+k, w+2k, ... below n; its state is how far it got (a loaded state is
    where the next ``__iter__`` starts, once; otherwise it starts from the beginning)."""

    def __init__(self, n: int = 40) -> None:
        self.n, self.pos, self.start = n, 0, 0

    def __iter__(self):
        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        self.pos, self.start = self.start, 0
        while self.pos * k + w < self.n:
            i = self.pos * k + w
            self.pos += 1
            yield np.array([i], np.int64)

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.start = sd["pos"]


class Stateless(Counting):
    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]


def run(dl):
    return [b.ravel().tolist() for b in dl]


@pytest.mark.parametrize("ds,nw", [(Counting, 0), (Counting, 1), (Counting, 2), (Stateless, 0), (Stateless, 1),
                                   (Stateless, 2)])
def test_stream_resumes_exactly_where_it_was_delivered(ds, nw):
    full = run(DataLoader(ds(), batch_size=3, num_workers=nw))
    for k in (0, 1, 4, len(full) - 1):
        with DataLoader(ds(), batch_size=3, num_workers=nw, prefetch_factor=4) as dl:
            it = iter(dl)
            got = [next(it).ravel().tolist() for _ in range(k)]
            state = json.loads(json.dumps(dl.state_dict()))
            it.close()
        with DataLoader(ds(), batch_size=3, num_workers=nw, prefetch_factor=1) as again:
            again.load_state_dict(state)
            assert got + run(again) == full, k
            assert run(again) == full  # the next epoch starts afresh


class _FlakyItems:
    """Items w, w+k, ... below 12 of an iterator (not a generator) that raises on item 5 and goes on after it."""

    def __init__(self, w: int, k: int) -> None:
        self.i, self.k = w, k

    def __iter__(self):
        return self

    def __next__(self):
        i, self.i = self.i, self.i + self.k
        if i >= 12:
            raise StopIteration
        if i == 5:
            raise KeyError("item 5 is missing")
        return np.array([i], np.int64)


class FailsOnFive(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        return _FlakyItems(*((0, 1) if info is None else (info.id, info.num_workers)))


def turns(it, limit: int | None = None) -> list:
    """The batches of ``it`` as lists, a failed one as "failed", up to ``limit`` turns."""
    out: list = []
    while limit is None or len(out) < limit:
        try:
            out.append(next(it).ravel().tolist())
        except StopIteration:
            break
        except WorkerError:
            out.append("failed")
    return out


@pytest.mark.parametrize("nw", [0, 2])
def test_a_stream_without_state_resumed_past_a_failed_batch_gives_the_rest_once(nw):
    """The fast-forward replays each delivered turn, the failed one too, so the rest is the uninterrupted
    run's: no sample again, and the failure is not raised a second time."""
    with DataLoader(FailsOnFive(), batch_size=2, num_workers=nw) as dl:
        full = turns(iter(dl))
    assert "failed" in full
    for k in range(full.index("failed") + 1, len(full) + 1):
        with DataLoader(FailsOnFive(), batch_size=2, num_workers=nw) as dl:
            it = iter(dl)
            head = turns(it, k)
            state = json.loads(json.dumps(dl.state_dict()))
            it.close()
        with DataLoader(FailsOnFive(), batch_size=2, num_workers=nw) as again:
            again.load_state_dict(state)
            assert head + turns(iter(again)) == full, k


class SlowFirstWorker(Counting):
    """Worker 0's stream is slow, so out of order worker 1's stream runs ahead of it."""

    def __iter__(self):
        info = get_worker_info()
        slow = info is not None and info.id == 0
        for x in super().__iter__():
            if slow:
                time.sleep(0.02)
            yield x


class SlowStateless(SlowFirstWorker):
    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]


@pytest.mark.parametrize("ds", [SlowFirstWorker, SlowStateless])
def test_an_out_of_order_stream_resumes_every_sample_once(ds):
    """``in_order=False``: a stream with room takes the next task while a slow one holds its own, so the
    delivered batches are not the streams' turns; a resume still gives every sample exactly once."""
    for k in (1, 4, 9):
        with DataLoader(ds(), batch_size=2, num_workers=2, in_order=False) as dl:
            it = iter(dl)
            got = [next(it).ravel().tolist() for _ in range(k)]
            state = json.loads(json.dumps(dl.state_dict()))
            it.close()
        again = DataLoader(ds(), batch_size=2, num_workers=2, in_order=False)
        again.load_state_dict(state)
        seen = [x for b in got + run(again) for x in b]
        assert sorted(seen) == list(range(40)), k


def test_a_resumed_epoch_left_early_saves_the_next_epoch_from_its_start():
    """Persistent workers: a resumed epoch left by a ``break``, then k batches of the next one saved; the new
    epoch's state counts only its own batches (a worker that sent nothing in the resumed epoch kept the
    count it was resumed with), so it loads and gives the rest of that epoch. (A stream without a state of
    its own: ``Counting``'s state between epochs says where its copy got, not that ``__iter__`` starts over.)"""
    ds = Stateless
    with DataLoader(ds(), batch_size=3, num_workers=2, persistent_workers=True) as dl:
        full = run(dl)
        it = iter(dl)
        next(it), next(it)
        first = json.loads(json.dumps(dl.state_dict()))
        it.close()
    for k in (0, 1, 2):
        with DataLoader(ds(), batch_size=3, num_workers=2, persistent_workers=True) as dl:
            dl.load_state_dict(first)
            for _ in dl:
                break
            it = iter(dl)
            head = [next(it).ravel().tolist() for _ in range(k)]
            state = json.loads(json.dumps(dl.state_dict()))
            it.close()
        with DataLoader(ds(), batch_size=3, num_workers=2, persistent_workers=True) as again:
            again.load_state_dict(state)
            assert head + run(again) == full, k


def test_stream_with_another_worker_count_is_refused():
    with DataLoader(Counting(), batch_size=3, num_workers=2) as dl:
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        it.close()
    with pytest.raises(ValueError, match="same layout"):
        DataLoader(Counting(), batch_size=3, num_workers=1).load_state_dict(state)


class Tars(IterableDataset):
    """ShardedTarStream as an IterableDataset: it already keeps state per reader."""

    def __init__(self, stream: ShardedTarStream) -> None:
        self.stream = stream

    def __iter__(self):
        return iter(self.stream)

    def state_dict(self):
        return self.stream.state_dict()

    def load_state_dict(self, sd):
        self.stream.load_state_dict(sd)


def id_batch(samples) -> np.ndarray:
    return np.array([sample_id(img) for img, _ in samples], np.int64)


@pytest.mark.parametrize("nw", [0, 2])
def test_sharded_tar_stream_resumes_through_the_loader(tmp_path, nw):
    shards = write_shards(tmp_path, [5, 6, 7, 8])

    def make():
        return DataLoader(Tars(ShardedTarStream(shards, seed=3, shuffle_buffer=4)), batch_size=4, num_workers=nw,
                          collate_fn=id_batch)

    with make() as dl:
        full = [b.tolist() for b in dl]
    with make() as dl:
        it = iter(dl)
        got = [next(it).tolist() for _ in range(3)]
        state = json.loads(json.dumps(dl.state_dict()))
        it.close()
    with make() as again:
        again.load_state_dict(state)
        rest = [b.tolist() for b in again]
    assert got + rest == full
    assert sorted(i for b in full for i in b) == list(range(26))


class BrokenState(Counting):
    """Its ``state_dict()`` fails once the stream has moved past 2 samples."""

    def state_dict(self):
        if self.pos > 2:
            raise RuntimeError("position lost")
        return super().state_dict()


class UnpicklableState(Counting):
    def state_dict(self):
        return {"pos": self.pos, "handle": lambda: None}


@pytest.mark.parametrize("ds", [BrokenState, UnpicklableState])
def test_a_failing_dataset_state_costs_no_batch_and_saving_says_why(ds, worker_type):
    """The batches all arrive and the workers live on; only saving the loader's state fails, in one
    line naming the worker and the dataset's error (a worker used to die of it)."""
    with DataLoader(ds(), batch_size=3, num_workers=2) as dl:
        it = iter(dl)
        got = [next(it).ravel().tolist() for _ in range(6)]
        words = "position lost" if ds is BrokenState else "pickle"
        with pytest.raises(StateError, match=rf"^state_dict: .*worker \d.*{words}"):
            dl.state_dict()
        got += [b.ravel().tolist() for b in it]
    assert sorted(i for b in got for i in b) == list(range(40))
