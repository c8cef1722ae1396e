"""A simulated training step of known duration, and how long the GPU sits idle waiting for data.

The question a prefetcher answers is not "how fast is the loader" but "does the GPU ever wait for
it". Here the training step is a kernel that spins for a fixed time after reading the batch (so it
is ordered after the batch's copy). Over many steps, the GPU's idle fraction is ``1 - kernel time /
wall time``: everything that is not the step (waiting for a batch, a synchronous copy, host overhead)
shows up in it. Two loops drive it:

* ``feed`` (synced): each step ends in a host sync, as a loss read back every step does, so the
  host's hand-over of the next batch is GPU idle time whatever the loader does.
* ``feed_queued``: each step is only enqueued and the host goes on to take the next batch while the
  GPU runs it, as a training loop that reads nothing back does; the queue is bounded by waiting on
  the step ``depth`` back. Its wall time is the GPU's own, between the step kernels' CUDA events.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .. import cuda
from ..errors import ArgumentError
from ..loader.ring.tree import flatten
from . import timing
from .kernels import SpinKernel

__all__ = ["FeedResult", "QUEUE_DEPTH", "SimulatedStep", "StepMarks", "feed", "feed_queued",
           "idle_fraction"]

QUEUE_DEPTH = 2  # steps in flight in the queued loop: one on the GPU, one queued behind it


def idle_fraction(kernel_seconds: float, wall_seconds: float) -> float:
    """Share of the wall time in which the simulated step was not running (0 = never idle)."""
    if wall_seconds <= 0 or kernel_seconds < 0:
        raise ArgumentError(f"need wall > 0 and kernel >= 0 seconds, got {wall_seconds!r}, {kernel_seconds!r}")
    return max(0.0, 1.0 - kernel_seconds / wall_seconds)


@dataclass(frozen=True)
class FeedResult:
    """``steps`` timed steps (after ``warmup``) of ``batch_size`` samples each.

    ``startup_seconds`` is the wait for the first batch (starting workers: 0.2-0.8 s each by fork or
    forkserver), kept apart from the steady state that ``idle_fraction`` describes. ``loop`` says
    which loop ran them: "synced" (``wall_seconds`` by the host's clock, each step waited for) or
    "queued" (``wall_seconds`` by the GPU's events, ``queue_depth`` steps in flight at most).
    ``take_seconds`` is the host's time getting the timed steps' batches (the loader's hand-over and
    any copy it implies): where the queued loop still idles, it says whether the host was the cause.
    """

    label: str
    steps: int
    batch_size: int
    wall_seconds: float
    kernel_seconds: float
    step_seconds_target: float
    startup_seconds: float = 0.0
    loop: str = "synced"
    queue_depth: int = 1
    take_seconds: float = 0.0

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


@dataclass(frozen=True)
class StepMarks:
    """A queued step's start and end events, as the device will timestamp them."""

    start: Any
    end: Any


class SimulatedStep:
    """A kernel that takes ``seconds`` on the device. Called, it ends in a host sync and returns its
    device seconds; ``enqueue``d, it returns at once with the events that will time it.

    The kernel spins on the GPU's nanosecond timer (``%globaltimer``), not on SM cycles: the SM
    clock ramps from a few hundred MHz idle to ~2 GHz boosted, so a cycle count calibrated at one
    clock would be off by up to 5x at the other.
    """

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ArgumentError(f"step seconds must be positive, got {seconds!r}")
        self.seconds = seconds
        self.nanoseconds = max(1, round(seconds * 1e9))
        self._spin = SpinKernel()
        self._timed(cuda.device_empty(1), 1)  # the first launch compiles the kernel: keep that out of the steps

    def _timed(self, batch: Any, nanoseconds: int) -> float:
        return timing.event_seconds(lambda: self._spin(batch, nanoseconds), cuda.current_stream())

    def __call__(self, batch: Any) -> float:
        leaves, _ = flatten(batch)
        return self._timed(leaves[0], self.nanoseconds)

    def enqueue(self, batch: Any) -> StepMarks:
        """Queue the step on the current stream between two timing events; returns without waiting."""
        leaves, _ = flatten(batch)
        stream = cuda.current_stream()
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        self._spin(leaves[0], self.nanoseconds)
        end.record(stream)
        return StepMarks(start, end)

    def wait(self, marks: StepMarks) -> None:
        marks.end.synchronize()

    def elapsed(self, start: Any, end: Any) -> float:
        """Device seconds between two recorded events (waits for ``end``)."""
        return cuda.elapsed_ms(start, end) / 1e3


def feed(batches: Iterable[Any], step: Callable[[Any], float], *, steps: int, warmup: int, batch_size: int,
         label: str, step_seconds: float, clock: Callable[[], float] = time.perf_counter) -> FeedResult:
    """Run ``step`` on ``warmup + steps`` batches; time the last ``steps`` of them.

    ``step(batch)`` must return once the step is done on the device, with its device seconds. The
    wall clock covers getting each batch (and whatever copy that implies) and the step. The wait for
    the very first batch is the loader's start-up: reported on its own, in no step's time.
    """
    if steps < 1 or warmup < 0:
        raise ArgumentError(f"need steps >= 1 and warmup >= 0, got {steps}, {warmup}")
    take, startup = _started(batches, label, clock)
    for _ in range(warmup):
        step(take())
    kernel = taking = 0.0
    t0 = clock()
    for _ in range(steps):
        t_take = clock()
        batch = take()
        taking += clock() - t_take
        kernel += step(batch)
    wall = clock() - t0
    return FeedResult(label, steps, batch_size, wall, kernel, step_seconds, startup, take_seconds=taking)


class QueuedStep(Protocol):
    """What ``feed_queued`` needs of a step: ``SimulatedStep`` on a GPU, a timeline in the tests."""

    def enqueue(self, batch: Any) -> StepMarks: ...
    def wait(self, marks: StepMarks) -> None: ...
    def elapsed(self, start: Any, end: Any) -> float: ...


def feed_queued(batches: Iterable[Any], step: QueuedStep, *, steps: int, warmup: int, batch_size: int, label: str,
                step_seconds: float, depth: int = QUEUE_DEPTH,
                clock: Callable[[], float] = time.perf_counter) -> FeedResult:
    """Enqueue a step on each of ``warmup + steps`` batches without waiting for it; time the last ``steps``.

    Before step k is enqueued the host waits for step k - ``depth`` to end, so at most ``depth``
    steps are in flight; the host takes batch k + 1 while they run. The default, 2, is the least at
    which the GPU never waits for the launch itself (at 1 each step is launched only once the last
    one ended) and the least at which a batch's memory is freed by the host while a queued step
    still reads it, the case the prefetcher must order its copies after. A deeper queue only absorbs
    longer hiccups of the host and keeps more batches alive on the device.

    Busy and wall time both come from the steps' events: the sum of each step's start-to-end, and
    the first timed step's start to the last one's end. The start-up is the wait for the first batch.
    """
    if steps < 1 or warmup < 0 or depth < 1:
        raise ArgumentError(f"need steps >= 1, warmup >= 0 and depth >= 1, got {steps}, {warmup}, {depth}")
    take, startup = _started(batches, label, clock)
    queue: deque[StepMarks] = deque()
    timed: list[StepMarks] = []
    taking = 0.0
    for i in range(warmup + steps):
        t_take = clock()
        batch = take()
        if i >= warmup:
            taking += clock() - t_take
        while len(queue) >= depth:
            step.wait(queue.popleft())
        marks = step.enqueue(batch)
        queue.append(marks)
        if i >= warmup:
            timed.append(marks)
    step.wait(queue[-1])  # steps on one stream end in order: the last one ends last
    kernel = sum(step.elapsed(m.start, m.end) for m in timed)
    wall = step.elapsed(timed[0].start, timed[-1].end)
    return FeedResult(label, steps, batch_size, wall, kernel, step_seconds, startup, "queued", depth, taking)


def _started(batches: Iterable[Any], label: str, clock: Callable[[], float]) -> tuple[Callable[[], Any], float]:
    """The batches as a ``take()``, and the loader's start-up: the wait for the first batch, in no step's time."""
    it = iter(batches)
    t_start = clock()
    pending = [_next(it, label)]
    startup = clock() - t_start

    def take() -> Any:
        return pending.pop() if pending else _next(it, label)

    return take, startup


def _next(it: Any, label: str) -> Any:
    try:
        return next(it)
    except StopIteration:
        raise ArgumentError(f"{label}: the loader ran out of batches; use a larger dataset or fewer steps") from None
