"""torchdata's own ``StatefulDataLoader`` tests (pytorch/data ``test/stateful_dataloader/``), run on both loaders.

Each case is a user's script: a training loop that stops, saves ``state_dict()``, builds a new loader,
``load_state_dict()`` and goes on. The same body runs on torchdata's ``StatefulDataLoader`` and on
cupy_nwt's ``DataLoader`` (process and thread workers); each docstring names the torchdata test it
mirrors, written afresh. A loader is compared with its own uninterrupted run, so the shuffle order (not
``torch.randperm``'s here: docs/pytorch.md) plays no part. cupy_nwt loaders get ``seed=0`` unless a case
says otherwise (a resumed run passes its seed; the unseeded case is tested apart). Every case here
answers on cupy_nwt as on torchdata, or as docs/pytorch.md says it differs; the cases where torchdata 0.11
itself is wrong are strict xfails of torchdata's, naming its bug.
"""

from __future__ import annotations

import copy
import json
import pickle
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torchdata's cases need torch")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import worker_info  # noqa: E402

import cupy_nwt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 under torch 2.13

N = 10


@pytest.fixture
def make(stateful_backend):
    """A loader maker, ``make(dataset, **kwargs)`` (``stateful_backend`` in conftest.py)."""
    return stateful_backend


def flat(batch) -> list:
    """A batch's samples as Python numbers (torch tensors, NumPy arrays and plain ints alike)."""
    return np.asarray(batch).reshape(-1).tolist()


def epoch(batches) -> list[list]:
    return [flat(b) for b in batches]


def values(batches) -> list:
    return [x for b in batches for x in flat(b)]


def take(loader, k: int):
    it = iter(loader)
    return it, [flat(next(it)) for _ in range(k)]


def checkpoint(state):
    """The state as a checkpoint keeps it (``torch.save`` pickles)."""
    return pickle.loads(pickle.dumps(state))


def resumed(build, k: int, epochs_before: int = 0) -> tuple[list, list, list]:
    """The user's script: ``epochs_before`` whole epochs, then ``k`` batches, the state saved, a new loader
    loading it; what the first loop got in that epoch, the rest the new loader gives, and its next epoch."""
    first = build()
    for _ in range(epochs_before):
        epoch(first)
    it, head = take(first, k)
    state = checkpoint(first.state_dict())
    del it
    again = build()
    again.load_state_dict(state)
    rest, after = epoch(again), epoch(again)
    close(first, again)
    return head, rest, after


def close(*loaders) -> None:
    for dl in loaders:
        getattr(dl, "close", lambda: None)()


