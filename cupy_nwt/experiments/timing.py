"""Warm-up, repeats and robust statistics: the one way cupy_nwt turns runs into numbers.

Medians, not means: a single page fault or scheduler hiccup should not move a reported figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ArgumentError


@dataclass(frozen=True)
class Summary:
    """Summary of repeated measurements (seconds, or any unit the caller used)."""

    median: float
    mean: float
    min: float
    max: float
    stdev: float
    p25: float
    p75: float
    n: int

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median: 0.05 means +-2.5% around it."""
        return (self.p75 - self.p25) / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["spread"] = self.spread
        return d


def summarize(samples: Sequence[float]) -> Summary:
    """Median, mean, extremes, standard deviation and quartiles of a non-empty sample."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ArgumentError("summarize() needs at least one sample")
    n = len(xs)
    if n == 1:
        q25 = q75 = xs[0]
    else:
        q25, _, q75 = statistics.quantiles(xs, n=4, method="inclusive")
    return Summary(
        median=statistics.median(xs),
        mean=statistics.fmean(xs),
        min=xs[0],
        max=xs[-1],
        stdev=statistics.stdev(xs) if n > 1 else 0.0,
        p25=q25,
        p75=q75,
        n=n,
    )


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal gigabytes per second, the unit PCIe and NVIDIA's samples use."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def host_time(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> list[float]:
    """Wall-clock seconds of ``fn`` per call, after ``warmup`` untimed calls."""
    if repeats < 1 or warmup < 0:
        raise ArgumentError("repeats must be >= 1 and warmup >= 0")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def device_time(fn: Callable[[Any], object], repeats: int = 10, warmup: int = 2, stream=None) -> list[float]:
    """Device seconds of ``fn(stream)`` per call, measured with CUDA events on ``stream``.

    Events time what the GPU did, not how long a call that returns before its copy ends took.
    """
    from .. import cuda  # noqa: PLC0415 - keep host-only users free of CUDA

    if repeats < 1 or warmup < 0:
        raise ArgumentError("repeats must be >= 1 and warmup >= 0")
    s = stream if stream is not None else cuda.current_stream()
    for _ in range(warmup):
        fn(s)
    s.synchronize()
    return [event_seconds(lambda: fn(s), s) for _ in range(repeats)]


def event_seconds(work: Callable[[], object], stream: Any, joined: Sequence[Any] = (),
                  lead: Callable[[], object] | None = None) -> float:
    """Device seconds of what ``work()`` enqueues, between a start and an end CUDA event on ``stream``.

    The one event window of cupy_nwt. Work on other streams is inside it only for the streams in
    ``joined``: each waits for the start event before ``work`` and ``stream`` waits for each one's
    last work before the end event, so the window holds for non-blocking streams that never sync
    with ``stream`` on their own. ``lead()``, when given, is enqueued on ``stream`` before the start
    event and stays out of the window. Returns once the end event has completed.
    """
    return _window(work, stream, joined, lead, stamp_each=False)[0]


def event_seconds_each(work: Callable[[], object], stream: Any, joined: Sequence[Any],
                       lead: Callable[[], object] | None = None) -> tuple[float, tuple[float, ...]]:
    """``event_seconds``, plus each joined stream's own seconds: from the start event to its last work's end.

    Two copies that run at once on two streams end at different times; the window alone gives only
    the later one. ``stream`` itself is never in the second part (its end is the window's).
    """
    return _window(work, stream, joined, lead, stamp_each=True)


def _window(work: Callable[[], object], stream: Any, joined: Sequence[Any], lead: Callable[[], object] | None,
            stamp_each: bool) -> tuple[float, tuple[float, ...]]:
    from .. import cuda  # noqa: PLC0415 - keep host-only users free of CUDA

    others = [s for s in joined if s is not stream]
    start, end = cuda.event(), cuda.event()
    if lead is not None:
        lead()
    start.record(stream)
    for s in others:
        s.wait_event(start)
    work()
    ends = []
    for s in others:
        done = cuda.event(timing=stamp_each)
        done.record(s)
        stream.wait_event(done)
        ends.append(done)
    end.record(stream)
    total = cuda.elapsed_ms(start, end) / 1e3
    return total, tuple(cuda.elapsed_ms(start, e) / 1e3 for e in ends) if stamp_each else ()


# How much longer than the slowest warm-up issue a stream is held, and the margin on top.
HOLD_FACTOR = 2.0
HOLD_MARGIN_S = 200e-6


@dataclass(frozen=True)
class QueuedTimes:
    """Samples of work queued behind a hold: device seconds as the GPU ran it, host seconds to issue it.

    ``overran`` counts the samples whose issue outlasted the hold: their device time includes gaps
    in which the GPU waited for the host, so they read slow.
    """

    device: tuple[float, ...]
    issue: tuple[float, ...]
    held_seconds: float

    @property
    def overran(self) -> int:
        return sum(1 for t in self.issue if t > self.held_seconds)


def queued_time(fn: Callable[[Any], object], hold: Callable[[Any, float], object], repeats: int = 10,
                warmup: int = 2, stream: Any = None, joined: Sequence[Any] = ()) -> QueuedTimes:
    """``fn(stream)`` timed as the GPU runs it, with the host's time to issue it apart.

    From Python, launching a kernel or a copy takes about as long as a short one runs, so an event
    window around work issued from an idle stream measures the launches. Here each sample first
    holds ``stream`` busy (``hold(stream, seconds)``, a spin kernel) for longer than the warm-up
    calls took to issue, so all of the sample is queued before the GPU reaches its start event.
    """
    from .. import cuda  # noqa: PLC0415 - keep host-only users free of CUDA

    if repeats < 1 or warmup < 0:
        raise ArgumentError("repeats must be >= 1 and warmup >= 0")
    s = stream if stream is not None else cuda.current_stream()
    slowest = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn(s)
        slowest = max(slowest, time.perf_counter() - t0)
    s.synchronize()
    held = HOLD_FACTOR * slowest + HOLD_MARGIN_S
    device, issue = [], []

    def work() -> None:
        t0 = time.perf_counter()
        fn(s)
        issue.append(time.perf_counter() - t0)

    for _ in range(repeats):
        device.append(event_seconds(work, s, joined, lead=lambda: hold(s, held)))
    return QueuedTimes(tuple(device), tuple(issue), held)
