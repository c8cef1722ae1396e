"""Overlapping copies with compute over N streams, after NVIDIA's async.cu.

Three versions move the same array through H2D copy -> kernel -> D2H copy: sequential (one
stream, whole array), async v1 (per stream: copy in, kernel, copy out) and async v2 (all copies
in, then all kernels, then all copies out). Each run starts from zeros in pinned host memory and
must come back as 1.0 everywhere; the per-chunk stage times give the ideal pipelined time that
the async versions are judged against. Beside that ideal stands one rebuilt from what a pipeline
pays on top (``pipeline_model``): the copies' rates while the other direction runs (``duplex``) and
the hand-off between stages, from the chunks run one after another on one stream (``serial_chunks``).

Every stage and version is timed as the GPU runs it: the stream is first held by a short spin
kernel while Python issues the work, so the window holds the copies and kernels back to back and
none of the time Python takes to issue them, which is of the order of a chunk's kernel (the README beside
this file quotes both). That launch time is reported on its own (``launch_seconds``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import cuda
from .._checks import check_int
from ..errors import ArgumentError, UnknownKeyError
from ..reporting import tables as report
from ..reporting.units import fmt_bytes
from . import kernels, timing
from .duplex import DuplexPoint, duplex_line, measure_duplex
from .pipeline_model import (
    HANDOFFS_ON_THE_FILL,
    ExcessExplained,
    handoff_seconds,
    ideal_pipeline_seconds,
    measured_ideal_seconds,
)
from .timing import Summary
from .transfers import ProgressBar, check_host_room, check_run_options, run_on_device

BLOCK_SIZE = kernels.BLOCK_SIZE
CHUNK_ELEMENTS = 4 * 1024 * BLOCK_SIZE  # floats per stream, as in async.cu
MAX_ERROR_TOLERANCE = 1e-5
VERSIONS = ("sequential", "async_v1", "async_v2")
# Back-to-back repeats of one stage in a timed sample: a lone 5-15 us kernel is near the events' resolution.
STAGE_REPEATS = 8


@dataclass(frozen=True)
class OverlapConfig:
    """Streams and array size (float32 elements; default 4*1024*256 per stream, like async.cu)."""

    streams: int = 4
    elements: int | None = None
    repeats: int = 20
    warmup: int = 3
    device: int = 0

    def __post_init__(self) -> None:
        check_int("--streams", self.streams, ge=1)
        check_int("--elements", self.elements, ge=1, optional=True)
        elements = CHUNK_ELEMENTS * self.streams if self.elements is None else self.elements
        object.__setattr__(self, "elements", elements)
        if elements % self.streams:
            raise ArgumentError(f"--elements ({elements}) must be a multiple of --streams ({self.streams})")
        check_run_options(self.repeats, self.warmup, self.device)
        check_host_room(elements * 4, f"{elements:,} float32 elements")

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
        return 3 + len(VERSIONS) + 2  # the stages, the versions, the duplex stage, the serial chunks

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk_elements"] = self.chunk_elements
        d["nbytes"] = self.nbytes
        return d


@dataclass(frozen=True)
class ChunkTimes:
    """Seconds of one chunk's three pieces: its H2D copy, its kernel, its D2H copy.

    The result holds two: ``stages``, the device seconds of each piece measured alone; ``launch``, the
    host seconds Python takes to issue each (what a caller pays per launch on the CPU, and what would
    leave the GPU idle if the work were issued to an idle stream one piece at a time).
    """

    h2d: Summary
    kernel: Summary
    d2h: Summary

    def to_dict(self) -> dict[str, Any]:
        return {"h2d": self.h2d.to_dict(), "kernel": self.kernel.to_dict(), "d2h": self.d2h.to_dict()}


@dataclass(frozen=True)
class VersionTiming:
    """One version's device seconds over the repeats, and its worst |result - 1| over all runs."""

    name: str
    seconds: Summary
    max_error: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds.to_dict(), "max_error": self.max_error}


