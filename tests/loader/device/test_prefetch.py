"""The CUDA-stream prefetcher.

Without a GPU its stream/event logic runs against ``LazyCuda``: copies are queued per stream and
only executed when their event is synchronised or polled done, just as a real copy engine may run
late. Releasing a ring slot before its copy ran, or handing out a batch the consumer stream was not
told to wait for, then shows up as wrong data. The ``gpu`` tests run the real thing.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from toy_data import Squares

from cupy_nwt import CupyNwtError, DataLoader, LoaderError, cuda
from cupy_nwt.loader import LoaderParts
from cupy_nwt.loader.device.prefetch import STAGING_BUFFERS, CudaOps, DevicePrefetcher
from cupy_nwt.loader.epoch.sources import InlineSource
from cupy_nwt.loader.plan.order import BatchSampler
from cupy_nwt.loader.ring.ring import Ring, SlotLayout
from cupy_nwt.loader.workers.maker import BatchMaker

GARBAGE = 0xEE


class Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: list = []
        self.done_upto = 0

    def run_to(self, pos: int) -> None:
        while self.done_upto < pos:
            self.queue[self.done_upto]()
            self.done_upto += 1


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream, self.pos, self.polls = stream, len(stream.queue), 0


class Registration:
    def __init__(self) -> None:
        self.open = True

    def close(self) -> None:
        self.open = False


class LazyCuda:
    """Prefetcher ops whose copies run only when someone synchronises or polls (twice) their event."""

    def __init__(self, refuse_registration: bool = False) -> None:
        self.consumer = Stream("consumer")
        self.refuse = refuse_registration
        self.log: list[tuple] = []
        self.registrations: list[Registration] = []
        self.pinned_count = 0

    def current_stream(self):
        return self.consumer

    def framework_stream(self, framework: str):
        return None  # every framework's kernels on the consumer stream

    def new_stream(self):
        return Stream("side")

    def record(self, stream):
        return Event(stream)

    def wait(self, stream, event) -> None:
        self.log.append(("wait", stream.name, event))

    def done(self, event) -> bool:
        event.polls += 1
        if event.polls >= 2:
            event.stream.run_to(event.pos)
        return event.stream.done_upto >= event.pos

    def sync(self, event) -> None:
        event.stream.run_to(event.pos)

    def empty(self, shape, dtype, stream):
        self.log.append(("alloc", stream.name))
        return np.full(shape, GARBAGE, dtype=dtype)

    def h2d(self, dst, src, stream) -> None:
        self.log.append(("h2d", stream.name))
        stream.queue.append(lambda: np.copyto(dst, src))

    def register(self, buffer):
        if self.refuse:
            raise RuntimeError("cudaErrorHostMemoryAlreadyRegistered")
        r = Registration()
        self.registrations.append(r)
        return r

    def pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_count += 1
        return np.full(nbytes, GARBAGE, np.uint8)

    def device_count(self) -> int:
        return 2  # stand-in GPUs 0 and 1

    def device_scope(self, device_id: int):
        return contextlib.nullcontext()

    def consume(self, batch):
        """What a kernel on the consumer stream would read: run what the consumer waited on first."""
        for kind, stream, ev in [e for e in self.log if e[0] == "wait" and e[1] == "consumer"]:
            ev.stream.run_to(ev.pos)
        self.log = [e for e in self.log if not (e[0] == "wait" and e[1] == "consumer")]
        return tuple(np.array(a, copy=True) for a in batch)


class EagerReuse(InlineSource):
    """Refills the most recently released slot first: the harshest order for a premature release."""

    def release(self, hb) -> None:
        if hb.slot is not None:
            self.free.appendleft(hb.slot)


def run(prefetcher: DevicePrefetcher, ops: LazyCuda, n: int = 37, batch_size: int = 4, stop_after: int | None = None):
    ds = Squares(n, modulo=200)
    sampler = BatchSampler(n, batch_size, shuffle=True, seed=3)
    plan = sampler.plan(0)
    maker = BatchMaker(ds, None, None)
    first = maker.make(plan.indices(0), 0)
    layout = SlotLayout.for_batch(first, sampler.max_rows)
    ring = Ring(layout, 2, shared=False)
    prefetcher.attach(ring)
    source = EagerReuse(maker, plan, ring, None)
    out = []
    gen = prefetcher.batches(source, layout)
    for b in gen:
        out.append(ops.consume(b))
        if stop_after is not None and len(out) == stop_after:
            gen.close()
            break
    expected = [(np.stack([ds[i][0] for i in idx]), idx.astype(np.int64)) for idx in plan]
    free_after = len(source.free)
    prefetcher.detach()
    ring.close()
    return out, expected, free_after


def assert_batches(out, expected):
    assert len(out) == len(expected)
    for (x, y), (ex, ey) in zip(out, expected):
        assert np.array_equal(y, ey), "batch order or labels differ"
        assert np.array_equal(x, ex), "image bytes differ: a slot was reused before its copy ran"


def test_registered_ring_copies_in_order_and_recycles_slots_only_after_the_copy():
    ops = LazyCuda()
    p = DevicePrefetcher(True, ops)
    out, expected, free_after = run(p, ops)
    assert p.pin_path == "registered"
    assert_batches(out, expected)
    assert free_after == 2
    assert ops.registrations and not any(r.open for r in ops.registrations)  # detached before unmapping


def test_device_memory_comes_from_the_consumer_stream_and_copies_wait_for_it():
    ops = LazyCuda()
    p = DevicePrefetcher(True, ops)
    run(p, ops, n=12)
    allocs = [e for e in ops.log if e[0] == "alloc"]
    assert allocs and all(e[1] == "consumer" for e in allocs)
    kinds = [(e[0], e[1]) for e in ops.log if e[0] != "alloc"]
    first_copy = kinds.index(("h2d", "side"))
    assert ("wait", "side") in kinds[:first_copy]


def test_refused_registration_falls_back_to_pinned_staging():
    ops = LazyCuda(refuse_registration=True)
    p = DevicePrefetcher(True, ops)
    out, expected, free_after = run(p, ops)
    assert p.pin_path == "staging" and "HostMemoryAlreadyRegistered" in p.pin_error
    assert_batches(out, expected)
    assert 1 <= ops.pinned_count <= STAGING_BUFFERS
    assert free_after == 2


def test_forced_staging_and_pageable_paths():
    for pin, path in (("staging", "staging"), (False, "none")):
        ops = LazyCuda()
        p = DevicePrefetcher(pin, ops)
        out, expected, _ = run(p, ops)
        assert p.pin_path == path and not ops.registrations
        assert_batches(out, expected)


def test_stopping_early_waits_for_copies_and_returns_every_slot():
    ops = LazyCuda()
    p = DevicePrefetcher(True, ops)
    out, expected, free_after = run(p, ops, stop_after=3)
    assert_batches(out, expected[:3])
    assert free_after == 2


def test_loader_with_workers_feeds_the_prefetcher_across_epochs_and_breaks():
    """The loader's worker path driving the prefetcher (lazy streams put in place of CUDA)."""
    kw = dict(batch_size=4, shuffle=True, seed=8, device="cpu")
    ref = list(DataLoader(Squares(50, modulo=200), **kw))
    ops = LazyCuda()
    dl = DataLoader(Squares(50, modulo=200), num_workers=2, prefetch_factor=1, persistent_workers=True,
                    multiprocessing_context="fork", pin_memory=True, parts=LoaderParts(ops=ops),
                    output="cupy", **{**kw, "device": "cuda"})  # the fake GPU's arrays, though torch is imported
    with dl:
        for i, b in enumerate(dl):
            if i == 3:
                break
        dl.set_epoch(0)
        got = [ops.consume(b) for b in dl]
        assert dl.pin_path == "registered" and len(dl.worker_pids()) == 2
    assert_batches(got, ref)
    assert ops.registrations and not any(r.open for r in ops.registrations)


