"""cuda.py against a fake CuPy that records which device is current at every CUDA call.

On a machine with several GPUs a call made with the wrong device current touches the wrong GPU;
with one GPU (or none, here) nothing shows it. The fake makes the current device visible:
registration and its undoing, the spin kernel and its sink, the no-prefetch copy, the link probe.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest
from test_transfers import _constant_result

from cupy_nwt import cuda
from cupy_nwt.experiments import transfers
from cupy_nwt.experiments.step_sim import SpinKernel
from cupy_nwt.loader.device.prefetch import CudaOps, DevicePrefetcher
from cupy_nwt.loader.ring.ring import Ring, SlotLayout


class FakeArray:
    """A device array: NumPy bytes plus the device it lives on."""

    def __init__(self, shape, dtype, device: int) -> None:
        self.host = np.zeros(shape, dtype)
        self.device = types.SimpleNamespace(id=device)
        self.data = types.SimpleNamespace(ptr=int(self.host.ctypes.data))


class FakeCupy:
    """Just enough of CuPy for cuda.py; ``calls`` holds (what, device current at the call, detail)."""

    uint8 = np.uint8

    def __init__(self, devices: int = 2, current: int = 0, compute_mode: int = 0) -> None:
        self.current = current
        self.calls: list[tuple] = []
        fake = self

        class Device:
            def __init__(self, device: int | None = None) -> None:
                self.id = fake.current if device is None else device
                self._before: list[int] = []

            def use(self) -> None:
                fake.current = self.id

            def __enter__(self):
                self._before.append(fake.current)
                fake.current = self.id
                return self

            def __exit__(self, *exc) -> None:
                fake.current = self._before.pop()

        def record(what, detail=None):
            fake.calls.append((what, fake.current, detail))

        def memcpy(dst, src, nbytes, kind):
            record("memcpy", kind)
            ctypes.memmove(dst, src, nbytes)

        runtime = types.SimpleNamespace(
            memcpyHostToDevice=1,
            getDevice=lambda: fake.current,
            hostRegister=lambda ptr, n, flags: record("hostRegister", ptr),
            hostUnregister=lambda ptr: record("hostUnregister", ptr),
            memcpy=memcpy,
            memcpyAsync=lambda *a: record("memcpyAsync"),
            getDeviceProperties=lambda d: {"computeMode": compute_mode, "name": b"Fake GPU"},
            deviceGetPCIBusId=lambda d: "0000:FE:1F.7",
        )
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime)

    def zeros(self, n, dtype):
        self.calls.append(("alloc", self.current, None))
        return FakeArray(n, dtype, self.current)

    def empty(self, shape, dtype):
        self.calls.append(("alloc", self.current, None))
        return FakeArray(shape, dtype, self.current)

    def asarray(self, obj):
        if isinstance(obj, np.ndarray):
            raise AssertionError("cupy.asarray(numpy) stages through pinned memory: not a blocking copy")
        return obj

    def RawKernel(self, source, name):  # noqa: N802 - CuPy's name
        fake = self

        def launch(grid, block, args):
            touch, ns, sink = args
            fake.calls.append(("launch", fake.current, (touch.device.id, sink.device.id, int(ns))))

        return launch


@pytest.fixture
def fake(monkeypatch):
    f = FakeCupy()
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 2))
    return f


def test_registration_is_undone_on_the_device_it_was_made_on(fake):
    buf = np.zeros(8192, np.uint8)
    with fake.cuda.Device(1):
        reg = cuda.HostRegistration(buf)
    assert fake.current == 0  # the caller's device, as after the loader's device scope
    reg.close()
    reg.close()  # idempotent
    assert [c[:2] for c in fake.calls] == [("hostRegister", 1), ("hostUnregister", 1)]
    assert fake.current == 0


def test_the_prefetcher_detaches_its_ring_on_the_loader_device(fake):
    """The loader attaches inside its device scope and detaches (end of epoch, close) outside it."""
    layout = SlotLayout.for_batch((np.zeros((4, 3), np.uint8),), 4)
    with Ring(layout, 2, shared=False) as ring:
        pf = DevicePrefetcher(True, CudaOps())
        with fake.cuda.Device(1):
            assert pf.attach(ring) == "registered"
        pf.close()
    assert [c[:2] for c in fake.calls] == [("hostRegister", 1), ("hostUnregister", 1)]


def test_spin_kernel_runs_on_the_batch_device_with_a_sink_there(fake):
    spin = SpinKernel()  # built with GPU 0 current
    spin(FakeArray(4, np.uint8, 1), 5_000_000)
    spin(FakeArray(4, np.uint8, 0), 7)
    spin(FakeArray(4, np.uint8, 1), 9)
    launches = [c for c in fake.calls if c[0] == "launch"]
    assert launches == [("launch", 1, (1, 1, 5_000_000)), ("launch", 0, (0, 0, 7)), ("launch", 1, (1, 1, 9))]
    assert [c[1] for c in fake.calls if c[0] == "alloc"] == [1, 0]  # one sink per device, made there
    assert fake.current == 0


def test_no_prefetch_copy_is_one_blocking_memcpy_from_the_pageable_source(fake):
    host = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous: copied to a plain buffer first
    dev = cuda.to_device(host)
    assert [c[0] for c in fake.calls] == ["alloc", "memcpy"]
    assert fake.calls[1][2] == fake.cuda.runtime.memcpyHostToDevice
    np.testing.assert_array_equal(dev.host, host)


def test_compute_mode_names(fake, monkeypatch):
    assert cuda.compute_mode(0) == "default"
    f = FakeCupy(compute_mode=3)
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    assert cuda.compute_mode(0) == "exclusive-process"


def _pynvml_without_link() -> types.ModuleType:
    """NVML as some VMs give it: it starts, finds the GPU, and refuses the PCIe link queries."""
    m = types.ModuleType("pynvml")

    def refuse(handle):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: object()
    m.nvmlDeviceGetCurrPcieLinkGeneration = m.nvmlDeviceGetCurrPcieLinkWidth = refuse
    m.nvmlDeviceGetMaxPcieLinkGeneration = m.nvmlDeviceGetMaxPcieLinkWidth = refuse
    return m


def test_link_unknown_in_a_vm_is_none_and_the_report_still_gives_gbps(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _pynvml_without_link())
    assert cuda.pcie_link(0) is None  # NVML refused, and this machine's sysfs has no such bus id
    for link in (None, cuda.PcieLink(None, None, None, None, "sysfs")):
        result = _constant_result(link)
        text = transfers.summary_text(result)
        assert "link limit unknown" in text
        assert "50.0" in text  # the pinned GB/s are still reported
        assert result.to_dict()["link_gbps"] is None


def test_link_probe_survives_a_failing_bus_id_query(fake, monkeypatch):
    def broken(device):
        raise RuntimeError("cudaErrorNotSupported")

    monkeypatch.setattr(fake.cuda.runtime, "deviceGetPCIBusId", broken)
    assert cuda.pcie_link(0) is None