def shard() -> tuple[int, int]:
    info = worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class Rows(tud.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return i


class Stream(tud.IterableDataset):
    """0 .. n-1, worker w of k yielding w, w+k, ... (sharded by get_worker_info(), as a user writes it)."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __iter__(self):
        w, k = shard()
        yield from range(w, self.n, k)


class Counting:
    """Its state: how far it got this epoch, and its own epoch count (torchdata's ``GeneratorIterable``
    with ``increment_epoch``, and ``GeneratorSampler``)."""

    pos, resume, epoch = 0, None, 0

    def state_dict(self):
        return {"pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, sd) -> None:
        self.resume, self.epoch = sd["pos"], sd["epoch"]


class Resumable(Counting, Stream):
    """Stream's samples plus 100 * its epoch count."""

    def __iter__(self):
        w, k = shard()
        self.pos, self.resume = self.resume or 0, None
        for i in range(w + self.pos * k, self.n, k):
            self.pos += 1
            yield i + 100 * self.epoch
        self.pos, self.epoch = 0, self.epoch + 1


class Rotating(Counting, tud.Sampler):
    """0 .. N-1 rotated by its epoch count."""

    def __iter__(self):
        self.pos, self.resume = self.resume or 0, None
        for i in range(self.pos, N):
            self.pos += 1
            yield (i + self.epoch) % N
        self.pos, self.epoch = 0, self.epoch + 1

    def __len__(self) -> int:
        return N


LAYOUTS = [pytest.param({"num_workers": 0}, id="inline"), pytest.param({"num_workers": 1}, id="one-worker"),
           pytest.param({"num_workers": 2}, id="workers"),
           pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent")]


def loader_for(make, kind: str, layout: dict):
    if kind == "map":
        return make(Rows(), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(7), **layout)
    return make(Resumable() if kind == "stateful-stream" else Stream(), batch_size=2, **layout)


# -- (a) no sample dropped or repeated across a save and a resume


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["map", "stream", "stateful-stream"])
def test_stopped_in_a_later_epoch_the_resumed_rest_is_the_uninterrupted_one(make, kind, layout):
    """torchdata: TestStatefulDataLoaderIterable_shard0, TestStatefulDataLoaderMap_shard1 and
    TestStatefulDataLoaderGenerator_shard2 (test_no_mp, test_mp_x, test_mp_pw), in a second epoch."""
    whole = loader_for(make, kind, layout)
    epoch(whole)
    e1 = epoch(whole)
    close(whole)
    assert sorted(x % 100 for x in values(e1)) == list(range(N))
    head, rest, after = resumed(lambda: loader_for(make, kind, layout), 2, epochs_before=1)
    assert head + rest == e1
    assert sorted(x % 100 for x in values(after)) == list(range(N))  # torchdata's next order is not e2's


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_state_at_the_last_batch_resumes_empty_and_one_after_the_epoch_the_next(make, kind, num_workers):
    """torchdata: TestEndOfEpochBehavior_shard0.test_end_of_epoch_behavior and TestSnapshotEnd_shard2 (an
    end-of-epoch state loaded into a loader stopped mid-epoch). torchdata's next shuffled epoch after such
    a load is a full epoch but not the uninterrupted order, so the samples are compared as sets."""
    dl = loader_for(make, kind, {"num_workers": num_workers})
    for _ in dl:
        inside = checkpoint(dl.state_dict())
    after = checkpoint(dl.state_dict())
    e1 = sorted(values(dl))
    a = loader_for(make, kind, {"num_workers": num_workers})
    a.load_state_dict(inside)
    assert epoch(a) == [] and sorted(values(a)) == e1
    b = loader_for(make, kind, {"num_workers": num_workers})
    it, _ = take(b, 2)
    b.load_state_dict(after)
    assert sorted(values(b)) == e1


# -- (b) samplers and datasets with state_dict / load_state_dict of their own


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("later", [False, True], ids=["first-epoch", "second-epoch"])
def test_torchdata_s_distributed_sampler_resumes_by_its_state(make, later, num_workers):
    """torchdata: test_sampler.py TestDataLoader.test_dataloader_state_dict (StatefulDistributedSampler),
    also stopped in the second epoch (where its state still counts the first epoch until it is iterated)."""
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler", reason="torchdata is a test-only extra")

    def build():
        sampler = samplers.StatefulDistributedSampler(Rows(), num_replicas=1, rank=0, shuffle=False)
        return make(Rows(), batch_size=2, sampler=sampler, num_workers=num_workers)

    head, rest, _ = resumed(build, 2, epochs_before=int(later))
    assert head + rest == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def randomly_sampled(make, given_as: str, batch_size: int, num_workers: int):
    """A loader over torchdata's ``RandomSampler`` (seeded), given as the sampler or inside its ``BatchSampler``."""
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler", reason="torchdata is a test-only extra")
    sampler = samplers.RandomSampler(Rows(), generator=torch.Generator().manual_seed(5))
    if given_as == "batch_sampler":
        return make(Rows(), batch_sampler=samplers.BatchSampler(sampler, batch_size, False), num_workers=num_workers)
    return make(Rows(), batch_size=batch_size, sampler=sampler, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("later", [False, True], ids=["first-epoch", "second-epoch"])
@pytest.mark.parametrize("given_as", ["sampler", "batch_sampler"])
def test_torchdata_s_random_sampler_resumes_by_its_iterator_s_state(make, given_as, later, num_workers):
    """torchdata: test_sampler.py's RandomSampler and BatchSampler cases (the state is their iterators': the
    generator as the iteration began and how far it got), also stopped in the second epoch."""
    def build():
        return randomly_sampled(make, given_as, 2, num_workers)

    whole = build()
    uninterrupted = [epoch(whole) for _ in range(1 + later)][-1]
    close(whole)
    head, rest, _ = resumed(build, 2, epochs_before=int(later))
    assert head + rest == uninterrupted


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("when", ["between-epochs", "before-the-first-batch"])
def test_a_distributed_sampler_s_state_saved_before_an_epoch_s_first_batch_resumes_that_whole_epoch(
        request, make, when, num_workers):
    """A checkpoint at an epoch's end (or of a later epoch's iterator before its first batch): the
    StatefulDistributedSampler's count is still the previous iteration's, which must not skip the next."""
    samplers = pytest.importorskip("torchdata.stateful_dataloader.sampler", reason="torchdata is a test-only extra")
    if make.name == "torchdata" and (num_workers == 0 or when == "before-the-first-batch"):
        request.applymarker(pytest.mark.xfail(strict=True, reason="torchdata 0.11's own bug: the sampler's count "
                                              "of the previous iteration is loaded, and the epoch comes out empty"))

    def build():
        sampler = samplers.StatefulDistributedSampler(Rows(), num_replicas=1, rank=0, shuffle=False)
        return make(Rows(), batch_size=2, sampler=sampler, num_workers=num_workers)

    dl = build()
    epoch(dl)
    it = iter(dl) if when == "before-the-first-batch" else None
    state = checkpoint(dl.state_dict())
    del it
    again = build()
    again.load_state_dict(state)
    assert sorted(values(again)) == list(range(N))
    close(dl, again)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("when", ["between-epochs", "before-the-first-batch"])
@pytest.mark.parametrize("given_as", ["sampler", "batch_sampler"])
def test_torchdata_s_random_sampler_saved_between_epochs_resumes_the_next_epoch(make, given_as, when, num_workers):
    """torchdata: test_sampler.py's RandomSampler, saved at an epoch's end. Only its iterator keeps a state (its
    generator advances with each iteration); without it the resumed loader drew epoch 0's order again, and every
    epoch after came one behind."""
    def build():
        return randomly_sampled(make, given_as, 3, num_workers)

    whole = build()
    uninterrupted = [epoch(whole) for _ in range(3)]
    dl = build()
    assert epoch(dl) == uninterrupted[0]
    it = iter(dl) if when == "before-the-first-batch" else None
    state = checkpoint(dl.state_dict())
    del it
    again = build()
    again.load_state_dict(state)
    assert [epoch(again), epoch(again)] == uninterrupted[1:]
    close(whole, dl, again)


SAMPLERS = {"sequential": lambda: tud.SequentialSampler(Rows()), "random": lambda: tud.RandomSampler(Rows()),
            "stateful-sampler": Rotating}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_a_user_sampler_resumes_mid_epoch(make, sampler, num_workers):
    """torchdata: TestNotStatefulSamplerSDL_shard0 (torch's samplers under torch.manual_seed) and
    TestStatefulSampler_shard1 (with GeneratorSampler's resume)."""

    def build():
        torch.manual_seed(0)
        return make(Rows(), batch_size=3, sampler=SAMPLERS[sampler](), num_workers=num_workers)

    head, rest, _ = resumed(build, 2)
    assert head + rest == epoch(build())


BETWEEN = {"stream-inline": lambda make: make(Resumable(), batch_size=None),
           "stream-persistent": lambda make: make(Resumable(), batch_size=None, num_workers=2, persistent_workers=True),
           "sampler": lambda make: make(Rows(), batch_size=5, sampler=Rotating())}


@pytest.mark.parametrize("case", list(BETWEEN))
def test_an_own_epoch_count_survives_a_state_saved_between_epochs(request, make, case):
    """torchdata: TestMultiEpochState_shard0 (test_inline, test_pw: GeneratorIterable counting its epochs),
    and the same with GeneratorSampler's count."""
    dl = BETWEEN[case](make)
    e0, between, e1 = values(dl), checkpoint(dl.state_dict()), values(dl)
    assert e1 != e0
    again = BETWEEN[case](make)
    it, _ = take(again, 2)
    again.load_state_dict(between)
    assert values(again) == e1
    close(dl, again)


class Counted(Rows):
    """Sample i is 100 * i plus how many samples this copy made: its state (torchdata's ``DummyMapDataset``,
    whose samples depend on the generator state it saves)."""

    def __init__(self) -> None:
        self.made = 0

    def __getitem__(self, i):
        self.made += 1
        return 100 * i + self.made

    def state_dict(self):
        return {"made": self.made}

    def load_state_dict(self, sd) -> None:
        self.made = sd["made"]


class Span:
    def __init__(self, at: int, end: int) -> None:
        self.at, self.end = at, end


class SelfIter(tud.IterableDataset):
    """``__iter__`` returns the dataset itself and makes its position there, in an object that exists only
    after ``iter()``; the state is that position (torchdata's ``CountIterCallsIter``: its ``load_state_dict``
    fails before ``iter()``, so the state must be loaded after it)."""

    def __iter__(self):
        w, k = shard()
        self.span = Span(N // k * w, N // k * (w + 1))
        return self

    def __next__(self) -> int:
        if self.span.at >= self.span.end:
            raise StopIteration
        self.span.at += 1
        return self.span.at - 1

    def state_dict(self):
        return {"at": self.span.at, "end": self.span.end}

    def load_state_dict(self, sd) -> None:
        self.span.at, self.span.end = sd["at"], sd["end"]


class Draws:
    """Reader w of k: positions w, w+k, ..., each with a draw from a generator of its own, seeded afresh."""

    def __init__(self, w: int, k: int) -> None:
        self.i, self.k, self.rng = w, k, np.random.default_rng()

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.i >= N:
            raise StopIteration
        self.i += self.k
        return (self.i - self.k) * 1000 + int(self.rng.integers(1000))

    def state_dict(self):
        return {"i": self.i, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, sd) -> None:
        self.i, self.rng.bit_generator.state = sd["i"], sd["rng"]


class Drawing(tud.IterableDataset):
    def __iter__(self):
        return Draws(*shard())


OWN_STATE = {"map-dataset": Counted, "self-iterator": SelfIter, "iterator": Drawing}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(OWN_STATE))
def test_a_dataset_s_or_its_iterator_s_own_state_is_saved_and_restored(make, case, num_workers):
    """torchdata: TestStatefulDataLoaderMap_shard1 and TestSnapshotZero_shard2.test_map (DummyMapDataset),
    TestStateInitializationDataset (test_inline, test_mp: CountIterCallsIter, its own iterator) and
    TestStatefulDataLoaderIterable_shard0.test_random_state (DummyIterator keeps the position and generator)."""
    cls = OWN_STATE[case]
    if make.name == "cupy_nwt-threads" and case == "map-dataset" and num_workers > 1:
        pytest.skip("threads share one map-style dataset: its state is one reader's, and two threads' interleaving "
                    "decides the uninterrupted run itself (docs/pytorch.md)")
    dl = make(cls(), batch_size=None, num_workers=num_workers)
    it, _ = take(dl, 3)
    state = checkpoint(dl.state_dict())
    rest = values(it)
    again = make(cls(), batch_size=None, num_workers=num_workers)
    again.load_state_dict(state)
    assert values(again) == rest


class Augmented(tud.Dataset):
    """A random augmentation drawn from the worker's torch generator, which the dataset's state keeps: the
    recipe for worker-specific state in torchdata's README (the generator torch seeds in each worker)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return 1000 * i + int(torch.randint(0, 1000, ()))

    def state_dict(self) -> dict:
        return {"torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch_rng"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_augmentations_drawn_from_torch_s_generator_in_the_state_repeat_after_a_resume(make, num_workers):
    """torchdata's README, "Saving Custom State with Map-Style Datasets": each reader's dataset state is
    restored where its delivered batches left it, after the loader seeded the reader's generator (else the
    seed would overwrite the restored generator and the rest would draw other augmentations)."""
    if make.name == "cupy_nwt-threads" and num_workers > 1:
        pytest.skip("torch's generator is one per process: threads draw from it in whatever order they run "
                    "(docs/loader.md)")

    def build():
        return make(Augmented(), batch_size=2, num_workers=num_workers, shuffle=True,
                    generator=torch.Generator().manual_seed(5))

    torch.manual_seed(1)
    whole = epoch(build())
    torch.manual_seed(1)
    head, rest, _ = resumed(build, 2)
    assert head + rest == whole


class Live(tud.IterableDataset):
    """Its ``state_dict()`` returns the dict it keeps updating (torchdata's ``PeriodicStateIterableDataset``)."""

    def __init__(self) -> None:
        self.state = {"pos": 0}

    def __iter__(self):
        w, k = shard()
        for i in range(self.state["pos"], N):
            self.state["pos"] = i + 1
            yield i * k + w

    def state_dict(self):
        return {"live": self.state}

    def load_state_dict(self, sd) -> None:
        self.state = dict(sd["live"])


def test_a_saved_state_is_as_of_the_delivered_batch_while_workers_run_ahead(request, make):
    """torchdata: TestDynamicStateIterableDataset_shard0 (an earlier state_dict() unchanged by later batches)
    and TestFastStateDictRequestRoundRobin_shard3 (a dataset whose state_dict() returns its live dict)."""
    dl = make(Live(), batch_size=None, num_workers=2, prefetch_factor=2)
    it, head = take(dl, 3)
    time.sleep(0.2)  # the workers make their prefetched batches
    state = dl.state_dict()
    kept = copy.deepcopy(state)
    rest = values(it)
    assert state == kept
    again = make(Live(), batch_size=None, num_workers=2)
    again.load_state_dict(kept)
    assert values(again) == rest


class SlowAt(tud.Dataset):
    """0 .. 9, sample ``slow`` taking 0.5 s (torchdata's ``_TestSlowIndexDataset``)."""

    def __init__(self, slow: int = 0) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        if i == self.slow:
            time.sleep(0.5)
        return i


class SlowHalves(tud.IterableDataset):
    """Worker w of k yields its contiguous share of 0 .. 9; sample 5 (worker 1's first) takes 0.5 s
    (torchdata's ``_TestSlowIterableDataset``)."""

    def __iter__(self):
        w, k = shard()
        per = -(-N // k)
        for i in range(w * per, min(N, (w + 1) * per)):
            if i == N // 2:
                time.sleep(0.5)
            yield i


def test_out_of_order_map_batches_resume_every_sample_once(make):
    """torchdata: TestOutOfOrderWithCheckpointing.test_out_of_order_index_ds: sample 0 is slow, four
    batches come out of order before the state is saved, the rest after a resume."""
    output = []
    dl = make(SlowAt(), num_workers=2, in_order=False)
    for i, data in enumerate(dl):
        output += values([data])
        if i == 3:
            state = checkpoint(dl.state_dict())
            break
    assert 0 not in output
    again = make(SlowAt(), num_workers=2, in_order=False)
    again.load_state_dict(state)
    output += values(again)
    assert sorted(output) == list(range(N)) and output != list(range(N))
    close(dl, again)


@pytest.mark.parametrize("stop_after", [4, 8], ids=["no-stream-ended", "one-stream-ended"])
def test_out_of_order_streams_resume_every_sample_once(make, stop_after):
    """torchdata: TestOutOfOrderWithCheckpointing.test_out_of_order_iterable_ds_(no|one)_completed_worker(s):
    worker 1's first sample is slow, so worker 0's samples come first; saved with neither or one stream
    ended, the rest comes after a resume."""
    output = []
    dl = make(SlowHalves(), num_workers=2, prefetch_factor=2, in_order=False)
    for i, data in enumerate(dl):
        output += values([data])
        if i == stop_after - 1:
            state = checkpoint(dl.state_dict())
            break
    again = make(SlowHalves(), num_workers=2, in_order=False)
    again.load_state_dict(state)
    output += values(again)
    assert output == list(range(N))
    close(dl, again)


class CountsIter(Counting, Stream):
    """Stream's samples; each ``__iter__`` call leaves a line in ``log`` (any process, any thread)."""

    def __init__(self, log) -> None:
        super().__init__()
        self.log = log

    def __iter__(self):
        with open(self.log, "a", encoding="utf-8") as f:
            f.write("iter\n")
        w, k = shard()
        self.pos, self.resume = self.resume or 0, None
        for i in range(w + self.pos * k, self.n, k):
            self.pos += 1
            yield i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_s_iter_is_called_once_per_reader_fresh_and_resumed(make, num_workers, tmp_path):
    """torchdata: TestSingleIterCalled_shard0 (a dataset whose ``__iter__`` opens files or draws must not be
    iterated twice to be restored): each reader calls it once, in a fresh loader and in a resumed one."""
    log = tmp_path / "iter.log"
    readers = max(1, num_workers)
    dl = make(CountsIter(log), batch_size=1, num_workers=num_workers)
    it, head = take(dl, 3)
    state = checkpoint(dl.state_dict())
    del it
    assert log.read_text().count("iter") == readers
    again = make(CountsIter(log), batch_size=1, num_workers=num_workers)
    again.load_state_dict(state)
    rest = values(again)
    assert log.read_text().count("iter") == 2 * readers
    assert sorted(values(head) + rest) == list(range(N))
    close(dl, again)


def hf_examples(**kwargs):
    for i in range(20):
        yield f"file_{i}", {"id": i}


def identity(batch):
    return batch


@pytest.mark.parametrize("layout", [{"num_workers": 0}, {"num_workers": 2, "persistent_workers": True}],
                         ids=["inline", "persistent"])
@pytest.mark.parametrize("interrupt", [1, 10])
def test_a_hugging_face_iterable_dataset_resumes_by_its_own_state(make, layout, interrupt):
    """torchdata: test_hugging_face.py (a ``datasets.IterableDataset``, whose state is its own): the rest after a
    resume is the rest the first iterator went on to give. It shards by torch's worker info, which thread
    workers cannot answer: several of them refuse it in one line (each would read all of it)."""
    hf = pytest.importorskip("datasets.iterable_dataset", reason="Hugging Face datasets is a test-only extra")
    info = pytest.importorskip("datasets.info", reason="Hugging Face datasets is a test-only extra")

    def build():
        dataset = hf.IterableDataset(hf.ExamplesIterable(hf_examples, {}), info=info.DatasetInfo(description="d"),
                                     split="train")
        return make(dataset, collate_fn=identity, **layout)

    dl = build()
    it = iter(dl)
    if make.name.endswith("threads") and layout["num_workers"] > 1:
        with pytest.raises(cupy_nwt.LoaderError, match=r"torch\.utils\.data\.get_worker_info\(\), which is one"):
            next(it)
        return close(dl)
    for _ in range(interrupt):
        next(it)
    state = checkpoint(dl.state_dict())
    rest = [b[0]["id"] for b in it]
    again = build()
    again.load_state_dict(state)
    assert [b[0]["id"] for b in again] == rest and len(rest) == 20 - interrupt
    close(dl, again)


# -- (c) what a state holds and what load_state_dict accepts


@pytest.mark.parametrize("layout", LAYOUTS[:3])
@pytest.mark.parametrize("kind", ["map", "stateful-stream"])
def test_states_from_before_during_and_right_after_a_resume_reload(request, make, kind, layout):
    """torchdata: TestSnapshotZero_shard2 (test_map_iterrupted_shuffle, test_generator),
    TestInitialState_shard0.test_initial_state and TestFastStateDictRequest_shard3 (a state asked for one
    batch after a resume)."""
    if make.name == "torchdata" and kind == "stateful-stream" and layout["num_workers"] > 1:
        request.applymarker(pytest.mark.xfail(strict=True, reason="torchdata 0.11's own bug: a state asked for "
                                              "before every worker answered after a resume loses their restored states"))
    dl = loader_for(make, kind, layout)
    state0 = checkpoint(dl.state_dict())
    it, head = take(dl, 2)
    state1 = checkpoint(dl.state_dict())
    dl.load_state_dict(state1)
    it, mid = take(dl, 1)
    state2 = checkpoint(dl.state_dict())
    del it
    again = loader_for(make, kind, layout)
    again.load_state_dict(state2)
    rest = epoch(again)
    dl.load_state_dict(state0)
    assert epoch(dl) == head + mid + rest
    assert sorted(values(head + mid + rest)) == list(range(N))
    close(dl, again)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loaded_state_is_what_state_dict_returns_until_the_loader_runs(make, num_workers):
    """torchdata: TestInitialState_shard0 (test_load_state_before_initial_state_dict, test_load_then_state)."""
    dl = make(Rows(), batch_size=2, num_workers=num_workers)
    it, _ = take(dl, 2)
    state = checkpoint(dl.state_dict())
    rest = epoch(it)
    other = make(Rows(), batch_size=2, num_workers=num_workers)
    it, _ = take(other, 3)
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert epoch(other) == rest


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["sampler", "stream"])
def test_a_state_round_trips_through_json_and_pickle_and_loads_twice(make, kind, num_workers):
    """torchdata: TestJsonSerDe_shard3 (test_json_serde_single_process, _multi_process, and their _map twins);
    the one state dict is loaded twice into a loader, and into a second loader, as a retried restore does."""

    def build():
        if kind == "sampler":
            return make(Rows(), batch_size=2, sampler=Rotating(), num_workers=num_workers)
        return make(Resumable(), batch_size=2, num_workers=num_workers)

    dl = build()
    epoch(dl)
    it, _ = take(dl, 2)
    state = dl.state_dict()
    text, blob = json.dumps(state), pickle.dumps(state)
    rest = epoch(it)
    for loaded in (json.loads(text), pickle.loads(blob)):
        for times in (2, 1):
            again = build()
            for _ in range(times):
                again.load_state_dict(loaded)
            assert epoch(again) == rest
    assert json.dumps(state) == text


def test_an_empty_state_is_nothing_to_torchdata_and_refused_by_cupy_nwt(make):
    """torchdata 0.11: StatefulDataLoader.load_state_dict({}) is a no-op (its source, not a test). cupy_nwt
    refuses it in one line (deliberate, docs/pytorch.md): ``{}`` is what ``ckpt.get("loader", {})`` gives for a
    checkpoint without the loader's state, and taking it silently restarts the epoch."""
    dl = make(Rows(), batch_size=4)
    it, _ = take(dl, 1)
    if make.name == "torchdata":
        dl.load_state_dict({})
        assert values(dl) == list(range(N))
        return
    before = dl.state_dict()
    with pytest.raises(cupy_nwt.StateError, match=r"^load_state_dict: state=\{\}: empty"):
        dl.load_state_dict({})
    assert dl.state_dict() == before


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_epochs_saved_then_two_more_are_the_uninterrupted_four(request, make, num_workers, shuffle):
    """torchdata: TestMultiEpochSDL_shard0.test_multi_epoch_sdl: no seed given; the new loader is made after
    other draws from torch's generator, as in a new process."""
    unseeded = {} if make.name == "torchdata" else {"seed": None}

    def build():
        return make(Rows(), batch_size=1, shuffle=shuffle, num_workers=num_workers, **unseeded)

    torch.manual_seed(0)
    first = build()
    got = epoch(first) + epoch(first)
    state = checkpoint(first.state_dict())
    again = build()
    again.load_state_dict(state)
    got += epoch(again) + epoch(again)
    torch.manual_seed(0)
    whole = build()
    assert got == [b for _ in range(4) for b in epoch(whole)]


@pytest.mark.parametrize(("before", "after"), [(0, 2), (2, 0)])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_state_from_another_worker_count(make, kind, before, after):
    """torchdata: TestNumWorkersMismatch_shard3. torchdata refuses it (AssertionError at iter()); cupy_nwt
    refuses a stream's too, but resumes a map-style state with any worker count (deliberate: docs/loader.md,
    "Another num_workers ... gives the same rest")."""
    dl = loader_for(make, kind, {"num_workers": before})
    it, head = take(dl, 1)
    state = checkpoint(dl.state_dict())
    del it
    again = loader_for(make, kind, {"num_workers": after})
    if make.name == "torchdata" or kind == "stream":
        with pytest.raises((AssertionError, ValueError)):
            again.load_state_dict(state)
            list(again)
        return
    again.load_state_dict(state)
    assert sorted(values(head) + values(again)) == list(range(N))

