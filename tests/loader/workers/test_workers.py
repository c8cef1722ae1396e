"""Workers do all the work; any batch a collate_fn returns travels; errors, timeouts and dead workers as in PyTorch."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections import namedtuple

import numpy as np
import pytest
from test_faults import NO_HANG_S, FailsAt, Slow, clean  # noqa: F401 - clean: the fixture used below
from toy_data import Squares

from cupy_nwt import DataLoader, LoaderTimeoutError, WorkerDiedError, WorkerError, default_collate

pytestmark = pytest.mark.usefixtures("worker_type")

Point = namedtuple("Point", "x y")


class MainForbidden(Squares):
    """Raises if ``__getitem__`` runs in the process that built it."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.parent = os.getpid(), threading.get_ident()

    def __getitem__(self, i: int):
        if (os.getpid(), threading.get_ident()) == self.parent:
            raise AssertionError(f"__getitem__({i}) ran in the main process")
        return super().__getitem__(i)


class DiesAtOnce(Squares):
    def __getitem__(self, i: int):
        os._exit(3)


class ShrinksAt8(Squares):
    """Samples 8.. are smaller: whole batches of another shape, each consistent in itself."""

    def __getitem__(self, i: int):
        img, y = super().__getitem__(i)
        return (img if i < 8 else img[:2]), y


class Meta:
    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Meta) and other.n == self.n


def with_meta(samples):
    return {"x": np.stack([s[0] for s in samples]), "names": [f"s{s[1]}" for s in samples],
            "meta": Meta(len(samples)), "none": None}


def padded(samples):
    """Pads each batch to its own longest sample: a different shape per batch."""
    width = max(len(s[0]) for s in samples)
    out = np.zeros((len(samples), width), np.int32)
    for row, (v, _) in enumerate(samples):
        out[row, :len(v)] = v
    return out, np.array([s[1] for s in samples])


def unpicklable(samples):
    return threading.Lock()


class Handle:
    def __reduce__(self):
        raise AttributeError("no handle here")  # names no pickling, as a local object's failure on Python 3.13


def holds_handle(samples):
    return {"n": len(samples), "handle": Handle()}


class Lengths:
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i):
        return np.full(i % 5 + 1, i, np.int32), i


def test_the_main_process_never_calls_getitem_with_workers():
    with DataLoader(MainForbidden(40), batch_size=4, shuffle=True, seed=1, num_workers=2, persistent_workers=True,
                    device="cpu") as dl:
        for _ in range(2):
            assert sorted(np.concatenate([y for _, y in dl]).tolist()) == list(range(40))


@pytest.mark.usefixtures("clean")
def test_a_sample_that_never_returns_in_batch_0_times_out():
    dl = DataLoader(Slow(8, delay=600.0, at=0), batch_size=2, num_workers=1, timeout=1, device="cpu")
    t0 = time.monotonic()
    with pytest.raises(LoaderTimeoutError, match=r"timeout=1.0 s.*waiting for batch 0"):
        next(iter(dl))
    assert time.monotonic() - t0 < NO_HANG_S  # a hang guard, not a speed check
    dl.close()


def test_timeout_0_means_no_limit():
    with DataLoader(Slow(4, delay=0.2), batch_size=2, num_workers=1, timeout=0, device="cpu") as dl:
        assert [y.tolist() for _, y in dl] == [[0, 1], [2, 3]]


@pytest.mark.usefixtures("clean")
@pytest.mark.process_only("os._exit in a thread ends the whole process")
def test_a_worker_dying_before_the_first_batch_is_reported():
    with DataLoader(DiesAtOnce(8), batch_size=2, num_workers=2, device="cpu") as dl:
        with pytest.raises(WorkerDiedError, match="exit code 3"):
            list(dl)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.usefixtures("clean")
def test_after_a_failed_batch_the_next_call_goes_on_with_the_following_one(num_workers):
    with DataLoader(FailsAt(32, bad=13), batch_size=4, num_workers=num_workers, device="cpu") as dl:
        it = iter(dl)
        before = [next(it)[1].tolist() for _ in range(3)]
        with pytest.raises(WorkerError, match=r"failed on batch 3 at sample index 13: ValueError: cannot read") as ei:
            next(it)
        assert "in explode" in ei.value.traceback_text
        after = [y.tolist() for _, y in it]
    assert before + after == [list(range(b, b + 4)) for b in range(0, 32, 4) if b != 12]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_fn_may_return_any_picklable_object(num_workers):
    with DataLoader(Squares(10), batch_size=4, collate_fn=with_meta, num_workers=num_workers, device="cpu") as dl:
        got = list(dl)
        if num_workers:
            assert [f.path for f in dl.layout.fields] == ["['x']"]  # the array goes through the ring
    assert [b["names"] for b in got] == [["s0", "s1", "s2", "s3"], ["s4", "s5", "s6", "s7"], ["s8", "s9"]]
    assert [b["meta"] for b in got] == [Meta(4), Meta(4), Meta(2)] and all(b["none"] is None for b in got)
    assert [b["x"][:, 0, 0, 0].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_of_changing_shapes_are_delivered(num_workers):
    with DataLoader(Lengths(), batch_size=3, collate_fn=padded, num_workers=num_workers, device="cpu") as dl:
        got = list(dl)
    assert [x.shape for x, _ in got] == [(3, 3), (3, 5), (3, 4), (3, 5)]
    assert all((x.max(axis=1) == y).all() for x, y in got)
    with DataLoader(ShrinksAt8(16), batch_size=4, num_workers=num_workers, device="cpu") as dl:
        shapes = [x.shape for x, _ in dl]
    assert shapes == [(4, 4, 4, 3), (4, 4, 4, 3), (4, 2, 4, 3), (4, 2, 4, 3)]


@pytest.mark.process_only("threads hand batches over unpickled; test_loader_threads checks that")
@pytest.mark.parametrize("collate", [unpicklable, holds_handle])
def test_an_unpicklable_batch_is_that_batch_s_error(collate):
    with DataLoader(Squares(8), batch_size=4, collate_fn=collate, num_workers=1, device="cpu") as dl:
        with pytest.raises(WorkerError, match="failed on batch 0: PicklingError: the batch does not pickle") as caught:
            next(iter(dl))
    assert isinstance(caught.value, pickle.PicklingError)


def test_default_collate_follows_pytorch_on_numpy():
    samples = [{"img": np.full((2,), i, np.uint8), "pair": (i, i / 2), "p": Point(i, [True, b"b"]), "name": f"n{i}"}
               for i in range(3)]
    b = default_collate(samples)
    assert set(b) == {"img", "pair", "p", "name"}
    assert b["img"].shape == (3, 2) and b["img"].dtype == np.uint8
    assert isinstance(b["pair"], tuple) and b["pair"][0].dtype == np.int64 and b["pair"][1].tolist() == [0, 0.5, 1]
    assert isinstance(b["p"], Point) and b["p"].x.tolist() == [0, 1, 2]
    assert isinstance(b["p"].y, list) and b["p"].y[0].dtype == np.bool_ and b["p"].y[1] == (b"b",) * 3
    assert b["name"] == ["n0", "n1", "n2"]
    assert default_collate([1.5, 2.5]).dtype == np.float64 and default_collate(["a", "b"]) == ["a", "b"]
