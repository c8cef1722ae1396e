"""torchdata's ``StatefulDataLoader`` tests of a dataset's own state (pytorch/data ``test_state_dict.py``), on both loaders.

Each case is a user's script in the shape of the torchdata test its docstring names, written afresh: a
dataset that draws from torch's global generator in ``__getitem__`` or in its iterator and saves that
generator's state (``torch.get_rng_state()``), a state saved before the first batch, mid-epoch or after the
last one, a new loader (or the same one) loading it, and the rest compared with what the uninterrupted
run delivered next. The ``stateful_backend`` fixture (conftest.py) runs each on torchdata's loader and on
cupy_nwt's with process and thread workers; thread workers share torch's one generator (and a map-style
dataset), so with two of them the uninterrupted run itself depends on their timing: those cases are skipped.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torchdata's cases need torch")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import worker_info  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 under torch 2.13

N = 12
ERROR = "worker init error"


def identity(x):
    return x


def flat(batch) -> list:
    return np.asarray(batch).reshape(-1).tolist()


def epoch(batches) -> list[list]:
    return [flat(b) for b in batches]


def checkpoint(state):
    """The state as a checkpoint keeps it (``torch.save`` pickles)."""
    return pickle.loads(pickle.dumps(state))


def same(a, b) -> bool:
    """Two states equal, torch tensors (a saved generator state) compared by value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def shared_generator(make, num_workers: int) -> None:
    if make.name == "cupy_nwt-threads" and num_workers > 1:
        pytest.skip("two threads draw from torch's one generator (and share a map-style dataset): their timing "
                    "decides the uninterrupted run itself (docs/pytorch.md)")


