"""Cases from PyTorch's own DataLoader tests (``test/test_dataloader.py``), run on both loaders.

Each test names the torch test it mirrors. The cases are written afresh, as a user's script would
use the loader; the same body runs on cupy_nwt's DataLoader and on torch's (the ``backend`` fixture
of ``tests/loader/conftest.py``), so a test that passes on torch pins torch's answer for cupy_nwt.
Outputs are compared in NumPy: cupy_nwt keeps NumPy samples as NumPy where torch makes tensors, and
keeps a tuple a tuple (both documented in docs/pytorch.md), so those two differences are not tested.
"""

from __future__ import annotations

import tempfile
import time
from collections import OrderedDict, UserDict

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these cases mirror torch's own tests")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import (  # noqa: E402
    Counting,
    CountingStream,
    as_list,
    items,
    known_difference,
    worker_info,
)

pytestmark = pytest.mark.usefixtures("worker_type")


# -- collation: what a batch looks like


class Tagged(dict):
    """A user's mapping type."""


class Row(list):
    """A user's sequence type."""


class Samples(tud.Dataset):
    def __init__(self, make) -> None:
        self.make = make

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return self.make(i)


def tagged(i):
    return Tagged(a=i, b=10 * i)


def ordered(i):
    return OrderedDict([("z", i), ("a", -i)])


def row(i):
    return Row([i, 10 * i])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mapping_and_sequence_subclasses_keep_their_type(backend, num_workers):
    """torch: TestDataLoader.test_default_collate_mapping_keep_type and
    test_default_collate_sequence_keep_type: a batch of a dict (list) subclass is that subclass."""
    batch = next(iter(backend(Samples(tagged), batch_size=2, num_workers=num_workers)))
    assert type(batch) is Tagged and as_list(batch["a"]) == [0, 1] and as_list(batch["b"]) == [0, 10]
    batch = next(iter(backend(Samples(ordered), batch_size=2, num_workers=num_workers)))
    assert type(batch) is OrderedDict and list(batch) == ["z", "a"] and as_list(batch["a"]) == [0, -1]
    batch = next(iter(backend(Samples(row), batch_size=2, num_workers=num_workers)))
    assert type(batch) is Row and [as_list(f) for f in batch] == [[0, 1], [0, 10]]


class Encoding(UserDict):
    """A mapping that is not a dict, as a tokenizer's output is (transformers' ``BatchEncoding``)."""


def encoded(i):
    return Encoding(input_ids=np.arange(4) + i, attention_mask=np.ones(4, np.int64))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mapping_that_is_not_a_dict_batches_by_key_and_keeps_its_type(backend, num_workers):
    """torch's collate takes any ``Mapping`` key by key (``default_collate``'s Mapping branch): a
    ``UserDict`` sample, as a tokenizer returns, gives a batch of its own type, every batch alike."""
    got = list(backend(Samples(encoded), batch_size=2, num_workers=num_workers))
    assert [type(b) for b in got] == [Encoding, Encoding]
    assert [as_list(b["input_ids"]) for b in got] == [[[0, 1, 2, 3], [1, 2, 3, 4]], [[2, 3, 4, 5], [3, 4, 5, 6]]]
    assert as_list(got[1]["attention_mask"]) == [[1] * 4] * 2


def three_from(i):
    return range(i, i + 3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_range_sample_collates_as_a_sequence_of_fields(backend, num_workers):
    """torch: TestDataLoader.test_default_collate_sequence_dont_keep_type: a ``range`` is a sequence
    like a list: the batch is a list with one array per position, not a stacked 2-D array."""
    batch = next(iter(backend(Samples(three_from), batch_size=2, num_workers=num_workers)))
    assert isinstance(batch, list) and [as_list(f) for f in batch] == [[0, 1], [1, 2], [2, 3]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_unbatched_range_sample_becomes_a_list(request, backend, num_workers):
    """torch: the same test, unbatched (``batch_size=None``): ``default_convert`` makes the range a list."""
    known_difference(request, backend, "an unbatched sample passes through as it is: a range stays a range")
    sample = next(iter(backend(Samples(three_from), batch_size=None, num_workers=num_workers)))
    assert isinstance(sample, list) and sample == [0, 1, 2]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                                   np.uint8, np.bool_], ids=lambda d: d.__name__)
def test_numpy_scalar_samples_batch_in_their_own_dtype(backend, dtype):
    """torch: TestDataLoader.test_numpy_scalars."""
    batch = next(iter(backend(Samples(dtype), batch_size=2)))
    assert np.asarray(batch).dtype == np.dtype(dtype) and np.asarray(batch).shape == (2,)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_rows_of_a_memmap_batch_like_arrays(backend, num_workers):
    """torch: TestDataLoader.test_default_collate_numpy_memmap."""
    with tempfile.TemporaryFile() as f:
        data = np.memmap(f, dtype=np.int64, mode="w+", shape=(4, 2))
        data[:] = np.arange(8).reshape(4, 2)
        data.flush()
        rows = np.memmap(f, dtype=np.int64, mode="r", shape=(4, 2))
        got = [as_list(b) for b in backend(Samples(rows.__getitem__), batch_size=2, num_workers=num_workers)]
    assert got == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def nothing(i):
    return None


