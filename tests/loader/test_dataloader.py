"""DataLoader on the host: order, coverage, collation, transforms, worker lifecycle, the ring."""

from __future__ import annotations

import os
import sys
import threading
from collections import namedtuple

import numpy as np
import pytest
from toy_data import Squares

from cupy_nwt import NoGPUError, cuda, get_worker_info
from cupy_nwt.errors import LoaderError, WorkerError
from cupy_nwt.loader import DataLoader
from cupy_nwt.loader.ring.ring import live_segments, segment_bytes

pytestmark = pytest.mark.usefixtures("worker_type")


class DictSamples(Squares):
    def __getitem__(self, i: int):
        return {"x": np.full((2,), i, np.float32), "meta": (i, float(i) / 2, i % 2 == 0)}


Pair = namedtuple("Pair", "image label")


class NamedSamples(Squares):
    def __getitem__(self, i: int):
        return Pair(np.full((3,), i, np.int16), i)


class BulkSamples(Squares):
    """Has __getitems__: the label is offset by 1000 so the test can see which path made it."""

    def __getitems__(self, indices):
        return [(np.full((4, 4, 3), i % 256, np.uint8), i + 1000) for i in indices]


class WorkerIds(Squares):
    def __getitem__(self, i: int):
        info = get_worker_info()
        return np.zeros(1, np.uint8), -1 if info is None else info.id * 100 + getattr(_INIT, "id", 99)


class CupyImported(Squares):
    def __getitem__(self, i: int):
        return np.zeros(1, np.uint8), int("cupy" in sys.modules)


class BadShapeAt(Squares):
    def __init__(self, n: int, bad: int, dtype_only: bool = False) -> None:
        super().__init__(n)
        self.bad, self.dtype_only = bad, dtype_only

    def __getitem__(self, i: int):
        img, y = super().__getitem__(i)
        if i == self.bad:
            img = img.astype(np.float32) if self.dtype_only else img[:2]
        return img, y


class Strings(Squares):
    def __getitem__(self, i: int):
        return f"file{i}.png", i


class Nones(Squares):
    def __getitem__(self, i: int):
        return None, i


_INIT = threading.local()  # what worker_init_fn saw, per worker (a thread worker shares the globals)


def remember_worker(worker_id: int) -> None:
    _INIT.id = worker_id


def to_float(samples):
    x = np.stack([s[0] for s in samples]).astype(np.float32) / 255
    y = np.array([s[1] for s in samples], dtype=np.int32)
    return x, y


class NoisyFlip:
    """A seeded batch transform: flips some rows and adds seed-derived noise to the labels."""

    def __call__(self, batch, seed):
        x, y = batch
        rng = np.random.default_rng(seed)
        flip = rng.random(len(y)) < 0.5
        x = x.copy()
        x[flip] = x[flip, :, ::-1]
        return x.transpose(0, 3, 1, 2).astype(np.float32), y * 1000 + rng.integers(0, 1000, len(y))


def collect(loader):
    return [tuple(np.array(f, copy=True) for f in b) for b in loader]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert u.dtype == v.dtype and np.array_equal(u, v)


def test_workers_deliver_exactly_the_single_process_order():
    kw = dict(batch_size=16, shuffle=True, seed=11, device="cpu")
    ref = collect(DataLoader(Squares(203), num_workers=0, **kw))
    with DataLoader(Squares(203), num_workers=3, prefetch_factor=2, **kw) as dl:
        got = collect(dl)
    assert_same(ref, got)
    labels = np.concatenate([b[1] for b in got])
    assert sorted(labels.tolist()) == list(range(203))
    assert [len(b[1]) for b in got][-1] == 203 % 16
    assert all((b[0][:, 0, 0, 0] == b[1] % 256).all() for b in got)


def test_drop_last_and_len():
    with DataLoader(Squares(50), batch_size=16, drop_last=True, num_workers=2, device="cpu") as dl:
        assert len(dl) == 3
        batches = collect(dl)
    assert [len(b[1]) for b in batches] == [16, 16, 16]
    assert len(DataLoader(Squares(50), batch_size=16, device="cpu")) == 4


def test_out_of_order_delivery_covers_every_index_once():
    with DataLoader(Squares(300), batch_size=7, shuffle=True, seed=2, num_workers=3, in_order=False, device="cpu") as dl:
        labels = np.concatenate([y for _, y in dl])
    assert sorted(labels.tolist()) == list(range(300))


def test_epochs_reshuffle_and_set_epoch_replays():
    dl = DataLoader(Squares(40), batch_size=40, shuffle=True, seed=5, device="cpu")
    e0 = next(iter(dl))[1]
    e1 = next(iter(dl))[1]
    assert not np.array_equal(e0, e1)
    dl.set_epoch(0)
    assert np.array_equal(next(iter(dl))[1], e0)
    assert dl.epoch == 1
    dl.close()