class Drawing(tud.Dataset):
    """Sample i is 1000 * i plus a draw from torch's global generator, whose state it saves (torchdata's
    ``DummyMapDataset(shuffle=True)``)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return 1000 * i + int(torch.randint(1000, (1,)))

    def state_dict(self):
        return {"g": torch.get_rng_state()}

    def load_state_dict(self, sd) -> None:
        torch.set_rng_state(sd["g"])


class Draws:
    """A reader's share, each sample with a draw from torch's global generator; the iterator saves its position
    and that generator (torchdata's ``DummyIterator``)."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.i = items, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return 1000 * self.items[self.i - 1] + int(torch.randint(1000, (1,)))

    def state_dict(self):
        return {"nest": {"i": self.i, "g": torch.get_rng_state()}}

    def load_state_dict(self, sd) -> None:
        self.i = sd["nest"]["i"]
        torch.set_rng_state(sd["nest"]["g"])


class DrawingStream(tud.IterableDataset):
    """Worker w of k reads w, w+k, ... through a ``Draws`` (torchdata's ``DummyIterableDataset(shuffle=True)``)."""

    def __iter__(self):
        info = worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return Draws(list(range(w, N, k)))


def build(make, kind: str, **kw):
    return make(Drawing() if kind == "map" else DrawingStream(), collate_fn=identity, **kw)


@pytest.mark.parametrize("interrupt", [0, 1, 4])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_dataset_s_generator_resumes_mid_epoch(stateful_backend, num_workers, interrupt):
    """torchdata: TestStatefulDataLoaderMap_shard1.test_random_state (a RandomSampler with its own generator)."""
    make = stateful_backend
    shared_generator(make, num_workers)

    def loader():
        sampler = tud.RandomSampler(Drawing(), generator=torch.Generator().manual_seed(13))
        return make(Drawing(), batch_size=2, sampler=sampler, num_workers=num_workers, collate_fn=identity)

    dl = loader()
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state = checkpoint(dl.state_dict())
    exp = epoch(it)
    again = loader()
    again.load_state_dict(state)
    assert epoch(again) == exp


@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_generator_saved_by_the_dataset_or_its_iterator_resumes_at_0_1_and_4_batches(stateful_backend, kind, num_workers):
    """torchdata: TestStatefulDataLoaderIterable_shard0.test_random_state (the iterator keeps its generator;
    0 workers, interrupted at 0, 1 and 4 batches). A thread worker draws from the main process's generator,
    which a state taken before its first batch does not hold (docs/pytorch.md): from 1 batch on."""
    make = stateful_backend
    shared_generator(make, num_workers)
    threads = make.name == "cupy_nwt-threads" and num_workers > 0
    for interrupt in (1, 4) if threads else (0, 1, 4):
        dl = build(make, kind, batch_size=2, num_workers=num_workers)
        it = iter(dl)
        for _ in range(interrupt):
            next(it)
        state = checkpoint(dl.state_dict())
        exp = epoch(it)
        again = build(make, kind, batch_size=2, num_workers=num_workers)
        again.load_state_dict(state)
        assert epoch(again) == exp, interrupt


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_state_before_the_first_batch_replays_the_epoch(stateful_backend, kind, persistent):
    """torchdata: TestSnapshotZero_shard2 (test_map, test_iterable): the state right after ``iter()``, loaded
    into the same loader after that epoch; and the same with 0 workers."""
    make = stateful_backend
    for num_workers in (0, 2):
        if num_workers == 0 and persistent:
            continue
        shared_generator(make, num_workers)
        dl = build(make, kind, num_workers=num_workers, persistent_workers=persistent)
        it = iter(dl)
        state0 = dl.state_dict()
        exp = epoch(it)
        dl.load_state_dict(state0)
        assert epoch(dl) == exp, num_workers


@pytest.mark.parametrize("batch_size", [None, 4])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_state_after_the_last_batch_resumes_the_next_epoch(stateful_backend, kind, persistent, batch_size):
    """torchdata: TestSnapshotEnd_shard2 (test_map, test_iterable): a whole epoch, its end state, the next
    epoch; a new loader (its generator seeded alike) loads the end state and gives that next epoch."""
    make = stateful_backend
    shared_generator(make, 2)
    g = torch.Generator()
    g.manual_seed(4)
    dl = build(make, kind, num_workers=2, persistent_workers=persistent, batch_size=batch_size, generator=g)
    epoch(dl)
    state_end = checkpoint(dl.state_dict())
    exp = epoch(dl)
    g.manual_seed(4)
    again = build(make, kind, num_workers=2, persistent_workers=persistent, batch_size=batch_size, generator=g)
    again.load_state_dict(state_end)
    assert epoch(again) == exp


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_loaded_mid_epoch_is_what_state_dict_returns_and_replays(stateful_backend, persistent, num_workers):
    """torchdata: TestInitialState_shard0.test_load_then_state: a fresh loader's state, loaded into another
    loader three batches into its epoch; ``state_dict()`` gives it back and the epoch comes again whole."""
    make = stateful_backend
    if num_workers == 0 and persistent:
        pytest.skip("persistent_workers needs workers")
    shared_generator(make, num_workers)
    dl = build(make, "map", num_workers=num_workers, persistent_workers=persistent)
    state0 = dl.state_dict()
    exp = epoch(dl)
    dl = build(make, "map", num_workers=num_workers, persistent_workers=persistent)
    it = iter(dl)
    for _ in range(3):
        next(it)
    dl.load_state_dict(state0)
    assert same(dl.state_dict(), state0)
    assert epoch(dl) == exp


def fail_init(worker_id: int) -> None:
    raise ValueError(ERROR)


def test_a_worker_init_fn_that_raises_fails_at_iter_in_torchdata_and_at_next_in_cupy_nwt(stateful_backend):
    """torchdata: TestInitialState_shard0.test_init_error raises from ``iter(loader)``; cupy_nwt starts its
    workers with the first ``next()`` and raises there, as torch's own DataLoader does (docs/pytorch.md). The
    error is the original's type either way, so ``except ValueError`` around the loop catches it."""
    make = stateful_backend
    dl = make(Drawing(), num_workers=2, worker_init_fn=fail_init)
    if make.name == "torchdata":
        with pytest.raises(ValueError, match=ERROR):
            iter(dl)
        return
    it = iter(dl)
    with pytest.raises(ValueError, match=ERROR):
        next(it)
    dl.close()


class Cursor:
    """An iterator keeping its own position (torchdata's ``DummyIterator``)."""

    def __init__(self, samples: list[int]) -> None:
        self.samples, self.i = samples, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.i >= len(self.samples):
            raise StopIteration
        self.i += 1
        return self.samples[self.i - 1]

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, sd: dict) -> None:
        self.i = sd["i"]


class Uneven(tud.IterableDataset):
    """Shards of 3 and 10 samples (0..2 and 10..19; all 13 without workers): at batch size 2 the first shard
    ends on a short batch while the other still has data."""

    def __iter__(self):
        info = worker_info()
        if info is None:
            return Cursor([0, 1, 2, *range(10, 20)][:5])
        return Cursor([0, 1, 2] if info.id == 0 else list(range(10, 20)))


@pytest.mark.parametrize("stop", ["mid-epoch", "every-batch-taken"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_that_ran_out_on_a_short_batch_is_not_read_again_after_a_resume(stateful_backend, num_workers, stop):
    """torchdata: TestStatefulDataLoaderIterable (DummyIterableDataset with uneven shards). A state saved after
    a reader's short last batch replayed that reader's whole stream on resume, in the same epoch."""
    make = stateful_backend
    whole = [flat(b) for b in make(Uneven(), batch_size=2, num_workers=num_workers)]
    k = {"mid-epoch": 3 if num_workers else 2, "every-batch-taken": len(whole)}[stop]
    first = make(Uneven(), batch_size=2, num_workers=num_workers)
    it = iter(first)
    head = [flat(next(it)) for _ in range(k)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    again = make(Uneven(), batch_size=2, num_workers=num_workers)
    again.load_state_dict(state)
    assert head + epoch(again) == whole
    assert epoch(again) == whole  # and the epoch after is whole
