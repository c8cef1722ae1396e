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
from cupy_nwt.experiments.kernels import SpinKernel
from cupy_nwt.loader.device.prefetch import CudaOps, DevicePrefetcher
from cupy_nwt.loader.ring.ring import Ring, SlotLayout


class FakeArray:
    """A device array: NumPy bytes plus the device it lives on."""

    def __init__(self, shape, dtype, device: int) -> None:
        self.host = np.zeros(shape, dtype)
        self.device = types.SimpleNamespace(id=device)
        self.data = types.SimpleNamespace(ptr=int(self.host.ctypes.data))
        self.nbytes, self.size, self.flags = self.host.nbytes, self.host.size, self.host.flags


class FakeCupy:
    """Just enough of CuPy for cuda.py; ``calls`` holds (what, device current at the call, detail)."""

    uint8 = np.uint8

    def __init__(self, devices: int = 2, current: int = 0, compute_mode: int = 0) -> None:
        self.current = current
        self.calls: list[tuple] = []
        self.devices_at: dict[int, int] = {}
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
            pointerGetAttributes=lambda ptr: record("pointerGetAttributes", ptr) or types.SimpleNamespace(
                device=fake.devices_at[ptr]),
        )
        self.stream = types.SimpleNamespace(ptr=0)  # CuPy's current stream: the legacy default one
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime, get_current_stream=lambda: fake.stream,
                                          ExternalStream=lambda ptr: ("external", ptr, fake.current))

    ndarray = FakeArray

    def _made(self, array: FakeArray) -> FakeArray:
        self.devices_at[array.data.ptr] = array.device.id  # what cudaPointerGetAttributes would answer
        return array

    def zeros(self, n, dtype):
        self.calls.append(("alloc", self.current, None))
        return self._made(FakeArray(n, dtype, self.current))

    def empty(self, shape, dtype):
        self.calls.append(("alloc", self.current, None))
        return self._made(FakeArray(shape, dtype, self.current))

    def asarray(self, obj):
        if isinstance(obj, np.ndarray):
            raise AssertionError("cupy.asarray(numpy) stages through pinned memory: not a blocking copy")
        return obj

    def RawKernel(self, source, name):  # noqa: N802 - CuPy's name
        fake = self

        def launch(grid, block, args):
            touch, ns, sink = args  # the batch comes as its address: no view of it was made
            assert isinstance(touch, np.uint64), type(touch)
            fake.calls.append(("launch", fake.current, (fake.devices_at[int(touch)], sink.device.id, int(ns))))

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


def test_torchs_current_stream_on_the_loader_device_is_the_one_a_torch_batch_also_orders_after(fake, monkeypatch):
    """torch under ``torch.cuda.stream(s)`` queues on s, not on CuPy's current stream: the prefetcher's copies
    into reused memory wait on s too (None where torch's stream is CuPy's, or for JAX, whose is not known)."""
    torch = pytest.importorskip("torch")
    asked: list[int] = []

    def current_stream(device):
        asked.append(device)
        return types.SimpleNamespace(cuda_stream=torch_stream)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    ops = CudaOps()
    torch_stream = 0x5A00
    with fake.cuda.Device(1):
        assert ops.framework_stream("torch") == ("external", 0x5A00, 1)
        assert ops.framework_stream("jax") is None
        torch_stream = 0  # torch's default stream, and CuPy's: nothing more to wait on
        assert ops.framework_stream("torch") is None
    assert asked == [1, 1]


def test_spin_kernel_runs_on_the_batch_device_with_a_sink_there(fake):
    spin = SpinKernel()  # built with GPU 0 current
    batches = [FakeArray(4, np.uint8, d) for d in (1, 0, 1)]
    fake.devices_at.update({b.data.ptr: b.device.id for b in batches})
    spin(batches[0], 5_000_000)
    spin(batches[1], 7)
    spin(batches[2], 9)
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
        text = transfers.bandwidth_summary(result)
        assert "link limit unknown" in text
        assert "50.0" in text  # the pinned GB/s are still reported
        assert result.to_dict()["link_gbps"] is None