# ---------------------------------------------------------------- on a real GPU


class Images:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), i


def host_batches(**kw):
    with DataLoader(Images(300), batch_size=32, shuffle=True, seed=4, device="cpu", output="numpy", **kw) as dl:
        return [(x, y) for x, y in dl]


@pytest.mark.gpu
@pytest.mark.parametrize("pin, path", [(True, "registered"), ("staging", "staging"), (False, "none")])
def test_gpu_batches_equal_host_batches_in_order(pin, path):
    ref = host_batches(num_workers=2)
    with DataLoader(Images(300), batch_size=32, shuffle=True, seed=4, device="cuda", num_workers=2,
                    pin_memory=pin, output="cupy") as dl:
        got = [(cuda.as_numpy(x), cuda.as_numpy(y)) for x, y in dl]
        assert dl.pin_path == path
    assert len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref):
        assert np.array_equal(y, ry) and np.array_equal(x, rx)


@pytest.mark.gpu
def test_gpu_registered_ring_is_page_locked_and_batches_are_device_arrays():
    class Registering(CudaOps):
        buffers: list = []

        def register(self, buffer):
            self.buffers.append(buffer)
            return super().register(buffer)

    ops = Registering()
    with DataLoader(Images(64), batch_size=16, device="cuda", num_workers=1, pin_memory=True, output="cupy",
                    parts=LoaderParts(ops=ops)) as dl:
        it = iter(dl)
        x, y = next(it)
        assert dl.pin_path == "registered"
        assert len(ops.buffers) == 1 and cuda.is_pinned(ops.buffers[0])  # the ring itself
        assert cuda.is_device_array(x) and cuda.is_device_array(y)
        assert x.shape == (16, 32, 32, 3) and str(x.dtype) == "uint8"
        assert hasattr(x, "__dlpack__")
        list(it)


