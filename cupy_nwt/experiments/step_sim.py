"""A simulated training step of known duration, and how long the GPU sits idle waiting for data.

The question a prefetcher answers is not "how fast is the loader" but "does the GPU ever wait for
it". Here the training step is a kernel that spins for a fixed time after reading the batch (so it
is ordered after the batch's copy), followed by a host sync, as a loss read-back would do. Over many
steps, the GPU's idle fraction is ``1 - kernel time / wall time``: everything that is not the step
(waiting for a batch, a synchronous copy, host overhead) shows up in it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import cuda
from ..loader.ring.collate import flatten
from . import timing

# %globaltimer is the GPU's nanosecond wall clock: unlike clock64() (SM cycles), a spin on it lasts
# the same time whether the SM clock idles at a few hundred MHz or boosts to ~2 GHz.
_SPIN_SOURCE = r"""
extern "C" __global__ void cupy_nwt_spin(const unsigned char* touch, long long ns, unsigned char* sink) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned char acc = touch[0];
    do {
        acc = (unsigned char)(acc * 3 + 1);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while ((long long)(now - start) < ns);
    sink[0] = acc;
}
"""


class SpinKernel:
    """A one-thread kernel that reads one byte of its input, then spins for a number of nanoseconds.

    It stands in for a training step of known duration: reading the batch orders it after the
    batch's copy, and its length does not depend on the batch's size, content or the SM clock. It
    runs on the device that holds ``touch``, with a sink byte of that device's own.
    """

    def __init__(self) -> None:
        self._kernel = cuda.compile_kernel(_SPIN_SOURCE, "cupy_nwt_spin")
        self._sinks: dict[int, Any] = {}

    def __call__(self, touch: Any, nanoseconds: int, stream=None) -> None:
        arr = cuda.as_device_array(touch)  # zero-copy for anything with __cuda_array_interface__ (torch too)
        device = cuda.device_of(arr)
        with cuda.device_scope(device):
            sink = self._sinks.get(device)
            if sink is None:
                sink = self._sinks[device] = cuda.device_zeros(1, np.uint8)
            with stream if stream is not None else contextlib.nullcontext():
                self._kernel((1,), (1,), (arr, np.int64(nanoseconds), sink))


def idle_fraction(kernel_seconds: float, wall_seconds: float) -> float:
    """Share of the wall time in which the simulated step was not running (0 = never idle)."""
    if wall_seconds <= 0 or kernel_seconds < 0:
        raise ValueError(f"need wall > 0 and kernel >= 0 seconds, got {wall_seconds!r}, {kernel_seconds!r}")
    return max(0.0, 1.0 - kernel_seconds / wall_seconds)


@dataclass(frozen=True)
class FeedResult:
    """``steps`` timed steps (after ``warmup``) of ``batch_size`` samples each."""

    label: str
    steps: int
    batch_size: int
    wall_seconds: float
    kernel_seconds: float
    step_seconds_target: float

    @property
    def idle_fraction(self) -> float:
        return idle_fraction(self.kernel_seconds, self.wall_seconds)

    @property
    def samples_per_second(self) -> float:
        return self.steps * self.batch_size / self.wall_seconds

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["idle_fraction"] = self.idle_fraction
        d["samples_per_second"] = self.samples_per_second
        return d


class SimulatedStep:
    """A kernel that takes ``seconds`` on the device, then a host sync; returns its device seconds.

    The kernel spins on the GPU's nanosecond timer (``%globaltimer``), not on SM cycles: the SM
    clock ramps from a few hundred MHz idle to ~2 GHz boosted, so a cycle count calibrated at one
    clock would be off by up to 5x at the other.
    """

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"step seconds must be positive, got {seconds!r}")
        self.seconds = seconds
        self.nanoseconds = max(1, round(seconds * 1e9))
        self._spin = SpinKernel()
        self._timed(cuda.device_empty(1), 1)  # the first launch compiles the kernel: keep that out of the steps

    def _timed(self, batch: Any, nanoseconds: int) -> float:
        return timing.event_seconds(lambda: self._spin(batch, nanoseconds), cuda.current_stream())

    def __call__(self, batch: Any) -> float:
        leaves, _ = flatten(batch)
        return self._timed(leaves[0], self.nanoseconds)


def feed(batches: Iterable[Any], step: Callable[[Any], float], *, steps: int, warmup: int, batch_size: int,
         label: str, step_seconds: float, clock: Callable[[], float] = time.perf_counter) -> FeedResult:
    """Run ``step`` on ``warmup + steps`` batches; time the last ``steps`` of them.

    ``step(batch)`` must return once the step is done on the device, with its device seconds. The
    wall clock covers getting each batch (and whatever copy that implies) and the step.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps}, {warmup}")
    it = iter(batches)
    for _ in range(warmup):
        step(_next(it, label))
    kernel = 0.0
    t0 = clock()
    for _ in range(steps):
        kernel += step(_next(it, label))
    wall = clock() - t0
    return FeedResult(label, steps, batch_size, wall, kernel, step_seconds)


def _next(it: Any, label: str) -> Any:
    try:
        return next(it)
    except StopIteration:
        raise ValueError(f"{label}: the loader ran out of batches; use a larger dataset or fewer steps") from None