def test_link_probe_survives_a_failing_bus_id_query(fake, monkeypatch):
    def broken(device):
        raise RuntimeError("cudaErrorNotSupported")

    monkeypatch.setattr(fake.cuda.runtime, "deviceGetPCIBusId", broken)
    assert cuda.pcie_link(0) is None


class TorchLikeTensor:
    """A device array that only speaks ``__cuda_array_interface__`` and names the stream it was made on."""

    def __init__(self, ptr: int) -> None:
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "stream": 7}


def test_spin_kernel_takes_a_torch_tensor_by_address_without_a_cupy_view(fake, monkeypatch):
    """cupy.asarray on an interface that names a stream synchronises that stream: a host sync per step."""

    def no_view(obj):
        raise AssertionError("cupy.asarray(tensor): a CuPy view syncs the producer's stream")

    monkeypatch.setattr(fake, "asarray", no_view)
    spin = SpinKernel()
    tensor = TorchLikeTensor(0x7F00_0000_1000)
    fake.devices_at[0x7F00_0000_1000] = 1
    spin(tensor, 1000)
    assert [c for c in fake.calls if c[0] == "launch"] == [("launch", 1, (1, 1, 1000))]
    assert cuda.device_address(tensor) == (0x7F00_0000_1000, 1)


def _pynvml_behind_a_virtual_port(gpu_gen: int | None) -> types.ModuleType:
    """NVML inside a VM: the link runs at Gen5 x16, but "the most possible with this system" reads Gen3."""
    m = types.ModuleType("pynvml")
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: object()
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    m.nvmlDeviceGetCurrPcieLinkWidth = m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 3
    if gpu_gen is not None:
        m.nvmlDeviceGetGpuMaxPcieLinkGeneration = lambda h: gpu_gen
    return m


def _sysfs_gpu(root, width: str = "16\n", speed: str = "32.0 GT/s PCIe\n"):
    dev = root / "0000:fe:1f.7"  # the fake's bus id, as sysfs spells it
    dev.mkdir(parents=True)
    (dev / "max_link_width").write_text(width)
    (dev / "max_link_speed").write_text(speed)
    return root


def test_link_reads_the_gpus_own_maximum_beside_the_systems(fake, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", _pynvml_behind_a_virtual_port(gpu_gen=5))
    link = cuda.pcie_link(0, sysfs_root=str(_sysfs_gpu(tmp_path, speed="8.0 GT/s PCIe\n")))
    assert (link.max_gen, link.max_width, link.gpu_max_gen, link.gpu_max_width) == (3, 16, 5, 16)
    assert link.source == "nvml" and link.to_dict()["gpu_max_gbps"] == pytest.approx(63.0, rel=5e-3)


def test_without_nvmls_gpu_maximum_the_generation_comes_from_sysfs(fake, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", _pynvml_behind_a_virtual_port(gpu_gen=None))
    link = cuda.pcie_link(0, sysfs_root=str(_sysfs_gpu(tmp_path)))
    assert (link.max_gen, link.gpu_max_gen, link.gpu_max_width) == (3, 5, 16)
    assert cuda.pcie_link(0, sysfs_root=str(tmp_path / "none")).gpu_max_width is None


def test_a_copy_over_the_systems_maximum_switches_to_the_gpus_own_and_says_why():
    behind_vm = cuda.PcieLink(5, 16, 3, 16, "nvml", 5, 16)  # system max 15.75 GB/s; the pinned copies do 50
    result = _constant_result(behind_vm)
    assert result.link_basis == "gpu-max" and result.link_gbps == pytest.approx(63.0, rel=5e-3)
    assert result.over_link == () and "the GPU's own max" in result.link_label
    assert "virtual port" in transfers.bandwidth_summary(result)


def test_any_share_over_100_percent_is_flagged():
    result = _constant_result(cuda.PcieLink(5, 16, 3, 16, "nvml"))  # no GPU maximum to fall back to
    assert result.link_basis == "max"
    over = result.to_dict()["over_link"]
    assert over and all(p["memory"] == "pinned" and p["link_fraction"] > 1.0 for p in over)
    text = transfers.bandwidth_summary(result)
    assert "WARNING" in text and "317%!" in text
    assert _constant_result(cuda.PcieLink(5, 16, 5, 16, "nvml")).to_dict()["over_link"] == []
