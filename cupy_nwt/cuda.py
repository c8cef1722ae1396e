"""The one module that talks to CUDA (through CuPy and NVML).

Everything else in cupy_nwt asks this module, so the question "is there a usable GPU, and if
not, why" has exactly one answer, and a machine without a driver never sees a CuPy traceback.
CuPy is imported lazily: the package imports and runs its host-only parts without it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._driver import NO_DRIVER, cupy_without_driver

# Re-exported: the rest of the package asks this one gateway for PCIe links; _pcie.py reads them.
from ._pcie import PcieLink, gpu_own_max, nvml_pcie_link, pcie_theoretical_gbps, sysfs_pcie_link  # noqa: F401
from .errors import ArgumentError, NoGPUError


@dataclass(frozen=True)
class GpuStatus:
    available: bool
    reason: str | None
    device_count: int = 0
    driver_version: int | None = None
    runtime_version: int | None = None
    cupy_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: str
    total_memory_bytes: int
    copy_engines: int
    multiprocessors: int
    pci_bus_id: str
    link: PcieLink | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["link"] = self.link.to_dict() if self.link else None
        return d


def _cupy():
    import cupy  # noqa: PLC0415 - lazy on purpose, see module docstring

    return cupy


_DRIVER_HINTS = {
    "cudaErrorInsufficientDriver": "the NVIDIA driver is missing or older than the CUDA runtime CuPy was built for",
    "cudaErrorNoDevice": "the driver found no CUDA device",
    "cudaErrorInitializationError": "the CUDA driver failed to initialise",
    "cudaErrorCompatNotSupportedOnDevice": "the forward-compatibility driver does not support this device",
}


@functools.lru_cache(maxsize=1)
def gpu_status() -> GpuStatus:
    """Probe for a usable GPU without ever raising; the reason says why not in one sentence."""
    if os.environ.get("CUPY_NWT_DISABLE_GPU"):
        return GpuStatus(False, "the GPU is disabled by CUPY_NWT_DISABLE_GPU")
    version = cupy_without_driver()  # learnt in milliseconds: importing CuPy to learn it takes seconds
    if version is not None:
        return GpuStatus(False, f"no usable GPU: {NO_DRIVER}", 0, None, None, version)
    try:
        cupy = _cupy()
    except ImportError as exc:
        return GpuStatus(False, f"no usable GPU: CuPy is not installed ({exc}); install cupy-nwt[cuda12] or [cuda13]")
    version = cupy.__version__
    runtime = driver = None
    try:
        runtime = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # noqa: BLE001 - a broken CUDA runtime is one more reason, not a crash
        pass
    try:
        driver = int(cupy.cuda.runtime.driverGetVersion()) or None
    except Exception:  # noqa: BLE001
        pass
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        code = text.split(":", 1)[0].strip()
        hint = _DRIVER_HINTS.get(code, text)
        if driver is None and code == "cudaErrorInsufficientDriver":
            hint = NO_DRIVER
        return GpuStatus(False, f"no usable GPU: {hint}", 0, driver, runtime, version)
    if count == 0:
        return GpuStatus(False, "no usable GPU: the driver found no CUDA device", 0, driver, runtime, version)
    return GpuStatus(True, None, count, driver, runtime, version)


def require_gpu() -> None:
    """Raise NoGPUError with the probe's reason unless a GPU is usable."""
    status = gpu_status()
    if not status.available:
        raise NoGPUError(status.reason or "no usable GPU")