@dataclass(frozen=True)
class OverlapResult:
    config: OverlapConfig
    device: cuda.DeviceInfo
    stages: ChunkTimes
    versions: tuple[VersionTiming, ...]
    launch: ChunkTimes | None = None
    overran: int = 0
    duplex: tuple[DuplexPoint, ...] = ()
    serial_chunks: VersionTiming | None = None

    @property
    def ideal_seconds(self) -> float:
        s = self.stages
        return ideal_pipeline_seconds(s.h2d.median, s.kernel.median, s.d2h.median, self.config.streams)

    @property
    def chunk_duplex(self) -> DuplexPoint | None:
        """The duplex point at the pipeline's chunk size, the one its ideal uses."""
        chunk_bytes = self.config.chunk_elements * 4
        return next((p for p in self.duplex if p.nbytes == chunk_bytes), None)

    @property
    def handoff_seconds(self) -> float | None:
        if self.serial_chunks is None:
            return None
        s = self.stages
        return handoff_seconds(self.serial_chunks.seconds.median, s.h2d.median, s.kernel.median, s.d2h.median,
                               self.config.streams)

    def _ideal_with(self, handoff: bool) -> float | None:
        point, hop = self.chunk_duplex, self.handoff_seconds
        if point is None or hop is None:
            return None
        s = self.stages
        return measured_ideal_seconds(s.h2d.median, s.kernel.median, s.d2h.median, self.config.streams,
                                      point.ratio("h2d"), point.ratio("d2h"), hop if handoff else 0.0)

    @property
    def duplex_ideal_seconds(self) -> float | None:
        """The ideal with the copies' steady-state steps at their duplex rates (None until both are measured)."""
        return self._ideal_with(handoff=False)

    @property
    def measured_ideal_seconds(self) -> float | None:
        """The ideal with the duplex rates and the fill's hand-offs (None until both are measured)."""
        return self._ideal_with(handoff=True)

    def excess(self, name: str) -> ExcessExplained | None:
        """How much of a pipelined version's miss of the blog's ideal the duplex rates and the hand-off explain.

        None for ``sequential`` (it pipelines nothing) and until both parts are measured.
        """
        duplex_ideal, measured_ideal, hop = self.duplex_ideal_seconds, self.measured_ideal_seconds, self.handoff_seconds
        if duplex_ideal is None or measured_ideal is None or hop is None or name == "sequential":
            return None
        return ExcessExplained(name, self.version(name).seconds.median, self.ideal_seconds, duplex_ideal,
                               measured_ideal, hop)

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
        """The worst over every run of every version, the serial chunks included."""
        serial = (self.serial_chunks,) if self.serial_chunks else ()
        return max(v.max_error for v in (*self.versions, *serial))

    @property
    def correct(self) -> bool:
        """Every computed value within tolerance, and every duplex copy brought back the bytes sent."""
        return self.problem is None

    @property
    def problem(self) -> str | None:
        """What makes the run wrong, in one line; None when it is correct."""
        if self.max_error >= MAX_ERROR_TOLERANCE:
            return f"max error {self.max_error:.3g} exceeds {MAX_ERROR_TOLERANCE:g}"
        bad = [fmt_bytes(p.nbytes) for p in self.duplex if not p.verified]
        return f"duplex copies of {', '.join(bad)} brought back other bytes" if bad else None

    def to_dict(self) -> dict[str, Any]:
        versions = []
        for v in self.versions:
            d = v.to_dict()
            d["speedup_vs_sequential"] = self.speedup(v.name)
            d["vs_ideal"] = self.vs_ideal(v.name)
            excess = self.excess(v.name)
            d["excess_explained"] = excess.to_dict() if excess else None
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
            "duplex": [p.to_dict() for p in self.duplex],
            "handoff": None if self.serial_chunks is None else {
                "serial_chunks": self.serial_chunks.to_dict(), "chunks": self.config.streams,
                "seconds": self.handoff_seconds,
                "formula": "(serial_chunks - chunks * (h2d + kernel + d2h)) / (3 * chunks - 1)"},
            "ideal_from_measured_stages": {
                "duplex_seconds": self.duplex_ideal_seconds, "seconds": self.measured_ideal_seconds,
                "formula": f"(h2d + kernel + d2h + {HANDOFFS_ON_THE_FILL} * handoff) + (streams - 1) * "
                           "max(h2d * duplex_ratio.h2d, kernel, d2h * duplex_ratio.d2h), at the chunk size"},
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
    serial_ups = [cuda.CopyBurst("h2d", [(d, h)], main) for _, h, d in chunks]
    serial_downs = [cuda.CopyBurst("d2h", [(h, d)], main) for _, h, d in chunks]

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
    stages = ChunkTimes(*stage)

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

    def serial_chunks() -> None:
        """async_v1's work on one stream: no two stages at once, so beyond the stages only hand-offs remain."""
        for (o, _, d), up, down in zip(chunks, serial_ups, serial_downs):
            up()
            kernel(d, o, main)
            down()

    versions = []
    for name, work, used in (("sequential", sequential, [main]),
                             ("async_v1", async_v1, streams),
                             ("async_v2", async_v2, streams)):
        version, late = _time_version(name, work, host, main, used, spin, warm, reps)
        versions.append(version)
        overran += late
        tick(name)
    serial, late = _time_version("serial_chunks", serial_chunks, host, main, [main], spin, warm, reps)
    overran += late
    tick("serial_chunks")
    sizes = tuple(dict.fromkeys((4 * chunk, 4 * n)))  # one size when there is one stream
    duplex, late = measure_duplex(sizes, STAGE_REPEATS, reps, warm, spin.hold)
    tick("duplex")
    return OverlapResult(config, device, stages, tuple(versions), ChunkTimes(*launch), overran + late,
                         duplex, serial)


