"""The prefetcher under a training loop that queues its steps instead of waiting for each one.

A queued step still reads its batch on the device after the host has dropped the batch, and the
freed memory goes back to the pool of the stream it came from: the prefetcher may be handed that
memory for a later batch at once. It is safe only because the copy into it waits for everything the
consumer's stream had queued when the memory was taken (``DevicePrefetcher._issue``: the side stream
waits on an event of the consumer's stream recorded after the allocation).

``PooledGpu`` stands in for CUDA with a device memory pool per stream (freed blocks reused first,
as CuPy's are) and the harshest legal schedule for that reuse: the side stream's copies run as soon
as everything they wait for has run, the consumer's steps only when the host waits for them. A step
reads the block under its batch when it runs, not when it is queued, so a copy that overtakes a
queued step shows up as the wrong bytes.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from typing import Any

import numpy as np
import pytest
from toy_data import Squares

from cupy_nwt import DataLoader
from cupy_nwt.loader import LoaderParts

GARBAGE = 0xEE


class Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ops: list[Any] = []
        self.done_upto = 0

    def run_to(self, pos: int) -> None:
        while self.done_upto < pos:
            op, self.ops[self.done_upto] = self.ops[self.done_upto], None  # a run op holds no memory
            self.done_upto += 1
            op()


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream, self.pos = stream, len(stream.ops)

    def reached(self) -> bool:
        return self.stream.done_upto >= self.pos


class Registration:
    def close(self) -> None:
        pass


class Owned(np.ndarray):
    """A view whose DLPack capsule keeps the device array it belongs to alive, as CuPy's keeps its array."""

    owner: Any = None