def pcie_link(device: int = 0, sysfs_root: str = "/sys/bus/pci/devices") -> PcieLink | None:
    """The device's PCIe link from NVML, or from Linux sysfs when NVML is unavailable; never raises.

    Besides NVML's maxima for this device in this system, the GPU's own maximum generation and
    width are read (see ``PcieLink``): inside a VM the system's can read low.

    NVML numbers devices in PCI order and CUDA (by default) fastest first, and
    CUDA_VISIBLE_DEVICES renumbers only CUDA's view: the device is matched by PCI bus id. Inside a
    VM NVML may refuse the link queries and sysfs may have no such device: then None, which every
    report shows as "link limit unknown".
    """
    if not gpu_status().available:
        return None
    try:
        bus_id = str(_cupy().cuda.runtime.deviceGetPCIBusId(device))
    except Exception:  # noqa: BLE001 - no bus id, no way to find the link
        return None
    sysfs_dir = Path(sysfs_root) / bus_id.lower()
    try:
        return nvml_pcie_link(bus_id, sysfs_dir)
    except Exception:  # noqa: BLE001, S110 - no NVML library or no such call: fall back to sysfs below
        pass
    try:
        return sysfs_pcie_link(sysfs_dir)
    except (OSError, ValueError):
        return None


COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}


def compute_mode(device: int = 0) -> str:
    """The device's compute mode: "default" lets several processes share it, the others do not."""
    require_gpu()
    props = _cupy().cuda.runtime.getDeviceProperties(device)
    return COMPUTE_MODES.get(int(props.get("computeMode", 0)), f"mode {props.get('computeMode')}")


def device_info(device: int = 0) -> DeviceInfo:
    """Name, compute capability, memory, copy engines and PCIe link of one device."""
    require_gpu()
    rt = _cupy().cuda.runtime
    props = rt.getDeviceProperties(device)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceInfo(
        index=device,
        name=name,
        compute_capability=f"{props['major']}.{props['minor']}",
        total_memory_bytes=int(props["totalGlobalMem"]),
        copy_engines=int(props["asyncEngineCount"]),
        multiprocessors=int(props["multiProcessorCount"]),
        pci_bus_id=rt.deviceGetPCIBusId(device),
        link=pcie_link(device),
    )


def device_count() -> int:
    return gpu_status().device_count


def all_device_info() -> list[DeviceInfo]:
    """``device_info`` of every usable device (none without a GPU): what ``info`` and ``reproduce`` describe."""
    return [device_info(i) for i in range(device_count())] if gpu_status().available else []


def use_device(device: int) -> None:
    """Make ``device`` current for this thread."""
    require_gpu()
    _cupy().cuda.Device(device).use()


def device_scope(device: int):
    """A ``with`` block in which ``device`` is current for this thread, the previous one after: a rank's loader
    keeps its CUDA work (registration, streams, batches) on its own GPU without moving the rest of the process."""
    require_gpu()
    return _cupy().cuda.Device(device)


def current_device() -> int:
    """The index of this thread's current device."""
    require_gpu()
    return int(_cupy().cuda.runtime.getDevice())


# ---------------------------------------------------------------- host memory


def pinned_empty(shape: int | tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    """A NumPy array backed by page-locked memory from CuPy's pinned pool."""
    require_gpu()
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    mem = _cupy().cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)


class HostRegistration:
    """Page-locks existing host memory (cudaHostRegister) until ``close()``.

    Used for the loader's shared-memory ring so the H2D copy starts straight from it. The device
    current at registration is the one the memory is registered with: ``close()`` unregisters with
    that device current again, whichever device the caller has current by then.
    """

    def __init__(self, array: np.ndarray, portable: bool = True) -> None:
        require_gpu()
        if not array.flags.c_contiguous:
            raise ArgumentError("only C-contiguous host memory can be registered")
        rt = _cupy().cuda.runtime
        self.ptr = int(array.ctypes.data)
        self.nbytes = int(array.nbytes)
        self.device = int(rt.getDevice())
        flags = 1 if portable else 0  # cudaHostRegisterPortable: pinned for every context
        rt.hostRegister(self.ptr, self.nbytes, flags)
        self._array: np.ndarray | None = array  # kept alive while registered
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            cupy = _cupy()
            try:
                with cupy.cuda.Device(self.device):
                    cupy.cuda.runtime.hostUnregister(self.ptr)
            finally:
                self._array = None

    def __enter__(self) -> HostRegistration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_pinned(array: np.ndarray) -> bool:
    """True when CUDA reports the array's memory as page-locked host memory."""
    if not gpu_status().available:
        return False
    rt = _cupy().cuda.runtime
    try:
        attrs = rt.pointerGetAttributes(int(array.ctypes.data))
    except Exception:  # noqa: BLE001 - plain pageable memory may raise on old drivers
        return False
    return int(getattr(attrs, "type", 0)) == int(rt.memoryTypeHost)