def _time_version(name: str, work: Callable[[], None], host: np.ndarray, main: Any, used: list, spin: Any,
                  warm: int, reps: int) -> tuple[VersionTiming, int]:
    """One version over ``warm + reps`` runs, each queued behind a hold and checked; and its overran samples."""
    times, worst, slowest, overran = [], 0.0, 0.0, 0
    for i in range(warm + reps):
        held = timing.HOLD_FACTOR * slowest + timing.HOLD_MARGIN_S
        seconds, issued = _timed_run(work, host, main, used, functools.partial(spin.hold, main, held))
        worst = max(worst, float(np.max(np.abs(host - np.float32(1.0)))))
        if i >= warm:
            times.append(seconds)
            overran += issued > held
        slowest = max(slowest, issued)
    return VersionTiming(name, timing.summarize(times), worst), overran


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
    """The readable report: set-up, stage times and the ideals, then each version."""
    c, st = result.config, result.stages
    head = report.key_values([
        ("device", f"GPU {result.device.index}: {result.device.name} ({result.device.copy_engines} copy engines)"),
        ("array", f"{c.elements} float32 ({fmt_bytes(c.nbytes)}), {c.streams} streams x {c.chunk_elements}"),
        ("per-chunk stages", f"H2D {1e3 * st.h2d.median:.3f} ms, kernel {1e3 * st.kernel.median:.3f} ms, "
                             f"D2H {1e3 * st.d2h.median:.3f} ms"),
        ("launch from Python", _launch_line(result.launch)),
        ("ideal pipelined", f"{1e3 * result.ideal_seconds:.3f} ms = (h+k+d) + (streams-1) * max(h,k,d)"),
        *[(f"duplex {fmt_bytes(p.nbytes)}", duplex_line(p)) for p in result.duplex],
        ("hand-off", _handoff_line(result)),
        ("ideal, measured stages", _measured_ideal_line(result)),
        ("max error", f"{result.max_error:.3g} ({'ok' if result.correct else 'WRONG'}: tolerance "
                      f"{MAX_ERROR_TOLERANCE:g})"),
    ], title=f"overlap ({c.repeats} timed runs, median; {c.warmup} warm-up)")
    rows = []
    for v in result.versions:
        ex = result.excess(v.name)
        rows.append([v.name, f"{1e3 * v.seconds.median:.3f}", v.seconds.spread, result.speedup(v.name),
                     result.vs_ideal(v.name), "-" if ex is None else ex.vs_measured_ideal,
                     _share(ex.by_duplex if ex else None), _share(ex.by_handoff if ex else None),
                     "-" if ex is None or ex.crossings_for_the_rest is None else f"{ex.crossings_for_the_rest:.1f}",
                     f"{v.max_error:.3g}"])
    body = report.table(["version", "ms", "spread", "speed-up", "vs ideal", "vs measured", "by duplex",
                         "by hand-off", "rest in hand-offs", "max error"], rows)
    return f"{head}\n\n{body}"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _handoff_line(result: OverlapResult) -> str:
    hop, serial = result.handoff_seconds, result.serial_chunks
    if hop is None or serial is None:
        return "not measured"
    return (f"{1e6 * hop:.2f} us a crossing (the {result.config.streams} chunks one after another on one "
            f"stream: {1e3 * serial.seconds.median:.3f} ms)")


def _measured_ideal_line(result: OverlapResult) -> str:
    duplex, measured = result.duplex_ideal_seconds, result.measured_ideal_seconds
    if duplex is None or measured is None:
        return "not measured"
    return (f"{1e3 * duplex:.3f} ms with the duplex rates, {1e3 * measured:.3f} ms with "
            f"{HANDOFFS_ON_THE_FILL} hand-offs too")


def _launch_line(launch: ChunkTimes | None) -> str:
    if launch is None:
        return "not measured"
    return (f"H2D {1e6 * launch.h2d.median:.1f} us, kernel {1e6 * launch.kernel.median:.1f} us, "
            f"D2H {1e6 * launch.d2h.median:.1f} us of host time a call (not in the device times)")
