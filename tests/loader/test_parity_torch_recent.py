"""Cases of PyTorch's newest ``test/test_dataloader.py`` that the other parity files do not mirror yet.

Written afresh as a user's script would use the loader, the same body on cupy_nwt's DataLoader and on
torch's (the ``backend`` fixture). Each docstring names the torch test. Outputs are compared in NumPy;
the deliberate differences of docs/pytorch.md (NumPy stays NumPy, a tuple stays a tuple, the shuffle
order, worker options with 0 workers) are not tested. The cases on how workers end (timeouts, exits)
are in ``test_parity_torch_exits.py``.
"""

from __future__ import annotations

import os
from collections import namedtuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these cases mirror torch's own tests")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import Counting, as_list, items, worker_info  # noqa: E402

import cupy_nwt  # noqa: E402

pytestmark = pytest.mark.usefixtures("worker_type")


# -- what the batches hold


class Doubled(tud.Subset):
    """A Subset whose own __getitem__ transforms the sample (doubles it; sums a pair), with the
    __getitems__ torch asks such a subclass for."""

    def __getitem__(self, i):
        sample = self.dataset[self.indices[i]]
        return sample[0] + sample[1] if isinstance(sample, tuple) else sample * 2

    def __getitems__(self, indices):
        return [self[i] for i in indices]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subset_subclass_s_own_getitem_makes_the_batches(backend, num_workers):
    """torch: TestDataLoader.test_subset_custom_getitem and test_subset_custom_getitem_with_tuple_data."""
    doubled = Doubled(torch.arange(20), [0, 1, 2, 3])
    assert [as_list(b) for b in backend(doubled, batch_size=2, num_workers=num_workers)] == [[0, 2], [4, 6]]
    summed = Doubled(tud.TensorDataset(torch.arange(10), torch.arange(100, 110)), [0, 1, 2, 3])
    assert [as_list(b) for b in backend(summed, batch_size=2, num_workers=num_workers)] == [[100, 102], [104, 106]]


def tensor_pairs():
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(30, 2, 3, generator=gen)
    return data, torch.randperm(15, generator=gen).repeat(2)


CASES = [dict(batch_size=None), dict(), dict(batch_size=4), dict(batch_size=4, num_workers=2),
         dict(batch_size=None, num_workers=2), dict(batch_size=4, num_workers=2, prefetch_factor=3),
         dict(batch_size=4, num_workers=2, persistent_workers=True)]
IDS = [",".join(f"{k}={v}" for k, v in kw.items()) or "default" for kw in CASES]


@pytest.mark.parametrize("kwargs", CASES, ids=IDS)
def test_a_tensor_dataset_comes_in_order_with_its_dtypes(backend, kwargs):
    """torch: TestDataLoader.test_sequential_nonbatch, test_sequential_batch, test_sequential_workers,
    test_seqential_batch_workers(_prefetch), and TestDataLoaderPersistentWorkers' runs of them."""
    data, labels = tensor_pairs()
    got = list(backend(tud.TensorDataset(data, labels), **kwargs))
    unbatched = kwargs.get("batch_size", 1) is None
    xs = [torch.as_tensor(np.asarray(b[0])) for b in got]
    ys = [torch.as_tensor(np.asarray(b[1])) for b in got]
    x, y = (torch.stack(xs), torch.stack(ys)) if unbatched else (torch.cat(xs), torch.cat(ys))
    assert len(got) == len(backend(tud.TensorDataset(data, labels), **kwargs))
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, data) and torch.equal(y, labels)


@pytest.mark.parametrize("kwargs", CASES, ids=IDS)
def test_a_shuffled_tensor_dataset_gives_each_sample_once_with_its_label(backend, kwargs):
    """torch: TestDataLoader.test_shuffle, test_shuffle_batch_none, test_shuffle_batch,
    test_shuffle_workers, test_shuffle_batch_workers(_prefetch) (and the persistent-workers runs)."""
    data, labels = tensor_pairs()
    rows = []
    for x, y in backend(tud.TensorDataset(data, labels), shuffle=True, **kwargs):
        x, y = np.asarray(x).reshape(-1, 2, 3), np.asarray(y).reshape(-1)
        rows += [(int(np.flatnonzero((data.numpy() == xi).all(axis=(1, 2)))[0]), int(yi)) for xi, yi in zip(x, y)]
    assert sorted(i for i, _ in rows) != [i for i, _ in rows] and sorted(i for i, _ in rows) == list(range(30))
    assert all(int(labels[i]) == label for i, label in rows)


def clone_each(samples):
    return [s.clone() for s in samples]


