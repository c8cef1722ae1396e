"""The CUDA C kernels cupy_nwt compiles at run time, one ``.cu`` file each in ``cuda_src/``.

Kept as files, not Python strings, so that one source is compiled three ways: by CuPy (NVRTC) at run
time, by the compile check of every CI run (``python -m cupy_nwt.experiments.kernel_check``, nvcc for
sm_90, warnings as errors) and into the native reference of ``bench/native/``, which must time the
very same kernel.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import cuda

SOURCE_DIR = Path(__file__).with_name("cuda_src")
BLOCK_SIZE = 256


@dataclass(frozen=True)
class KernelSource:
    """One run-time kernel: its ``extern "C"`` entry point and the file that defines it."""

    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


SPIN = KernelSource("cupy_nwt_spin", SOURCE_DIR / "spin.cu")
OVERLAP = KernelSource("cupy_nwt_overlap", SOURCE_DIR / "overlap.cu")
# the JPEG decode stage's resize, flip and normalise (``cupy_nwt.data.gpu_decode``)
RESIZE_NORMALIZE = KernelSource("cupy_nwt_resize_normalize", SOURCE_DIR / "resize_normalize.cu")
SOURCES = (SPIN, OVERLAP, RESIZE_NORMALIZE)


class SpinKernel:
    """A one-thread kernel that reads one byte of its input, then spins for a number of nanoseconds.

    It stands in for a training step of known duration: reading the batch orders it after the
    batch's copy, and its length does not depend on the batch's size, content or the SM clock. It
    runs on the device that holds ``touch``, with a sink byte of that device's own. ``hold`` keeps a
    stream busy while the host queues work behind it, so the work then runs back to back on the GPU.
    """

    def __init__(self) -> None:
        self._kernel = cuda.compile_kernel(SPIN.text, SPIN.name)
        self._sinks: dict[int, Any] = {}

    def _sink(self, device: int) -> Any:
        sink = self._sinks.get(device)
        if sink is None:
            sink = self._sinks[device] = cuda.device_zeros(1, np.uint8)
        return sink

    def __call__(self, touch: Any, nanoseconds: int, stream: Any = None) -> None:
        address, device = cuda.device_address(touch)  # no CuPy view of a torch tensor: that would sync
        with cuda.device_scope(device):
            sink = self._sink(device)
            with stream if stream is not None else contextlib.nullcontext():
                self._kernel((1,), (1,), (np.uint64(address), np.int64(nanoseconds), sink))

    def hold(self, stream: Any, seconds: float) -> None:
        """Keep ``stream`` (on the current device) busy for ``seconds``, reading only its own sink byte."""
        sink = self._sink(cuda.current_device())
        self(sink, max(1, round(seconds * 1e9)), stream)


class OverlapKernel:
    """The overlap experiment's kernel over one float32 chunk, ``BLOCK_SIZE`` threads a block."""

    def __init__(self) -> None:
        self._kernel = cuda.compile_kernel(OVERLAP.text, OVERLAP.name)

    def __call__(self, chunk: Any, offset: int, stream: Any) -> None:
        n = int(chunk.size)
        with stream:
            self._kernel((-(-n // BLOCK_SIZE),), (BLOCK_SIZE,), (chunk, np.int64(offset), np.int64(n)))
