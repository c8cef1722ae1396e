"""Overlapping copies with compute over N streams, after NVIDIA's async.cu.

Three versions move the same array through H2D copy -> kernel -> D2H copy: sequential (one
stream, whole array), async v1 (per stream: copy in, kernel, copy out) and async v2 (all copies
in, then all kernels, then all copies out). Each run starts from zeros in pinned host memory and
must come back as 1.0 everywhere; the per-chunk stage times give the ideal pipelined time that
the async versions are judged against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import cuda
from .._reporting import tables as report
from .._reporting.units import fmt_bytes
from . import timing
from .timing import Stats
from .transfers import Progress, check_run_options, run_on_device

BLOCK_SIZE = 256
CHUNK_ELEMENTS = 4 * 1024 * BLOCK_SIZE  # floats per stream, as in async.cu
MAX_ERROR_TOLERANCE = 1e-5
VERSIONS = ("sequential", "async_v1", "async_v2")
# The blog's kernel: sin^2 + cos^2 of the global index, so every element gains exactly ~1.0.
KERNEL_OPERATION = (
    "float x = (float)(i + offset); float s = sinf(x); float c = cosf(x); a += sqrtf(s * s + c * c);"
)


def ideal_pipeline_seconds(h2d: float, kernel: float, d2h: float, streams: int) -> float:
    """Time of a perfect ``streams``-deep pipeline: fill it once, then one slowest stage per chunk.

    (h + k + d) + (streams - 1) * max(h, k, d). Assumes H2D and D2H run on separate copy engines.
    """
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    if min(h2d, kernel, d2h) < 0:
        raise ValueError("stage times cannot be negative")
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
            raise ValueError(f"--streams must be >= 1, got {self.streams}")
        elements = CHUNK_ELEMENTS * self.streams if self.elements is None else self.elements
        object.__setattr__(self, "elements", elements)
        if elements <= 0:
            raise ValueError(f"--elements must be positive, got {elements}")
        if elements % self.streams:
            raise ValueError(f"--elements ({elements}) must be a multiple of --streams ({self.streams})")
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
class StageTimes:
    """Seconds of one chunk's H2D copy, kernel and D2H copy, each measured alone."""

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
    stages: StageTimes
    versions: tuple[VersionTiming, ...]

    @property
    def ideal_seconds(self) -> float:
        s = self.stages
        return ideal_pipeline_seconds(s.h2d.median, s.kernel.median, s.d2h.median, self.config.streams)

    def version(self, name: str) -> VersionTiming:
        for v in self.versions:
            if v.name == name:
                return v
        raise KeyError(f"no version {name!r}; have {[v.name for v in self.versions]}")

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
            "ideal_seconds": self.ideal_seconds,
            "ideal_formula": "(h2d + kernel + d2h) + (streams - 1) * max(h2d, kernel, d2h)",
            "max_error": self.max_error,
            "max_error_tolerance": MAX_ERROR_TOLERANCE,
            "correct": self.correct,
            "versions": versions,
        }


def run_overlap(config: OverlapConfig | None = None, progress: Progress | None = None) -> OverlapResult:
    """Measure stage times and the three versions on ``config.device``; raises NoGPUError without one."""
    config = config or OverlapConfig()
    return run_on_device(config.device, lambda tick: _run(config, tick), progress)