@pytest.mark.gpu
def test_gpu_consumer_on_its_own_stream_sees_complete_batches_with_workers_zero():
    ref = host_batches()
    s = cuda.stream()
    with s:
        with DataLoader(Images(300), batch_size=32, shuffle=True, seed=4, device="cuda", pin_memory=True,
                        output="cupy") as dl:
            sums = [int((x.astype("int64") * 1).sum()) for x, _ in dl]  # kernels on s, after the wait
    assert sums == [int(rx.astype(np.int64).sum()) for rx, _ in ref]


class OutOfMemory(MemoryError):
    """As CuPy's ``OutOfMemoryError``: a ``MemoryError`` with one line that says how much."""


@pytest.mark.parametrize("pin", [True, "staging", False])
def test_a_copy_that_fails_fails_its_own_batch_in_one_line_and_the_epoch_goes_on(pin):
    """The copy of batch 3 is issued while batch 2 is handed out: its failure is batch 3's, in its turn."""

    class OomOnBatch3(LazyCuda):
        copies = 0

        def h2d(self, dst, src, stream) -> None:
            self.copies += 1
            if self.copies == 7:  # batch 3's first leaf: two leaves a batch
                raise OutOfMemory("Out of memory allocating 512 bytes (allocated so far: 4,096 bytes).")
            super().h2d(dst, src, stream)

    ops = OomOnBatch3()
    with DataLoader(Squares(40, modulo=200), batch_size=4, device="cuda", pin_memory=pin,
                    parts=LoaderParts(ops=ops)) as dl:
        it = iter(dl)
        got, failed = [], []
        for k in range(10):
            try:
                got.append(ops.consume(next(it))[1].tolist())
            except CupyNwtError as exc:
                failed.append((k, exc))
        with pytest.raises(StopIteration):
            next(it)
        assert dl.slots_in_use() == 0
    assert got == [list(range(b, b + 4)) for b in range(0, 40, 4) if b != 12]
    [(k, exc)] = failed
    assert k == 3 and isinstance(exc, MemoryError) and exc.batch_index == 3
    assert "batch 3" in str(exc) and "Out of memory allocating 512 bytes" in str(exc) and "\n" not in str(exc)


