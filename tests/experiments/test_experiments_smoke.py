"""``cupy-nwt bandwidth`` and ``overlap`` end to end against a CuPy stand-in whose device memory is host memory.

Copies really move bytes (``cudaMemcpyAsync`` becomes ``memmove`` at the addresses the experiment
worked out), and the overlap kernel really adds 1.0 to its chunk, so these runs check the wiring a GPU
run depends on: every copy between the right addresses in the right direction, every chunk through
the kernel once, the results checked and reported. The times are the stand-in's (1 ms a window) and
mean nothing.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from cupy_nwt import cuda
from cupy_nwt.experiments import overlap, transfers


class DevArray:
    """A device array whose bytes are a NumPy array: views, fill, the raw async copies CuPy has."""

    def __init__(self, host: np.ndarray) -> None:
        self.h = host
        self.device = types.SimpleNamespace(id=0)
        self.data = types.SimpleNamespace(ptr=int(host.ctypes.data), copy_from_host_async=self._from_host,
                                          copy_to_host_async=self._to_host)
        self.nbytes, self.size, self.flags = host.nbytes, host.size, host.flags

    def __getitem__(self, key) -> DevArray:
        return DevArray(self.h[key])

    def fill(self, value) -> None:
        self.h.fill(value)

    def _from_host(self, src: int, n: int, stream=None) -> None:
        ctypes.memmove(self.data.ptr, src, n)

    def _to_host(self, dst: int, n: int, stream=None) -> None:
        ctypes.memmove(dst, self.data.ptr, n)


class Stream:
    count = 0

    def __init__(self, non_blocking: bool = True) -> None:
        Stream.count += 1
        self.ptr = 0x1000 + Stream.count

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


class Event:
    def __init__(self, disable_timing: bool = False) -> None:
        self.timing = not disable_timing

    def record(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class HostMemoryCupy:
    ndarray = DevArray

    def __init__(self) -> None:
        self.launches: list[str] = []
        self.copies = 0

        def memcpy_async(dst: int, src: int, n: int, kind: int, stream: int) -> None:
            assert kind in (1, 2) and stream > 0x1000
            self.copies += 1
            ctypes.memmove(dst, src, n)

        runtime = types.SimpleNamespace(
            memcpyHostToDevice=1, memcpyDeviceToHost=2, memcpyAsync=memcpy_async, getDevice=lambda: 0,
            getDeviceCount=lambda: 1, deviceGetPCIBusId=lambda d: "0000:FE:1F.7",
            getDeviceProperties=lambda d: {"name": b"Host Memory GPU", "major": 9, "minor": 0,
                                           "totalGlobalMem": 80 * 1024**3, "asyncEngineCount": 3,
                                           "multiProcessorCount": 132, "computeMode": 0})
        self.cuda = types.SimpleNamespace(
            runtime=runtime, Stream=Stream, Event=Event, get_elapsed_time=lambda start, end: 1.0,
            get_current_stream=lambda: Stream(), Device=_Device,
            alloc_pinned_memory=lambda n: bytearray(n))

    def empty(self, shape, dtype=np.uint8) -> DevArray:
        return DevArray(np.empty(shape, dtype))

    def zeros(self, shape, dtype=np.uint8) -> DevArray:
        return DevArray(np.zeros(shape, dtype))

    def asnumpy(self, array: DevArray) -> np.ndarray:
        return array.h.copy()

    def get_default_memory_pool(self):
        return types.SimpleNamespace(free_all_blocks=lambda: None)

    get_default_pinned_memory_pool = get_default_memory_pool

    def RawKernel(self, source: str, name: str):  # noqa: N802 - CuPy's name
        def launch(grid, block, args) -> None:
            self.launches.append(name)
            if name == "cupy_nwt_overlap":
                chunk, offset, n = args
                assert grid[0] * block[0] >= int(n) and isinstance(offset, np.int64)
                with np.errstate(invalid="ignore"):  # the stage timing runs on uninitialised memory, as on a GPU
                    chunk.h[: int(n)] += np.float32(1.0)

        return launch


class _Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = device or 0

    def use(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture
def fake(monkeypatch) -> HostMemoryCupy:
    f = HostMemoryCupy()
    monkeypatch.setattr(cuda, "_cupy", lambda: f)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    monkeypatch.setattr(cuda, "pcie_link", lambda device=0, sysfs_root="": cuda.PcieLink(5, 16, 5, 16, "nvml"))
    return f


def test_bandwidth_moves_the_right_bytes_and_reports_every_point(fake):
    config = transfers.BandwidthConfig(sizes=(4096, 65536), repeats=2, warmup=1, batch_total=256 * 1024,
                                       batch_chunk=64 * 1024)
    result = transfers.run_bandwidth(config)
    assert result.verified  # every copy came back equal to the random source
    assert len(result.points) == 2 * 2 * 2 and len(result.batching) == 4
    assert all(p.copies_per_sample == transfers.copies_per_sample(p.nbytes) for p in result.points)
    many = [b for b in result.batching if b.chunks == 4]
    assert len(many) == 4
    assert fake.launches and set(fake.launches) == {"cupy_nwt_spin"}  # pinned samples were held
    assert result.to_dict()["experiment"] == "bandwidth" and transfers.bandwidth_summary(result)


def test_bandwidth_catches_a_copy_of_the_wrong_bytes(fake):
    real = fake.cuda.runtime.memcpyAsync

    def off_by_one(dst, src, n, kind, stream):
        real(dst, src, n, kind, stream)
        if kind == 2:
            ctypes.memset(dst, 0, 1)  # a D2H copy that loses its first byte

    fake.cuda.runtime.memcpyAsync = off_by_one
    result = transfers.run_bandwidth(transfers.BandwidthConfig(sizes=(4096,), repeats=1, warmup=1,
                                                               batch_total=128 * 1024, batch_chunk=64 * 1024))
    assert not result.verified


@pytest.mark.parametrize("streams", [1, 2, 4])
def test_overlap_puts_every_chunk_through_the_kernel_once_per_run(fake, streams):
    config = overlap.OverlapConfig(streams=streams, elements=1024 * streams, repeats=2, warmup=1)
    result = overlap.run_overlap(config)
    assert result.correct and result.max_error == 0.0
    assert [v.name for v in result.versions] == list(overlap.VERSIONS)
    assert result.launch is not None and result.launch.kernel.n == 2
    d = result.to_dict()
    assert d["launch_seconds"]["h2d"]["n"] == 2 and d["overran_samples"] >= 0
    assert result.stages.kernel.median == pytest.approx(1e-3 / overlap.STAGE_REPEATS)  # a window over 8 repeats
    assert "launch from Python" in overlap.overlap_summary(result)


@pytest.mark.parametrize("streams", [1, 4])
def test_overlap_measures_the_duplex_stage_and_the_serial_chunks_and_checks_both(fake, streams):
    config = overlap.OverlapConfig(streams=streams, elements=1024 * streams, repeats=2, warmup=1)
    copies_before = fake.copies
    result = overlap.run_overlap(config)
    sizes = [4 * 1024, 4 * 1024 * streams] if streams > 1 else [4 * 1024]
    assert [p.nbytes for p in result.duplex] == sizes and all(p.verified for p in result.duplex)
    assert all(p.h2d_alone.n == 2 and p.copies == overlap.STAGE_REPEATS for p in result.duplex)
    assert result.chunk_duplex is result.duplex[0]
    assert result.serial_chunks is not None and result.serial_chunks.max_error == 0.0
    assert result.measured_ideal_seconds is not None and result.excess("async_v1") is not None
    # every timed sample: H2D alone, D2H alone, both (one copy burst each way), at each size
    assert fake.copies - copies_before > 3 * 2 * overlap.STAGE_REPEATS * len(sizes)
    d = result.to_dict()
    assert d["handoff"]["chunks"] == streams and len(d["duplex"]) == len(sizes)
    assert "hand-off" in overlap.overlap_summary(result)


def test_the_duplex_stage_catches_a_copy_of_the_wrong_bytes(fake):
    real = fake.cuda.runtime.memcpyAsync

    def lossy_download(dst, src, n, kind, stream):
        real(dst, src, n, kind, stream)
        if kind == 2 and n == 4 * 1024:
            ctypes.memset(dst, 0, 1)  # a chunk-sized D2H copy that loses its first byte

    fake.cuda.runtime.memcpyAsync = lossy_download
    result = overlap.run_overlap(overlap.OverlapConfig(streams=2, elements=2048, repeats=1, warmup=0))
    assert [p.verified for p in result.duplex] == [False, True]