# ---------------------------------------------------------------- device memory, streams, events


def device_empty(shape: int | tuple[int, ...], dtype: Any = np.uint8, stream: Any = None):
    """A CuPy array on the current device, from the pool of ``stream`` where given (freeing it later is then
    ordered after that stream's work), else of the current stream."""
    require_gpu()
    with contextlib.nullcontext() if stream is None else stream:
        return _cupy().empty(shape, dtype=dtype)


def stream(non_blocking: bool = True):
    """A new CUDA stream; non-blocking so it never syncs with the legacy default stream."""
    require_gpu()
    return _cupy().cuda.Stream(non_blocking=non_blocking)


def current_stream():
    require_gpu()
    return _cupy().cuda.get_current_stream()


def framework_stream(framework: str, device: int):
    """CuPy's handle on the stream ``framework`` queues its kernels on now on ``device`` (torch's current one), to
    record events on; None when that is CuPy's current stream, or cannot be known (JAX keeps its streams to
    itself; torch may be built without CUDA)."""
    torch = sys.modules.get("torch") if framework == "torch" else None
    if torch is None or not torch.cuda.is_available():
        return None
    cupy, ptr = _cupy(), int(torch.cuda.current_stream(device).cuda_stream)
    return None if ptr == int(cupy.cuda.get_current_stream().ptr) else cupy.cuda.ExternalStream(ptr)


def stream_synchronizer(device: int):
    """A no-argument callable that waits for ``device``'s current stream, from any current device.

    The default streams CuPy hands out as current (``Stream.null``, ``Stream.ptds``; device_id -1)
    are handles CUDA resolves against the device current at the call: synchronizing one while
    another GPU is current waits for that GPU instead. So the wait itself runs with ``device`` current.
    """
    require_gpu()
    with device_scope(device):
        s = current_stream()

    def sync() -> None:
        with device_scope(device):
            s.synchronize()

    return sync


def event(timing: bool = True):
    require_gpu()
    return _cupy().cuda.Event(disable_timing=not timing)


def elapsed_ms(start, end) -> float:
    """Device time between two recorded events, after waiting for ``end``."""
    end.synchronize()
    return float(_cupy().cuda.get_elapsed_time(start, end))


def synchronize() -> None:
    require_gpu()
    _cupy().cuda.Device().synchronize()


def as_numpy(device_array) -> np.ndarray:
    return _cupy().asnumpy(device_array)


def is_device_array(obj: object) -> bool:
    return hasattr(obj, "__cuda_array_interface__")


def _check_copy(dst: Any, src: Any) -> int:
    if dst.nbytes != src.nbytes:
        raise ArgumentError(f"copy size mismatch: destination {dst.nbytes} B, source {src.nbytes} B")
    if not (dst.flags.c_contiguous and src.flags.c_contiguous):
        raise ArgumentError("raw copies need C-contiguous source and destination")
    return int(src.nbytes)


def memcpy_h2d(dst, src: np.ndarray, stream=None) -> None:
    """Enqueue a host -> device copy on ``stream`` and return without waiting.

    A thinner path than ``ndarray.set`` (no device switch, no dtype/shape rules, bytes only) so
    that per-call overhead does not swamp small copies in the transfer experiments. With pageable
    ``src`` the driver stages the data, so the call returns once ``src`` may be reused.
    """
    n = _check_copy(dst, src)
    dst.data.copy_from_host_async(int(src.ctypes.data), n, stream)


