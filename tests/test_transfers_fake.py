"""What the GPU commands share, without a GPU: the copy burst of one timed sample, running on a device, the devices described."""

from __future__ import annotations

import types

import numpy as np
import pytest

from cupy_nwt import cuda
from cupy_nwt.experiments import transfers


@pytest.fixture
def copies(monkeypatch) -> list[tuple]:
    log: list[tuple] = []
    monkeypatch.setattr(cuda, "memcpy_h2d", lambda dst, src, stream=None: log.append(("h2d", dst, src, stream)))
    monkeypatch.setattr(cuda, "memcpy_d2h", lambda dst, src, stream=None: log.append(("d2h", dst, src, stream)))
    return log


def test_a_burst_issues_count_copies_in_its_direction_on_the_stream_it_is_given(copies):
    dev, host, s = object(), np.zeros(4, np.uint8), object()
    transfers.repeated_copy("h2d", dev, host, 3)(s)
    assert copies == [("h2d", dev, host, s)] * 3
    copies.clear()
    transfers.repeated_copy("d2h", dev, host, 2)(s)
    assert copies == [("d2h", host, dev, s)] * 2
    with pytest.raises(ValueError, match="direction"):
        transfers.repeated_copy("up", dev, host, 1)


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
