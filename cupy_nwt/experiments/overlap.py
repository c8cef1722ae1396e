"""Overlapping copies with compute over N streams, after NVIDIA's async.cu.

Three versions move the same array through H2D copy -> kernel -> D2H copy: sequential (one
stream, whole array), async v1 (per stream: copy in, kernel, copy out) and async v2 (all copies
in, then all kernels, then all copies out). Each run starts from zeros in pinned host memory and
must come back as 1.0 everywhere; the per-chunk stage times give the ideal pipelined time that
the async versions are judged against.

Every stage and version is timed as the GPU runs it: the stream is first held by a short spin
kernel while Python issues the work, so the window holds the copies and kernels back to back and
none of the 10-20 us that a launch from Python takes. That launch time is reported on its own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import cuda
from .._reporting import tables as report
from .._reporting.units import fmt_bytes
from ..errors import ArgumentError, UnknownKeyError
from . import kernels, timing
from .timing import Stats
from .transfers import ProgressBar, check_run_options, run_on_device

BLOCK_SIZE = kernels.BLOCK_SIZE
CHUNK_ELEMENTS = 4 * 1024 * BLOCK_SIZE  # floats per stream, as in async.cu
MAX_ERROR_TOLERANCE = 1e-5
VERSIONS = ("sequential", "async_v1", "async_v2")
# Back-to-back repeats of one stage in a timed sample: a lone 5-15 us kernel is near the events' resolution.
STAGE_REPEATS = 8


def ideal_pipeline_seconds(h2d: float, kernel: float, d2h: float, streams: int) -> float:
    """Time of a perfect ``streams``-deep pipeline: fill it once, then one slowest stage per chunk.

    (h + k + d) + (streams - 1) * max(h, k, d). Assumes H2D and D2H run on separate copy engines.
    """
    if streams < 1:
        raise ArgumentError(f"streams must be >= 1, got {streams}")
    if min(h2d, kernel, d2h) < 0:
        raise ArgumentError("stage times cannot be negative")
    return (h2d + kernel + d2h) + (streams - 1) * max(h2d, kernel, d2h)


@dataclass(frozen=True)
class OverlapConfig:
    """Streams and array size (float32 elements; default 4*1024*256 per stream, like async.cu)."""

    streams: int = 4
    elements: int | None = None
    repeats: int = 20
    warmup: int = 3
    device: int = 0

    def __post_init__(self) -> None:
        if self.streams < 1:
            raise ArgumentError(f"--streams must be >= 1, got {self.streams}")
        elements = CHUNK_ELEMENTS * self.streams if self.elements is None else self.elements
        object.__setattr__(self, "elements", elements)
        if elements <= 0:
            raise ArgumentError(f"--elements must be positive, got {elements}")
        if elements % self.streams:
            raise ArgumentError(f"--elements ({elements}) must be a multiple of --streams ({self.streams})")
        check_run_options(self.repeats, self.warmup, self.device)

    @property
    def total_elements(self) -> int:
        """``elements`` as ``__post_init__`` settled it (never None after construction)."""
        assert self.elements is not None
        return self.elements

    @property
    def chunk_elements(self) -> int:
        return self.total_elements // self.streams

    @property
    def nbytes(self) -> int:
        return self.total_elements * 4

    @property
    def steps(self) -> int:
        return 3 + len(VERSIONS)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk_elements"] = self.chunk_elements
        d["nbytes"] = self.nbytes
        return d


@dataclass(frozen=True)
class OverlapStages:
    """Seconds of one chunk's H2D copy, kernel and D2H copy, each measured alone."""

    h2d: Stats
    kernel: Stats
    d2h: Stats

    def to_dict(self) -> dict[str, Any]:
        return {"h2d": self.h2d.to_dict(), "kernel": self.kernel.to_dict(), "d2h": self.d2h.to_dict()}


@dataclass(frozen=True)
class LaunchTimes:
    """Host seconds Python takes to issue one H2D copy, one kernel and one D2H copy of a chunk.

    Not part of any device time above: what a caller pays per launch on the CPU, and what would
    leave the GPU idle if the work were issued to an idle stream one piece at a time.
    """

    h2d: Stats
    kernel: Stats
    d2h: Stats

    def to_dict(self) -> dict[str, Any]:
        return {"h2d": self.h2d.to_dict(), "kernel": self.kernel.to_dict(), "d2h": self.d2h.to_dict()}