def memcpy_d2h(dst: np.ndarray, src, stream=None) -> None:
    """Enqueue a device -> host copy on ``stream``; never waits for the stream.

    Unlike CuPy's ``get(out=...)`` (which blocks by default), this keeps later work issuable
    while the copy runs, which the overlap experiment needs. With pageable ``dst`` the
    driver still returns only after the copy is done.
    """
    n = _check_copy(dst, src)
    src.data.copy_to_host_async(int(dst.ctypes.data), n, stream)


def _address(array: Any) -> int:
    return int(array.ctypes.data) if isinstance(array, np.ndarray) else int(array.data.ptr)


class CopyBurst:
    """A no-argument call that enqueues every ``(dst, src)`` copy of ``pairs`` on ``stream``.

    Sizes, layouts and addresses are checked and worked out on construction, once: a call is one
    ``cudaMemcpyAsync`` per pair and nothing else, so that a timed burst of small copies measures
    the driver and the link, not Python. ``direction``: "h2d" (host ``src``) or "d2h" (host ``dst``).
    """

    def __init__(self, direction: str, pairs: Sequence[tuple[Any, Any]], stream: Any) -> None:
        if direction not in ("h2d", "d2h"):
            raise ArgumentError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        require_gpu()
        rt = _cupy().cuda.runtime
        self.pairs = tuple(pairs)
        self.plan = tuple((_address(dst), _address(src), _check_copy(dst, src)) for dst, src in self.pairs)
        self._kind = rt.memcpyHostToDevice if direction == "h2d" else rt.memcpyDeviceToHost
        self._stream = int(stream.ptr) if stream is not None else 0
        self._memcpy = rt.memcpyAsync

    def __call__(self) -> None:
        memcpy, kind, stream = self._memcpy, self._kind, self._stream
        for dst, src, n in self.plan:
            memcpy(dst, src, n, kind, stream)


def release_memory_pools() -> None:
    """Give unused cached blocks of CuPy's device and pinned pools back to the driver."""
    if gpu_status().available:
        cupy = _cupy()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def cuda_may_be_initialized() -> bool:
    """True when CuPy is imported here and a GPU is usable: a forked child must then avoid CUDA."""
    return "cupy" in sys.modules and gpu_status().available


def compile_kernel(source: str, name: str) -> Any:
    """A CUDA C kernel compiled at run time (NVRTC, through CuPy's RawKernel), called as
    ``kernel(grid, block, args)`` on the current device and stream."""
    require_gpu()
    return _cupy().RawKernel(source, name)


def device_zeros(shape: int | tuple[int, ...], dtype: Any = np.uint8):
    """A zeroed CuPy array on the current device."""
    require_gpu()
    return _cupy().zeros(shape, dtype=dtype)


def device_address(array: Any) -> tuple[int, int]:
    """(first byte's address, device index) of a CuPy array or anything with ``__cuda_array_interface__``.

    Read from the interface itself, never through ``cupy.asarray``: building a CuPy view of a
    producer's array synchronises the producer's stream when the interface names one (version 3),
    a host sync per call in a training loop. The device comes from the pointer's attributes.
    """
    cupy = _cupy()
    if isinstance(array, cupy.ndarray):
        return int(array.data.ptr), int(array.device.id)
    ptr = int(array.__cuda_array_interface__["data"][0])
    return ptr, int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)


def to_device(host: np.ndarray):
    """A blocking host -> device copy into a new CuPy array, the no-prefetch baseline: ``cudaMemcpy`` from pageable
    memory returns once the bytes are on the device (``cupy.asarray`` would stage through CuPy's pinned pool
    and copy asynchronously: a second prefetch path, not a baseline)."""
    require_gpu()
    cupy = _cupy()
    src = np.ascontiguousarray(host)
    dst = cupy.empty(src.shape, dtype=src.dtype)
    if src.nbytes:
        rt = cupy.cuda.runtime
        rt.memcpy(int(dst.data.ptr), int(src.ctypes.data), int(src.nbytes), rt.memcpyHostToDevice)
    return dst