@pytest.mark.filterwarnings("ignore:Sparse invariant checks", "ignore:The PyTorch API of nested tensors")
def test_sparse_and_nested_tensors_cross_workers_through_a_collate_fn(backend):
    """torch: TestDataLoaderDevice.test_sparse_tensor_multiprocessing and
    test_nested_tensor_multiprocessing, on the CPU (a collate_fn that clones each sample)."""
    gen = torch.Generator().manual_seed(1)
    sparse = [torch.randn(5, 5, generator=gen).to_sparse() for _ in range(6)]
    nested = [torch.nested.nested_tensor([torch.randn(i + 1, generator=gen)]) for i in range(6)]
    for data, dense in ((sparse, lambda t: t.to_dense()), (nested, lambda t: t.to_padded_tensor(0.0))):
        got = list(backend(data, batch_size=1, num_workers=2, collate_fn=clone_each))
        assert len(got) == 6 and all(torch.equal(dense(b[0]), dense(data[i])) for i, b in enumerate(got))
        assert got[0][0].layout == data[0].layout and got[0][0].is_nested == data[0].is_nested


def packed(samples):
    rows = torch.stack([s[0] for s in samples])
    return torch.nn.utils.rnn.pack_padded_sequence(rows, torch.tensor([5, 3]), batch_first=True, enforce_sorted=False)


def test_a_collate_fn_may_return_a_packed_sequence(backend):
    """torch: TestCustomPinFn.test_custom_batch_pin_worker, without the pinning (CUDA)."""
    rows = torch.arange(50, dtype=torch.float32).view(10, 5)
    data = tud.TensorDataset(rows, -rows)
    got = list(backend(data, batch_size=2, num_workers=2, collate_fn=packed))
    want = [packed([data[i], data[i + 1]]) for i in range(0, 10, 2)]
    assert all(type(g) is torch.nn.utils.rnn.PackedSequence for g in got)
    assert all(torch.equal(g.data, w.data) and torch.equal(g.unsorted_indices, w.unsorted_indices) for g, w in zip(got, want))


Batch = namedtuple("Batch", "data label noise")
Data = namedtuple("Data", "positive negative")