class DeviceArray:
    """Device memory as the GPU sees it: a block of the pool, back in its stream's pool once dropped (and
    once the last framework tensor made over it through DLPack is gone)."""

    def __init__(self, block: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.block, self.shape, self.dtype = block, shape, np.dtype(dtype)

    def view(self) -> np.ndarray:
        return self.block[: int(np.prod(self.shape)) * self.dtype.itemsize].view(self.dtype).reshape(self.shape)

    def __dlpack__(self, **kw: Any) -> Any:
        v = self.view().view(Owned)
        v.owner = self
        return v.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.view().__dlpack_device__()


class PooledGpu:
    """The prefetcher's ops over streams that run in order, events, and a device pool per stream."""

    def __init__(self) -> None:
        self.consumer = Stream("consumer")
        self.pools: dict[str, list[np.ndarray]] = {}
        self.allocated = self.reused = 0
        self.side: list[Stream] = []
        self.framework: dict[str, Stream] = {}  # a framework's current stream, where it is not the consumer's
        self.blocks: dict[int, np.ndarray] = {}  # address -> block, to find the memory under a torch tensor

    # -- PrefetchOps
    def device_count(self) -> int:
        return 1

    def device_scope(self, device_id: int):
        return contextlib.nullcontext()

    def current_stream(self) -> Stream:
        return self.consumer

    def framework_stream(self, framework: str) -> Stream | None:
        return self.framework.get(framework)

    def new_stream(self) -> Stream:
        s = Stream("side")
        self.side.append(s)
        return s

    def record(self, stream: Stream) -> Event:
        return Event(stream)

    def wait(self, stream: Stream, event: Event) -> None:
        stream.ops.append(lambda: self._reach(event))
        self._eager(stream)

    def done(self, event: Event) -> bool:
        return event.reached()

    def sync(self, event: Event) -> None:
        self._reach(event)

    def empty(self, shape, dtype, stream: Stream) -> DeviceArray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        pool = self.pools.setdefault(stream.name, [])
        fits = [i for i, b in enumerate(pool) if b.nbytes == nbytes]
        if fits:
            block = pool.pop(fits[-1])  # the most recently freed first
            self.reused += 1
        else:
            block = np.full(nbytes, GARBAGE, np.uint8)
            self.blocks[block.ctypes.data] = block
            self.allocated += 1
        arr = DeviceArray(block, tuple(shape), dtype)
        weakref.finalize(arr, pool.append, block)
        return arr

    def h2d(self, dst: DeviceArray, src: np.ndarray, stream: Stream) -> None:
        block, data = dst.block, np.ascontiguousarray(src).view(np.uint8).reshape(-1).copy()
        stream.ops.append(lambda: block.__setitem__(slice(0, data.nbytes), data))
        self._eager(stream)

    def register(self, buffer) -> Registration:
        return Registration()

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.full(nbytes, GARBAGE, np.uint8)

    # -- the schedule
    def _reach(self, event: Event) -> None:
        event.stream.run_to(event.pos)

    def _eager(self, stream: Stream) -> None:
        if stream is not self.consumer:
            stream.run_to(len(stream.ops))

    # -- the training loop's side
    def memory(self, a: Any) -> tuple[np.ndarray, tuple[int, ...], np.dtype]:
        """The block under a device array or a torch tensor made over one, its shape and dtype."""
        if isinstance(a, DeviceArray):
            return a.block, a.shape, a.dtype
        return self.blocks[a.data_ptr()], tuple(a.shape), a[:0].numpy().dtype

    def step(self, batch, seen: list, stream: Stream | None = None) -> Event:
        """Queue a step that reads ``batch`` on ``stream`` (the consumer's); the batch's memory, not the batch object."""
        parts = [self.memory(a) for a in batch]
        stream = stream if stream is not None else self.consumer

        def run() -> None:
            seen.append(tuple(DeviceArray(b, s, d).view().copy() for b, s, d in parts))

        stream.ops.append(run)
        return Event(stream)


def train(loader, gpu: PooledGpu, depth: int, stream: Stream | None = None) -> list:
    """A loop that never reads a step back: before queueing step k it waits only for step k - depth."""
    seen: list = []
    queue: deque[Event] = deque()
    for batch in loader:
        while len(queue) >= depth:
            gpu.sync(queue.popleft())
        queue.append(gpu.step(batch, seen, stream))
    for ev in queue:
        gpu.sync(ev)
    return seen


KW: dict[str, Any] = dict(batch_size=4, shuffle=True, seed=5)


def reference(n: int) -> list:
    return [(np.asarray(x), np.asarray(y)) for x, y in DataLoader(Squares(n, modulo=200), device="cpu", **KW)]


@pytest.mark.parametrize("pin", [True, "staging", False])
@pytest.mark.parametrize("depth", [2, 3])
def test_a_queued_step_reads_its_own_batch_though_the_host_freed_it(pin, depth):
    gpu = PooledGpu()
    with DataLoader(Squares(41, modulo=200), device="cuda", output="cupy", pin_memory=pin, parts=LoaderParts(ops=gpu), **KW) as dl:
        got = train(dl, gpu, depth)
    ref = reference(41)
    assert gpu.reused > 0, "no batch memory was reused: the test would prove nothing"
    assert len(got) == len(ref)
    for k, ((x, y), (rx, ry)) in enumerate(zip(got, ref)):
        assert np.array_equal(y, ry) and np.array_equal(x, rx), f"step {k} read another batch's bytes"


@pytest.mark.parametrize("pin", [True, "staging"])
def test_a_torch_step_queued_on_torchs_own_stream_reads_its_own_batch(pin):
    """output="torch" in a loop under ``torch.cuda.stream(s)``: the steps run on torch's stream, not on the
    stream current for CuPy. A tensor the host drops hands its memory back at once, so the copy of a later
    batch into that memory must wait for torch's stream too, not only for CuPy's."""
    torch = pytest.importorskip("torch")
    gpu = PooledGpu()
    on_torch = gpu.framework["torch"] = Stream("torch")
    with DataLoader(Squares(41, modulo=200), device="cuda", output="torch", pin_memory=pin, parts=LoaderParts(ops=gpu),
                    **KW) as dl:
        assert torch.is_tensor(next(iter(dl))[0])
        dl.set_epoch(0)
        got = train(dl, gpu, 2, on_torch)
    ref = reference(41)
    assert gpu.reused > 0, "no batch memory was reused: the test would prove nothing"
    assert len(got) == len(ref)
    for k, ((x, y), (rx, ry)) in enumerate(zip(got, ref)):
        assert np.array_equal(y, ry) and np.array_equal(x, rx), f"step {k} read another batch's bytes"


def test_a_queued_step_reads_its_own_batch_with_process_workers_over_two_epochs():
    gpu = PooledGpu()
    with DataLoader(Squares(30, modulo=200), device="cuda", output="cupy", pin_memory=True, num_workers=2, prefetch_factor=1,
                    persistent_workers=True, multiprocessing_context="fork", parts=LoaderParts(ops=gpu), **KW) as dl:
        got = train(dl, gpu, 2)
        dl.set_epoch(1)
        got += train(dl, gpu, 2)
    ref = reference(30)
    with DataLoader(Squares(30, modulo=200), device="cpu", **KW) as host:
        host.set_epoch(1)
        ref += [(np.asarray(x), np.asarray(y)) for x, y in host]
    assert gpu.reused > 0 and len(got) == len(ref)
    for (x, y), (rx, ry) in zip(got, ref):
        assert np.array_equal(y, ry) and np.array_equal(x, rx)


def test_the_schedule_catches_a_copy_that_overtakes_a_queued_step():
    """The stand-in itself: a copy into memory a queued step still reads, with no wait between, is caught."""
    gpu = PooledGpu()
    side = gpu.new_stream()
    seen: list = []
    a = gpu.empty((4,), np.uint8, gpu.consumer)
    gpu.h2d(a, np.full(4, 1, np.uint8), side)
    gpu.wait(gpu.consumer, gpu.record(side))
    step = gpu.step((a,), seen)
    del a  # the host is done with the batch; its step is still queued
    b = gpu.empty((4,), np.uint8, gpu.consumer)
    assert gpu.reused == 1
    gpu.h2d(b, np.full(4, 2, np.uint8), side)  # no wait on the consumer first
    gpu.sync(step)
    assert seen[0][0].tolist() == [2, 2, 2, 2]  # the step read the later batch: the hazard is visible


@pytest.mark.gpu
def test_gpu_queued_steps_read_their_own_batches():
    """The real prefetcher and CuPy's pool: each step spins 2 ms before it sums its batch, so the host
    runs two steps ahead and drops batches whose sums are still queued."""
    from cupy_nwt import cuda
    from cupy_nwt.experiments.kernels import SpinKernel

    spin = SpinKernel()
    sums, queue = [], deque()
    with DataLoader(Squares(203, modulo=200), device="cuda", output="cupy", pin_memory=True, num_workers=2, **KW) as dl:
        for x, _ in dl:
            while len(queue) >= 2:
                queue.popleft().synchronize()
            stream = cuda.current_stream()
            spin.hold(stream, 0.002)
            sums.append(x.astype("int64").sum())
            done = cuda.event(timing=False)
            done.record(stream)
            queue.append(done)
    assert [int(s) for s in sums] == [int(x.astype(np.int64).sum()) for x, _ in reference(203)]


@pytest.mark.gpu
def test_gpu_torch_steps_on_their_own_stream_read_their_own_batches():
    """Under ``torch.cuda.stream(s)`` each step sleeps on s before it sums its batch, so the host runs two steps
    ahead and drops tensors whose sums are still queued on s (not on CuPy's current stream)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is built without CUDA here")
    s = torch.cuda.Stream()
    sums, queue = [], deque()
    with torch.cuda.stream(s), DataLoader(Squares(203, modulo=200), device="cuda", output="torch", pin_memory=True,
                                          num_workers=2, **KW) as dl:
        for x, _ in dl:
            while len(queue) >= 2:
                queue.popleft().synchronize()
            torch.cuda._sleep(4_000_000)
            sums.append(x.to(torch.int64).sum())
            done = torch.cuda.Event()
            done.record(s)
            queue.append(done)
    torch.cuda.synchronize()
    assert [int(t) for t in sums] == [int(x.astype(np.int64).sum()) for x, _ in reference(203)]