def test_a_copy_failing_on_a_broken_device_ends_the_epoch_with_that_error_in_one_line():
    """A sticky CUDA error: nothing can be waited for after it. The first error is the one reported, not a
    later wait's, and the epoch ends instead of failing every batch after it."""

    class Sticky(RuntimeError):
        pass

    class BrokenAtBatch3(LazyCuda):
        copies = 0
        broken = False

        def h2d(self, dst, src, stream) -> None:
            self.copies += 1
            if self.copies == 7:
                self.broken = True
            if self.broken:
                raise Sticky("cudaErrorIllegalAddress: an illegal memory access was encountered")
            super().h2d(dst, src, stream)

        def sync(self, event) -> None:
            if self.broken:
                raise Sticky("cudaErrorIllegalAddress: an illegal memory access was encountered (again)")
            super().sync(event)

    ops = BrokenAtBatch3()
    with DataLoader(Squares(40, modulo=200), batch_size=4, device="cuda", pin_memory=True,
                    parts=LoaderParts(ops=ops)) as dl:
        it = iter(dl)
        got = [ops.consume(next(it))[1].tolist() for _ in range(2)]
        with pytest.raises(CupyNwtError) as info:
            next(it)  # batch 2's turn issues batch 3's copy
        with pytest.raises(LoaderError, match="this iteration ended with Sticky after 2 batches"):
            next(it)  # said once, for a loop that catches errors and goes on
        with pytest.raises(StopIteration):
            next(it)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    text = str(info.value)
    assert isinstance(info.value, RuntimeError) and "batch 3" in text and "\n" not in text and "(again)" not in text


def test_a_loader_moved_to_another_gpu_copies_there_on_a_stream_of_that_gpu():
    """``device_id`` set between epochs (the next iteration uses it): an event is recorded on a stream of the
    device current at the call, as cudaEventRecord requires, so the side stream must be the new GPU's."""

    class Stray(RuntimeError):
        pass

    class TwoGpus(LazyCuda):
        def __init__(self) -> None:
            super().__init__()
            self.current = 0
            self.consumers = {d: Stream(f"consumer{d}") for d in (0, 1)}
            self.copied_on: set[int] = set()

        @contextlib.contextmanager
        def device_scope(self, device_id: int):
            before, self.current = self.current, device_id
            try:
                yield
            finally:
                self.current = before

        def current_stream(self):
            return self.consumers[self.current]

        def new_stream(self):
            s = Stream("side")
            s.device = self.current
            return s

        def record(self, stream):
            if getattr(stream, "device", self.current) != self.current:
                raise Stray("cudaErrorInvalidResourceHandle: invalid resource handle")
            return super().record(stream)

        def h2d(self, dst, src, stream) -> None:
            self.copied_on.add(stream.device)
            super().h2d(dst, src, stream)

        def consume(self, batch):
            for kind, stream, ev in [e for e in self.log if e[0] == "wait"]:
                ev.stream.run_to(ev.pos)
            return super().consume(batch)

    ops = TwoGpus()
    with DataLoader(Squares(20, modulo=200), batch_size=4, device="cuda:0", pin_memory=True,
                    parts=LoaderParts(ops=ops)) as dl:
        first = [ops.consume(b)[1].tolist() for b in dl]
        dl.device_id = 1
        ops.copied_on.clear()
        second = [ops.consume(b)[1].tolist() for b in dl]
    assert first == second == [list(range(b, b + 4)) for b in range(0, 20, 4)]
    assert ops.copied_on == {1}