@dataclass(frozen=True)
class VersionTiming:
    """One version's device seconds over the repeats, and its worst |result - 1| over all runs."""

    name: str
    seconds: Stats
    max_error: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds.to_dict(), "max_error": self.max_error}


@dataclass(frozen=True)
class OverlapResult:
    config: OverlapConfig
    device: cuda.DeviceInfo
    stages: OverlapStages
    versions: tuple[VersionTiming, ...]
    launch: LaunchTimes | None = None
    overran: int = 0

    @property
    def ideal_seconds(self) -> float:
        s = self.stages
        return ideal_pipeline_seconds(s.h2d.median, s.kernel.median, s.d2h.median, self.config.streams)

    def version(self, name: str) -> VersionTiming:
        for v in self.versions:
            if v.name == name:
                return v
        raise UnknownKeyError(f"no version {name!r}; have {[v.name for v in self.versions]}")

    def speedup(self, name: str) -> float:
        """Sequential median time over this version's median time."""
        return self.version("sequential").seconds.median / self.version(name).seconds.median

    def vs_ideal(self, name: str) -> float:
        """Measured median over the ideal pipelined time: 1.10 means 10% slower than ideal."""
        return self.version(name).seconds.median / self.ideal_seconds

    @property
    def max_error(self) -> float:
        return max(v.max_error for v in self.versions)

    @property
    def correct(self) -> bool:
        return self.max_error < MAX_ERROR_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        versions = []
        for v in self.versions:
            d = v.to_dict()
            d["speedup_vs_sequential"] = self.speedup(v.name)
            d["vs_ideal"] = self.vs_ideal(v.name)
            versions.append(d)
        return {
            "experiment": "overlap",
            "config": self.config.to_dict(),
            "device": self.device.to_dict(),
            "stages": self.stages.to_dict(),
            "timing": "device time with the work queued behind a spin kernel: no Python launch time inside",
            "launch_seconds": self.launch.to_dict() if self.launch else None,
            "overran_samples": self.overran,
            "ideal_seconds": self.ideal_seconds,
            "ideal_formula": "(h2d + kernel + d2h) + (streams - 1) * max(h2d, kernel, d2h)",
            "max_error": self.max_error,
            "max_error_tolerance": MAX_ERROR_TOLERANCE,
            "correct": self.correct,
            "versions": versions,
        }


def run_overlap(config: OverlapConfig | None = None, progress: ProgressBar | None = None) -> OverlapResult:
    """Measure stage times and the three versions on ``config.device``; raises NoGPUError without one."""
    config = config or OverlapConfig()
    return run_on_device(config.device, lambda tick: _run(config, tick), progress)


