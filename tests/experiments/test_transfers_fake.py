"""What the GPU commands share, without a GPU: the copy burst of one timed sample, running on a device, the devices described."""

from __future__ import annotations

import types

import numpy as np
import pytest
from test_cuda_fake import FakeArray

from cupy_nwt import cuda
from cupy_nwt.experiments import transfers


class RawCopies:
    """Just the CuPy runtime a burst of copies uses: every cudaMemcpyAsync is logged, nothing else exists."""

    ndarray = FakeArray

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(
            memcpyHostToDevice=1, memcpyDeviceToHost=2,
            memcpyAsync=lambda dst, src, n, kind, stream: self.log.append((dst, src, n, kind, stream))))


@pytest.fixture
def raw(monkeypatch) -> RawCopies:
    f = RawCopies()
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    return f


def test_a_burst_is_worked_out_once_and_then_only_issues_raw_copies(raw):
    """A 4 KiB copy lasts 1.5-3 us: the timed call may hold nothing but the copies (no checks, no pointer
    arithmetic, no CuPy wrapper), or the figure is Python's. FakeArray has no CuPy copy methods at all."""
    dev, host, s = FakeArray(4096, np.uint8, 0), np.zeros(4096, np.uint8), types.SimpleNamespace(ptr=77)
    up = transfers.repeated_copy("h2d", dev, host, 3, s)
    down = transfers.repeated_copy("d2h", dev, host, 2, s)
    assert raw.log == []  # building a burst issues nothing
    up()
    assert raw.log == [(dev.data.ptr, host.ctypes.data, 4096, 1, 77)] * 3
    raw.log.clear()
    down()
    assert raw.log == [(host.ctypes.data, dev.data.ptr, 4096, 2, 77)] * 2
    with pytest.raises(ValueError, match="direction"):
        transfers.repeated_copy("up", dev, host, 1, s)


def test_a_burst_refuses_mismatched_or_strided_buffers_before_any_copy(raw):
    s = types.SimpleNamespace(ptr=1)
    with pytest.raises(ValueError, match="size mismatch"):
        cuda.CopyBurst("h2d", [(FakeArray(8, np.uint8, 0), np.zeros(4, np.uint8))], s)
    with pytest.raises(ValueError, match="C-contiguous"):
        cuda.CopyBurst("d2h", [(np.zeros(8, np.uint8)[::2], FakeArray(4, np.uint8, 0))], s)
    assert raw.log == []


class FakePools:
    def __init__(self, log: list[str], name: str) -> None:
        self.free_all_blocks = lambda: log.append(f"free {name}")


@pytest.fixture
def gpus(monkeypatch) -> list[str]:
    """Two fake GPUs; the log shows which device was made current and when the pools were freed."""
    log: list[str] = []
    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda d: types.SimpleNamespace(use=lambda: log.append(f"use {d}"))),
        get_default_memory_pool=lambda: FakePools(log, "device pool"),
        get_default_pinned_memory_pool=lambda: FakePools(log, "pinned pool"),
    )
    monkeypatch.setattr(cuda, "_cupy", lambda: fake)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 2))
    return log


def test_an_experiment_runs_on_its_device_and_gives_the_pools_back_even_when_it_fails(gpus):
    ticks: list[str] = []
    assert transfers.run_on_device(1, lambda tick: tick("one") or 42, ticks.append) == 42
    assert ticks == ["one"] and gpus == ["use 1", "free device pool", "free pinned pool"]
    gpus.clear()

    def failing(tick) -> None:
        tick("no one listens")  # no progress given: the default takes the ticks
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        transfers.run_on_device(0, failing)
    assert gpus == ["use 0", "free device pool", "free pinned pool"]


def test_an_experiment_on_a_missing_device_is_refused_before_any_gpu_work(gpus):
    with pytest.raises(ValueError, match="there is no GPU 2: this machine has 2"):
        transfers.run_on_device(2, lambda tick: pytest.fail("ran"))
    assert gpus == []


def test_the_devices_described_are_every_usable_one_or_none(monkeypatch):
    monkeypatch.setattr(cuda, "device_info", lambda i: f"GPU {i}")
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 3))
    assert cuda.all_device_info() == ["GPU 0", "GPU 1", "GPU 2"]
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test", 3))
    assert cuda.all_device_info() == []