def _run(config: OverlapConfig, tick: Progress) -> OverlapResult:
    device = cuda.device_info(config.device)
    n, chunk = config.total_elements, config.chunk_elements
    host = cuda.pinned_empty(n, np.float32)
    dev = cuda.device_empty(n, np.float32)
    kernel = cuda.elementwise_kernel("int64 offset", "float32 a", KERNEL_OPERATION, "cupy_nwt_overlap_kernel")
    main = cuda.stream()
    streams = [cuda.stream() for _ in range(config.streams)]
    chunks = [(o, host[o:o + chunk], dev[o:o + chunk]) for o in range(0, n, chunk)]

    def launch(offset: int, d, s) -> None:
        with s:
            kernel(offset, d, block_size=BLOCK_SIZE)

    off0, h0, d0 = chunks[0]
    host.fill(0)
    reps, warm, s0 = config.repeats, config.warmup, streams[0]
    launch(off0, d0, s0)  # compile now: a first call inside a timed window would count the compile
    s0.synchronize()
    stage = []
    for name, fn in (("h2d", lambda st: cuda.memcpy_h2d(d0, h0, st)),
                     ("kernel", lambda st: launch(off0, d0, st)),
                     ("d2h", lambda st: cuda.memcpy_d2h(h0, d0, st))):
        stage.append(timing.summarize(timing.device_time(fn, reps, warm, s0)))
        tick(f"stage {name}")
    stages = StageTimes(*stage)

    def sequential() -> None:
        cuda.memcpy_h2d(dev, host, main)
        launch(0, dev, main)
        cuda.memcpy_d2h(host, dev, main)

    def async_v1() -> None:
        for (o, h, d), s in zip(chunks, streams):
            cuda.memcpy_h2d(d, h, s)
            launch(o, d, s)
            cuda.memcpy_d2h(h, d, s)

    def async_v2() -> None:
        pairs = list(zip(chunks, streams))
        for (_, h, d), s in pairs:
            cuda.memcpy_h2d(d, h, s)
        for (o, _, d), s in pairs:
            launch(o, d, s)
        for (_, h, d), s in pairs:
            cuda.memcpy_d2h(h, d, s)

    versions = []
    for name, work, used in (("sequential", sequential, [main]),
                             ("async_v1", async_v1, streams),
                             ("async_v2", async_v2, streams)):
        times, worst = [], 0.0
        for i in range(warm + reps):
            seconds = _timed_run(work, host, main, used)
            worst = max(worst, float(np.max(np.abs(host - np.float32(1.0)))))
            if i >= warm:
                times.append(seconds)
        versions.append(VersionTiming(name, timing.summarize(times), worst))
        tick(name)
    return OverlapResult(config, device, stages, tuple(versions))


def _timed_run(work: Callable[[], None], host: np.ndarray, main, used: list) -> float:
    """Device seconds of ``work`` over all streams in ``used``, starting from zeros in ``host``.

    The window is opened and closed on ``main`` and joins every other stream in ``used``.
    """
    host.fill(0)
    return timing.event_seconds(work, main, used)


def summary_text(result: OverlapResult) -> str:
    """The readable report: set-up, stage times and the ideal, then each version."""
    c, st = result.config, result.stages
    head = report.key_values([
        ("device", f"GPU {result.device.index}: {result.device.name} ({result.device.copy_engines} copy engines)"),
        ("array", f"{c.elements} float32 ({fmt_bytes(c.nbytes)}), {c.streams} streams x {c.chunk_elements}"),
        ("per-chunk stages", f"H2D {1e3 * st.h2d.median:.3f} ms, kernel {1e3 * st.kernel.median:.3f} ms, "
                             f"D2H {1e3 * st.d2h.median:.3f} ms"),
        ("ideal pipelined", f"{1e3 * result.ideal_seconds:.3f} ms = (h+k+d) + (streams-1) * max(h,k,d)"),
        ("max error", f"{result.max_error:.3g} ({'ok' if result.correct else 'WRONG'}: tolerance "
                      f"{MAX_ERROR_TOLERANCE:g})"),
    ], title=f"overlap ({c.repeats} timed runs, median; {c.warmup} warm-up)")
    rows = [[v.name, f"{1e3 * v.seconds.median:.3f}", v.seconds.spread, result.speedup(v.name),
             result.vs_ideal(v.name), f"{v.max_error:.3g}"] for v in result.versions]
    body = report.table(["version", "ms", "spread", "speed-up", "vs ideal", "max error"], rows)
    return f"{head}\n\n{body}"