def _run(config: OverlapConfig, tick: ProgressBar) -> OverlapResult:
    device = cuda.device_info(config.device)
    n, chunk = config.total_elements, config.chunk_elements
    host = cuda.pinned_empty(n, np.float32)
    dev = cuda.device_empty(n, np.float32)
    kernel, spin = kernels.OverlapKernel(), kernels.SpinKernel()
    main = cuda.stream()
    streams = [cuda.stream() for _ in range(config.streams)]
    chunks = [(o, host[o:o + chunk], dev[o:o + chunk]) for o in range(0, n, chunk)]
    # Every copy's checks and addresses are worked out here, out of the timed windows.
    ups = [cuda.CopyBurst("h2d", [(d, h)], s) for (_, h, d), s in zip(chunks, streams)]
    downs = [cuda.CopyBurst("d2h", [(h, d)], s) for (_, h, d), s in zip(chunks, streams)]
    whole_up, whole_down = cuda.CopyBurst("h2d", [(dev, host)], main), cuda.CopyBurst("d2h", [(host, dev)], main)

    off0, _, d0 = chunks[0]
    host.fill(0)
    reps, warm, s0 = config.repeats, config.warmup, streams[0]
    kernel(d0, off0, s0)  # compile now: a first call inside a timed window would count the compile
    s0.synchronize()

    def kernel0() -> None:
        kernel(d0, off0, s0)

    stage, launch, overran = [], [], 0
    one: Callable[[], object]
    for name, one in (("h2d", ups[0]), ("kernel", kernel0), ("d2h", downs[0])):
        def repeated(_stream: Any, one: Callable[[], object] = one) -> None:
            for _ in range(STAGE_REPEATS):
                one()

        q = timing.queued_time(repeated, spin.hold, reps, max(warm, 1), s0)
        stage.append(timing.summarize([t / STAGE_REPEATS for t in q.device]))
        launch.append(timing.summarize([t / STAGE_REPEATS for t in q.issue]))
        overran += q.overran
        tick(f"stage {name}")
    stages = OverlapStages(*stage)

    def sequential() -> None:
        whole_up()
        kernel(dev, 0, main)
        whole_down()

    def async_v1() -> None:
        for (o, _, d), s, up, down in zip(chunks, streams, ups, downs):
            up()
            kernel(d, o, s)
            down()

    def async_v2() -> None:
        for up in ups:
            up()
        for (o, _, d), s in zip(chunks, streams):
            kernel(d, o, s)
        for down in downs:
            down()

    versions = []
    for name, work, used in (("sequential", sequential, [main]),
                             ("async_v1", async_v1, streams),
                             ("async_v2", async_v2, streams)):
        times, worst, slowest = [], 0.0, 0.0
        for i in range(warm + reps):
            held = timing.HOLD_FACTOR * slowest + timing.HOLD_MARGIN_S
            seconds, issued = _timed_run(work, host, main, used, functools.partial(spin.hold, main, held))
            worst = max(worst, float(np.max(np.abs(host - np.float32(1.0)))))
            if i >= warm:
                times.append(seconds)
                overran += issued > held
            slowest = max(slowest, issued)
        versions.append(VersionTiming(name, timing.summarize(times), worst))
        tick(name)
    return OverlapResult(config, device, stages, tuple(versions), LaunchTimes(*launch), overran)


def _timed_run(work: Callable[[], None], host: np.ndarray, main, used: list,
               hold: Callable[[], object] | None = None) -> tuple[float, float]:
    """(device seconds of ``work`` over all streams in ``used``, host seconds to issue it), from zeros in ``host``.

    The window is opened and closed on ``main`` and joins every other stream in ``used``; ``hold``,
    when given, keeps ``main`` busy before the window opens so that the whole run is queued first.
    """
    host.fill(0)
    issued = [0.0]

    def timed_work() -> None:
        t0 = time.perf_counter()
        work()
        issued[0] = time.perf_counter() - t0

    return timing.event_seconds(timed_work, main, used, lead=hold), issued[0]


def overlap_summary(result: OverlapResult) -> str:
    """The readable report: set-up, stage times and the ideal, then each version."""
    c, st = result.config, result.stages
    head = report.key_values([
        ("device", f"GPU {result.device.index}: {result.device.name} ({result.device.copy_engines} copy engines)"),
        ("array", f"{c.elements} float32 ({fmt_bytes(c.nbytes)}), {c.streams} streams x {c.chunk_elements}"),
        ("per-chunk stages", f"H2D {1e3 * st.h2d.median:.3f} ms, kernel {1e3 * st.kernel.median:.3f} ms, "
                             f"D2H {1e3 * st.d2h.median:.3f} ms"),
        ("launch from Python", _launch_line(result.launch)),
        ("ideal pipelined", f"{1e3 * result.ideal_seconds:.3f} ms = (h+k+d) + (streams-1) * max(h,k,d)"),
        ("max error", f"{result.max_error:.3g} ({'ok' if result.correct else 'WRONG'}: tolerance "
                      f"{MAX_ERROR_TOLERANCE:g})"),
    ], title=f"overlap ({c.repeats} timed runs, median; {c.warmup} warm-up)")
    rows = [[v.name, f"{1e3 * v.seconds.median:.3f}", v.seconds.spread, result.speedup(v.name),
             result.vs_ideal(v.name), f"{v.max_error:.3g}"] for v in result.versions]
    body = report.table(["version", "ms", "spread", "speed-up", "vs ideal", "max error"], rows)
    return f"{head}\n\n{body}"


def _launch_line(launch: LaunchTimes | None) -> str:
    if launch is None:
        return "not measured"
    return (f"H2D {1e6 * launch.h2d.median:.1f} us, kernel {1e6 * launch.kernel.median:.1f} us, "
            f"D2H {1e6 * launch.d2h.median:.1f} us of host time a call (not in the device times)")