class Named(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return Batch(Data(i, -i), str(i), torch.full((3,), float(i)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_namedtuples_keep_their_type_batched_and_unbatched(backend, num_workers):
    """torch: TestNamedTupleDataLoader.test_dataloader_with_namedtuple."""
    batch = next(iter(backend(Named(), batch_size=2, num_workers=num_workers)))
    assert type(batch) is Batch and type(batch.data) is Data and isinstance(batch.noise, torch.Tensor)
    assert as_list(batch.data.positive) == [0, 1] and list(batch.label) == ["0", "1"]
    sample = list(backend(Named(), batch_size=None, num_workers=num_workers))[1]
    assert type(sample) is Batch and type(sample.data) is Data and sample.data == (1, -1) and sample.label == "1"
    assert type(sample.data.positive) is int


class Nested(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return {"a_tensor": torch.empty(4, 2).fill_(i), "another_dict": {"a_number": i}}


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
@pytest.mark.parametrize("persistent", [False, True])
def test_pin_memory_without_an_accelerator_leaves_batches_as_they_are(backend, persistent):
    """torch: TestDictDataLoader.test_sequential_batch (persistent workers too) and
    test_pin_memory_no_accelerator."""
    loader = backend(Nested(), batch_size=2, pin_memory=True, num_workers=int(persistent), persistent_workers=persistent)
    for i, batch in enumerate(loader):
        t, n = batch["a_tensor"], batch["another_dict"]["a_number"]
        assert tuple(t.shape) == (2, 4, 2) and not t.is_pinned() and bool((t[1] == 2 * i + 1).all())
        assert set(batch) == {"a_tensor", "another_dict"} and as_list(n) == [2 * i, 2 * i + 1]


# -- the loader's arguments


SEQ = tud.SequentialSampler(range(10))
BATCHES = tud.BatchSampler(SEQ, 3, False)


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(20))


REFUSALS = [
    ("map", dict(batch_size=None, drop_last=True), ValueError, "batch_size=None option disables auto-batching and is mutually exclusive"),
    ("map", dict(num_workers=0, multiprocessing_context="spawn"), ValueError, r"multi-process loading \(num_workers > 0\), but got"),
    ("map", dict(num_workers=1, multiprocessing_context="bad"), ValueError, "should specify a valid start method in"),
    ("map", dict(num_workers=1, multiprocessing_context=object()), TypeError, "multiprocessing_context option should be a valid context "),
    ("map", dict(batch_sampler=BATCHES, sampler=SEQ, shuffle=3), ValueError, "sampler option is mutually exclusive with shuffle"),
    ("map", dict(drop_last=3, batch_sampler=BATCHES), ValueError, "batch_sampler option is mutually exclusive with"),
    ("stream", dict(shuffle=3), ValueError, "DataLoader with IterableDataset: expected unspecified shuffle"),
    ("stream", dict(sampler=3), ValueError, "DataLoader with IterableDataset: expected unspecified sampler"),
    ("stream", dict(batch_sampler=BATCHES), ValueError, "DataLoader with IterableDataset: expected unspecified batch_sampler"),
    ("map", dict(batch_size=2, drop_last=1), ValueError, "drop_last should be a boolean value, but got drop_last=1"),
    ("stream", dict(batch_size=2, drop_last="yes"), ValueError, "drop_last should be a boolean value, but got drop_last=yes"),
]


@pytest.mark.parametrize(("kind", "kwargs", "error", "words"), REFUSALS, ids=[f"{k}:{','.join(kw)}" for k, kw, _, _ in REFUSALS])
def test_refused_argument_combinations_raise_torchs_type_and_words(backend, kind, kwargs, error, words):
    """torch: TestDataLoader.test_invalid_ctor_args_combinations."""
    with pytest.raises(error, match=words):
        backend(Counting(10) if kind == "map" else Stream(), **kwargs)


@pytest.mark.parametrize("name", ["collate_fn", "worker_init_fn"])
def test_a_function_option_that_cannot_be_called_is_a_type_error_at_once(name):
    """torch fails later, where it calls it (a worker's TypeError); here at construction, as a TypeError still."""
    with pytest.raises(TypeError, match=f"{name} must be callable or None, got int"):
        cupy_nwt.DataLoader(Counting(4), num_workers=1, **{name: 3})


def test_too_many_workers_warn_when_the_loader_is_made(backend):
    """torch: TestDataLoader.test_excessive_thread_creation_warning (torch 2.13 warns in the constructor)."""
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader running slow or even freeze"):
        backend(Counting(4), batch_size=2, num_workers=1000)


def test_a_random_sampler_without_a_generator_repeats_under_torch_manual_seed(backend):
    """torch: TestDataLoader.test_sampler_reproducibility, through the loader: a RandomSampler with no
    generator draws from torch's global generator, so ``torch.manual_seed`` before an epoch repeats it."""
    loader = backend(Counting(12), batch_size=4, sampler=tud.RandomSampler(Counting(12)), num_workers=2)
    epochs = []
    for _ in range(3):
        torch.manual_seed(0)
        epochs.append(items(loader))
    assert epochs[0] == epochs[1] == epochs[2] and sorted(epochs[0]) == list(range(12))
    torch.manual_seed(1)
    assert items(loader) != epochs[0]


# -- workers


class Remembers(tud.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return torch.tensor(self.value)


def check_and_mark(worker_id):
    info = tud.get_worker_info()
    assert info.id == worker_id < info.num_workers == 2 and info.seed == torch.initial_seed()
    assert type(info.dataset) is Remembers and not hasattr(info.dataset, "value")
    assert all(f"{key}=" in repr(info) for key in ("id", "num_workers", "seed", "dataset"))
    info.dataset.value = [worker_id, os.getpid()]


@pytest.mark.process_only("the worker's seed is torch's per-process generator, and the pids are workers'")
def test_worker_info_in_worker_init_fn_and_the_worker_s_own_dataset_copy(backend):
    """torch: TestDataLoader.test_get_worker_info."""
    assert tud.get_worker_info() is None
    data = Remembers()
    got = [tuple(row) for b in backend(data, batch_size=2, num_workers=2, worker_init_fn=check_and_mark)
           for row in as_list(b)]
    pids = {w: {pid for wid, pid in got if wid == w} for w in (0, 1)}
    assert [w for w, _ in got] == [0, 0, 1, 1, 0, 0] and all(len(p) == 1 for p in pids.values())
    assert os.getpid() not in pids[0] | pids[1] and pids[0] != pids[1]
    assert tud.get_worker_info() is None and worker_info() is None and not hasattr(data, "value")
    with pytest.raises(AttributeError):
        data[0]


class Affinity(tud.IterableDataset):
    def __init__(self, cpu: int) -> None:
        self.cpu = cpu

    def __iter__(self):
        return iter(os.sched_getaffinity(0))


def pin_to_the_dataset_s_cpu(worker_id):
    os.sched_setaffinity(0, [worker_info().dataset.cpu])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="os.sched_setaffinity is Linux's")
@pytest.mark.process_only("affinity is per process here: the test sets a worker's own")
def test_a_worker_init_fn_may_set_the_worker_s_cpu_affinity(backend):
    """torch: TestSetAffinity.test_set_affinity_in_worker_init."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    got = [as_list(s) for s in backend(Affinity(cpu), num_workers=2, worker_init_fn=pin_to_the_dataset_s_cpu)]
    assert got == [[cpu], [cpu]]


class Conv(tud.Dataset):
    def __init__(self) -> None:
        self.x = torch.ones(1, 1, 24000)
        self[0]  # torch's thread pool runs in the parent before the workers fork

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


@pytest.mark.process_only("fork is for processes")
def test_torch_ops_in_forked_workers_after_the_parent_used_its_threads(backend):
    """torch: TestConvAfterFork.test_conv_after_fork and TestDataLoader.test_no_segfault."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(4, threads))
    try:
        loader = backend(Conv(), num_workers=1, timeout=60, multiprocessing_context="fork")
        assert [tuple(x.shape) for x in loader] == [(1, 1, 1, 23999)] * 2
    finally:
        torch.set_num_threads(threads)