def test_structures_are_kept_dict_tuple_scalars_namedtuple():
    with DataLoader(DictSamples(10), batch_size=4, num_workers=2, device="cpu", output="numpy") as dl:
        b = next(iter(dl))
    assert set(b) == {"x", "meta"}
    assert b["x"].dtype == np.float32 and b["x"].shape == (4, 2)
    i, half, even = b["meta"]
    assert i.dtype == np.int64 and half.dtype == np.float64 and even.dtype == np.bool_
    assert even.tolist() == [True, False, True, False]
    with DataLoader(NamedSamples(5), batch_size=5, device="cpu") as dl:
        p = next(iter(dl))
    assert isinstance(p, Pair) and p.image.shape == (5, 3) and p.label.tolist() == [0, 1, 2, 3, 4]


def test_getitems_is_used_when_present():
    with DataLoader(BulkSamples(20), batch_size=8, num_workers=2, device="cpu") as dl:
        labels = np.concatenate([y for _, y in dl])
    assert labels.tolist() == [i + 1000 for i in range(20)]


def test_custom_collate_fn_with_workers():
    kw = dict(batch_size=8, collate_fn=to_float, device="cpu")
    ref = collect(DataLoader(Squares(30), **kw))
    with DataLoader(Squares(30), num_workers=2, **kw) as dl:
        got = collect(dl)
    assert_same(ref, got)
    assert got[0][0].dtype == np.float32 and got[0][1].dtype == np.int32


def test_batch_transform_results_do_not_depend_on_worker_count():
    kw = dict(batch_size=8, shuffle=True, seed=9, batch_transform=NoisyFlip(), device="cpu")
    ref = collect(DataLoader(Squares(45), num_workers=0, **kw))
    assert ref[0][0].shape == (8, 3, 4, 4) and ref[0][0].dtype == np.float32
    for nw in (1, 3):
        with DataLoader(Squares(45), num_workers=nw, **kw) as dl:
            assert_same(ref, collect(dl))
    dl = DataLoader(Squares(45), num_workers=0, **kw)
    dl.set_epoch(1)
    assert not np.array_equal(collect(dl)[0][1], ref[0][1])


def test_worker_init_fn_and_worker_info():
    with DataLoader(WorkerIds(24), batch_size=2, num_workers=2, worker_init_fn=remember_worker, device="cpu") as dl:
        tags = set(np.concatenate([y for _, y in dl]).tolist())
    # every batch, the first included, is made in a worker (never -1: the main process) whose init saw its own id
    assert tags == {0, 101}


@pytest.mark.process_only("worker_pids() are processes; test_loader_threads checks the threads")
def test_persistent_workers_survive_epochs_and_others_end_with_them():
    with DataLoader(Squares(40), batch_size=8, num_workers=2, persistent_workers=True, device="cpu") as dl:
        collect(dl)
        pids = dl.worker_pids()
        assert len(pids) == 2
        collect(dl)
        assert dl.worker_pids() == pids
    assert dl.worker_pids() == []
    with DataLoader(Squares(40), batch_size=8, num_workers=2, device="cpu") as dl:
        it = iter(dl)
        next(it)
        pids = dl.worker_pids()
        assert len(pids) == 2
        list(it)
        assert dl.worker_pids() == []
        assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_batches_are_copies_by_default_and_views_with_zero_copy():
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cpu", output="numpy") as dl:
        kept = list(dl)  # held across the whole epoch: the ring slots were reused meanwhile
    for b, (x, y) in enumerate(kept):
        assert y.tolist() == list(range(b * 8, b * 8 + 8)) and (x[:, 0, 0, 0] == y).all()
        assert x.flags.writeable
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cpu", zero_copy=True, output="numpy") as dl:
        for b, (x, y) in enumerate(dl):
            assert not x.flags.writeable and not x.flags.owndata
            assert y.tolist() == list(range(b * 8, b * 8 + 8)) and (x[:, 0, 0, 0] == y).all()


@pytest.mark.process_only("a thread ring is this process's anonymous memory, shared with no process")
def test_one_ring_with_the_expected_slots_is_freed_after():
    before = live_segments(os.getpid())
    with DataLoader(Squares(100), batch_size=10, num_workers=3, prefetch_factor=2, device="cpu") as dl:
        it = iter(dl)
        next(it)
        new = live_segments(os.getpid()) - before
        (name,) = new
        assert name.startswith("memfd:")  # anonymous memory, no name in /dev/shm
        size = segment_bytes(name)
        assert size == 4096 + 6 * dl.layout.slot_bytes
        assert dl.layout.slot_bytes % 4096 == 0
        assert all(f.offset % 256 == 0 for f in dl.layout.fields)
        list(it)
    assert live_segments(os.getpid()) == before


def test_layout_mismatch_names_the_sample_and_both_shapes():
    for nw in (0, 2):
        with DataLoader(BadShapeAt(40, bad=21), batch_size=8, num_workers=nw, device="cpu") as dl:
            with pytest.raises(WorkerError, match=r"sample index 21.*expected shape \(4, 4, 3\).*got shape \(2, 4, 3\)") as ei:
                collect(dl)
        assert ei.value.sample_index == 21
    with DataLoader(BadShapeAt(40, bad=30, dtype_only=True), batch_size=8, num_workers=2, device="cpu") as dl:
        with pytest.raises(WorkerError, match=r"sample index 30.*dtype uint8.*dtype float32"):
            collect(dl)