def ragged(i):
    return ["x"] * (i + 1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_what_the_default_collate_cannot_batch_raises_torchs_error_types(backend, num_workers):
    """torch: TestDataLoader.test_default_collate_bad_numpy_types (a field of no batchable type is a
    TypeError) and test_default_collate_bad_sequence_type (lists of unequal length: RuntimeError)."""
    with pytest.raises(TypeError):
        next(iter(backend(Samples(nothing), batch_size=2, num_workers=num_workers)))
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        next(iter(backend(Samples(ragged), batch_size=2, num_workers=num_workers)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unbatched_ints_stay_python_ints(backend, num_workers):
    """torch: TestDataLoader.test_builtin_collection_conversion and test_iterable_style_dataset
    ("non-batched should not convert ints"), map-style and iterable-style, into list and tuple."""
    assert tuple(backend(Counting(5), batch_size=None, num_workers=num_workers)) == (0, 1, 2, 3, 4)
    got = list(backend(CountingStream(5), batch_size=None, num_workers=min(num_workers, 1)))
    assert got == [0, 1, 2, 3, 4] and all(type(x) is int for x in got)
    assert [as_list(b) for b in backend(CountingStream(5), batch_size=2, num_workers=min(num_workers, 1))] == \
        [[0, 1], [2, 3], [4]]


# -- the loader's attributes


def test_the_default_sampler_yields_sample_indices_and_the_batch_sampler_batches(backend):
    """torch: the attributes TestDataLoader.test_invalid_assign_after_init guards and
    test_random_sampler_len_* count with: ``loader.sampler`` yields one index per sample (its len is
    the number of samples, as in ``len(loader.sampler)`` of a distributed training loop) and
    ``loader.batch_sampler`` yields the index lists, one per batch."""
    loader = backend(Counting(10), batch_size=4)
    assert len(loader.sampler) == 10 and list(loader.sampler) == list(range(10))
    assert len(loader.batch_sampler) == 3 and [list(b) for b in loader.batch_sampler] == \
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    shuffled = backend(Counting(10), batch_size=4, shuffle=True)
    assert len(shuffled.sampler) == 10 and sorted(shuffled.sampler) == list(range(10))
    mine = backend(Counting(10), batch_size=4, sampler=[9, 8, 7])
    assert [list(b) for b in mine.batch_sampler] == [[9, 8, 7]] and len(mine.batch_sampler) == 1


def test_constructor_arguments_read_back(backend):
    """torch: TestDataLoader.test_invalid_ctor_args_combinations' defaults, read back: ``timeout`` is 0
    unless given, and ``generator`` is the generator the loader was given."""
    gen = torch.Generator().manual_seed(3)
    loader = backend(Counting(10), batch_size=2, shuffle=True, generator=gen)
    assert loader.timeout == 0 and loader.generator is gen
    assert backend(Counting(10)).generator is None


def test_the_default_collate_fn_reads_back_and_can_be_called_and_wrapped(backend):
    """What wrappers of a loader do (Lightning, accelerate): read ``loader.collate_fn``, call it, or
    wrap it and set the wrapper back."""
    loader = backend(Counting(6), batch_size=3)
    called = loader.collate_fn([4, 5])
    assert as_list(called) == [4, 5] and isinstance(called, torch.Tensor)
    inner = loader.collate_fn
    loader.collate_fn = lambda samples: inner([10 * s for s in samples])
    wrapped = list(loader)
    assert [as_list(b) for b in wrapped] == [[0, 10, 20], [30, 40, 50]]
    assert all(isinstance(b, torch.Tensor) for b in wrapped)  # a wrapper's batches are still tensors
    loader.collate_fn = inner
    assert [as_list(b) for b in loader] == [[0, 1, 2], [3, 4, 5]]


# -- iterable-style datasets


class SizedPerWorker(tud.IterableDataset):
    """Worker w yields 0 .. sizes[w]-1."""

    def __init__(self, sizes) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return sum(self.sizes)

    def __iter__(self):
        return iter(range(self.sizes[worker_info().id]))


@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_with_streams_of_unequal_length_each_batch_their_own(backend, drop_last):
    """torch: TestDataLoader.test_iterable_style_dataset (a worker with an empty stream; batches never
    mix two workers' samples; ``drop_last`` drops each worker's own short last batch)."""
    loader = backend(SizedPerWorker([0, 11]), batch_size=3, num_workers=2, drop_last=drop_last)
    got = sorted(as_list(b) for b in loader)
    whole = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert got == (whole if drop_last else whole + [[9, 10]])
    unbatched = sorted(int(x) for x in backend(SizedPerWorker([4, 3]), batch_size=None, num_workers=2))
    assert unbatched == [0, 0, 1, 1, 2, 2, 3]


class RaisesInIter(tud.IterableDataset):
    def __iter__(self):
        raise RuntimeError("Error in __iter__")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_iter_reaches_the_caller(backend, num_workers):
    """torch: TestDataLoader.test_error_in_init (the stream's ``__iter__`` raising)."""
    with pytest.raises(RuntimeError, match="Error in __iter__"):
        list(backend(RaisesInIter(), num_workers=num_workers))


class WorkerIdStream(tud.IterableDataset):
    """Each worker yields its own id, ``n // num_workers`` times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = worker_info()
        for _ in range(self.n // info.num_workers):
            yield info.id


@pytest.mark.parametrize("persistent", [False, True])
def test_each_epoch_takes_the_workers_batches_in_turn(backend, persistent):
    """torch: TestDataLoader.test_multi_epochs_reproducibility (and its persistent-workers run)."""
    loader = backend(WorkerIdStream(20), batch_size=5, num_workers=2, persistent_workers=persistent)
    for _ in range(3):
        assert [as_list(b) for b in loader] == [[0] * 5, [1] * 5, [0] * 5, [1] * 5]


def test_len_of_a_sized_stream_counts_its_short_last_batch_unless_dropped(backend):
    """torch: TestDataLoader.test_iterabledataset_len."""
    for batch_size, drop_last, want in [(1, False, 10), (1, True, 10), (2, False, 5), (2, True, 5),
                                        (3, False, 4), (3, True, 3)]:
        assert len(backend(CountingStream(10), batch_size=batch_size, drop_last=drop_last)) == want


@pytest.mark.parametrize("num_workers", [0, 1])
def test_chained_streams_follow_each_other(backend, num_workers):
    """torch: TestDataLoader.test_chain_iterable_style_dataset."""
    for chained in (CountingStream(4) + CountingStream(3), tud.ChainDataset([CountingStream(4), CountingStream(3)])):
        assert items(backend(chained, num_workers=num_workers)) == [0, 1, 2, 3, 0, 1, 2]


# -- errors and workers


class NoGetItem(tud.Dataset):
    """``Dataset.__getitem__`` is not implemented: every sample raises NotImplementedError."""

    def __len__(self) -> int:
        return 9


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_failing_batch_raises_and_the_epoch_goes_on(backend, num_workers):
    """torch: TestDataLoader.test_error and test_error_workers."""
    it = iter(backend(NoGetItem(), batch_size=2, shuffle=True, num_workers=num_workers))
    errors = 0
    while True:
        try:
            next(it)
        except NotImplementedError:
            errors += 1
        except StopIteration:
            break
    assert errors == 5


def test_a_negative_timeout_is_refused_in_torchs_words(backend):
    """torch: TestDataLoader.test_invalid_ctor_args_combinations (timeout=-1)."""
    with pytest.raises(ValueError, match="timeout option should be non-negative"):
        backend(Counting(4), timeout=-1)


class RemembersItsWorker(tud.Dataset):
    """``worker_init_fn`` is this dataset's own method: it marks the worker's copy."""

    def __init__(self, slow_worker=None) -> None:
        self.worker_id, self.slow_worker = None, slow_worker

    def remember(self, worker_id):
        self.worker_id = worker_id

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i):
        if self.worker_id == self.slow_worker:  # this worker's first sample is slow
            time.sleep(0.5)
            self.slow_worker = None
        return self.worker_id, i


@pytest.mark.process_only("thread workers share one dataset object: a method of it cannot mark one worker's copy")
def test_batch_i_comes_from_worker_i_mod_num_workers(backend):
    """torch: TestIndividualWorkerQueue.test_ind_worker_queue (a bound method as worker_init_fn). Which
    worker makes a batch is fixed, even when one worker is slow: a dataset drawing from its worker's
    seeded generator then gives the same batches run after run."""
    data = RemembersItsWorker(slow_worker=1)
    loader = backend(data, batch_size=4, num_workers=2, timeout=5, worker_init_fn=data.remember)
    for i, (workers, indices) in enumerate(loader):
        assert as_list(workers) == [i % 2] * 4 and as_list(indices) == list(range(4 * i, 4 * i + 4))
    assert data.worker_id is None


class Offset(tud.Dataset):
    def __init__(self) -> None:
        self.offset = 0

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return i + self.offset


@pytest.mark.process_only("thread workers read the one dataset object, changes included")
def test_persistent_workers_keep_the_dataset_copy_they_started_with(backend):
    """torch: TestDataLoaderPersistentWorkers.test_dataset_not_reset (and, without persistent workers,
    each epoch's new workers see the dataset as it is then)."""
    for persistent, want in [(True, [0, 0, 0]), (False, [0, 100, 200])]:
        data = Offset()
        loader = backend(data, batch_size=3, num_workers=2, persistent_workers=persistent)
        firsts = []
        for epoch in range(3):
            firsts.append(items(loader)[0])
            data.offset = 100 * (epoch + 1)
        assert firsts == want