def test_str_fields_are_gathered_as_torch_gathers_them_and_unbatchable_fields_are_a_clear_error():
    for nw in (0, 2):
        with DataLoader(Strings(4), batch_size=2, num_workers=nw, device="cpu") as dl:
            names, labels = next(iter(dl))
        assert names == ("file0.png", "file1.png") and labels.tolist() == [0, 1]  # a tuple sample's column: torch's zip
        with pytest.raises(WorkerError, match="sample index 0: a NoneType field"):
            collect(DataLoader(Nones(4), batch_size=2, num_workers=nw, device="cpu"))


@pytest.mark.process_only("start methods are for processes")
def test_forkserver_and_spawn_workers_match_and_never_import_cupy():
    ref = collect(DataLoader(Squares(30), batch_size=8, device="cpu"))
    for method in ("forkserver", "spawn"):
        with DataLoader(Squares(30), batch_size=8, num_workers=2, multiprocessing_context=method, device="cpu") as dl:
            assert_same(ref, collect(dl))
    with DataLoader(CupyImported(12), batch_size=2, num_workers=2, multiprocessing_context="forkserver", device="cpu") as dl:
        flags = np.concatenate([y for _, y in dl])[2:]  # batch 0 (2 samples) is made in the main process
    assert flags.tolist() == [0] * 10


@pytest.mark.process_only("start methods are for processes")
def test_default_start_method_is_fork_without_cuda():
    if cuda.cuda_may_be_initialized():
        pytest.skip("CUDA is live here: the default is forkserver")
    assert DataLoader(Squares(4), device="cpu").start_method == "fork"


def test_empty_dataset_gives_no_batches():
    with DataLoader(Squares(0), batch_size=4, num_workers=2, device="cpu") as dl:
        assert len(dl) == 0 and list(dl) == []


def test_live_iterators_each_get_the_whole_epoch_and_close_is_final():
    ref = collect(DataLoader(Squares(40), batch_size=4, device="cpu"))
    dl = DataLoader(Squares(40), batch_size=4, num_workers=2, device="cpu")
    first = iter(dl)
    head = collect([next(first)])
    assert_same(collect(dl), ref)  # a second live iterator: its own workers, the whole epoch
    assert_same(head + collect(first), ref)  # the first one goes on where it was
    with DataLoader(Squares(40), batch_size=4, num_workers=2, persistent_workers=True, device="cpu") as kept:
        first = iter(kept)
        next(first)
        assert_same(collect(kept), ref)
        assert list(first) == []  # one set of persistent workers: a new iteration ends the previous one
    made = iter(dl)
    dl.close()
    dl.close()
    with pytest.raises(LoaderError, match="closed"):
        iter(dl)
    for _ in range(2):  # an iterator made before the close, asked twice: refused each time, no epoch run
        with pytest.raises(LoaderError, match="this DataLoader is closed"):
            next(made)


def test_cpu_loader_reports_no_pin_path():
    assert DataLoader(Squares(4), device="cpu", pin_memory=True).pin_path == "none"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(num_workers=-1), "num_workers"),
        (dict(num_workers="many"), "num_workers"),
        (dict(prefetch_factor=0), "prefetch_factor"),
        (dict(device="tpu"), "device"),
        (dict(timeout=-1), "timeout"),
        (dict(pin_memory="yes"), "pin_memory"),
        (dict(multiprocessing_context="teleport", num_workers=1), "valid start method"),
        (dict(seed=-1), "seed"),
        (dict(collate_fn=3), "collate_fn"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(Squares(4), **kwargs)


def test_not_a_dataset_is_a_value_error():
    with pytest.raises(ValueError, match="length"):
        DataLoader(object())


def test_cuda_device_without_a_gpu_says_why():
    if cuda.gpu_status().available:
        pytest.skip("a GPU is available here")
    with pytest.raises(NoGPUError):
        DataLoader(Squares(4), device="cuda")
    assert DataLoader(Squares(4)).device == "cpu"


def test_default_collate_is_strict_on_both_paths():
    from cupy_nwt.errors import BatchLayoutError
    from cupy_nwt.loader.ring.collate import default_collate

    img = np.zeros((2, 2), np.uint8)
    x, y = default_collate([(img, 1), (img, np.int64(2))])  # a NumPy int64 scalar fits an int64 column
    assert y.tolist() == [1, 2] and x.shape == (2, 2, 2)
    cases = [
        ([(img, 1), (img, 2.5)], r"sample index 1, field \[1\]: expected shape \(\) dtype int64, got shape \(\) dtype float64"),
        ([(img, 1), (img.astype(np.int8), 2)], r"sample index 1, field \[0\].*dtype uint8.*dtype int8"),
        ([(img, 1), (img, 2**70)], r"sample index 1, field \[1\]"),
        ([(img, 1), (img, (2, 3))], r"sample index 1 has the structure \(array, \(array, array\)\)"),
        ([{"a": img}, {"b": img}], r"sample index 1 has the structure \{'b': array\}"),
    ]
    for samples, match in cases:
        with pytest.raises(BatchLayoutError, match=match):
            default_collate(samples)
