"""Host <-> device bandwidth: pageable vs pinned over a size sweep, one big copy vs many small ones.

After NVIDIA's "How to optimize data transfers in CUDA" samples (profile.cu, bandwidthtest.cu).
Every figure is a median over repeats timed with CUDA events on the copying stream, each pinned
sample queued behind a short spin kernel so that the window holds the copies as the GPU runs them,
not the time Python takes to issue them (a 4 KiB copy runs in 1.5-3 us); pageable
copies hold the host until the driver has staged them, so a spin would only add waiting. Every
copy is checked: a fast copy of the wrong bytes is not a result. Bandwidths are compared with the
PCIe link's theoretical rate, read after the largest copies because idle GPUs downclock the link.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import numpy as np

from .. import cuda, system
from .._checks import check_int
from ..errors import ArgumentError, ArgumentTypeError, UnknownKeyError
from ..reporting import tables as report
from ..reporting.units import fmt_bytes, size_sweep
from . import kernels, timing
from .batching import BatchingPoint, Hold, batched_vs_many, queued
from .timing import Summary

DIRECTIONS = ("h2d", "d2h")
MEMORIES = ("pageable", "pinned")
DEFAULT_MIN = 4 * 1024
DEFAULT_MAX = 256 * 1024**2
# Back-to-back copies per timed sample until a sample moves this much: a 4 KiB copy alone lasts
# a few microseconds, close to the events' ~0.5 us resolution (bandwidthtest.cu loops likewise).
SAMPLE_TARGET_BYTES = 8 * 1024**2
MAX_COPIES_PER_SAMPLE = 256
HOST_BUFFERS = 4  # the sweep's host buffers of its largest size: a source and a destination, pageable and pinned

ProgressBar = Callable[[str], None]
R = TypeVar("R")


def check_run_options(repeats: int, warmup: int, device: int) -> None:
    """The options every GPU experiment shares, checked alike before any GPU work: whole numbers in range
    (a float or a string would fail only on the GPU, mid-run)."""
    check_int("--repeats", repeats, ge=1)
    check_int("--warmup", warmup, ge=0)
    check_int("--device", device, ge=0)


def check_host_room(nbytes: int, what: str) -> None:
    """One line, before any GPU work, when the host buffers an experiment would allocate are more than this
    machine's free memory (a size typed with too many digits would fail mid-run, or overflow)."""
    room = system.memory_room()
    if nbytes > room.bytes:
        raise ArgumentError(f"{what} needs {fmt_bytes(nbytes)} of host buffers, more than the "
                            f"{fmt_bytes(room.bytes)} free {room.bound}")


def copies_per_sample(nbytes: int, target: int = SAMPLE_TARGET_BYTES, cap: int = MAX_COPIES_PER_SAMPLE) -> int:
    """How many copies of ``nbytes`` one timed sample issues (at least 1, at most ``cap``)."""
    if nbytes <= 0:
        raise ArgumentError(f"copy size must be positive, got {nbytes}")
    return max(1, min(cap, -(-target // nbytes)))


@dataclass(frozen=True)
class BandwidthConfig:
    """What to sweep; validated on construction so bad input fails before any GPU work."""

    sizes: tuple[int, ...] = tuple(size_sweep(DEFAULT_MIN, DEFAULT_MAX))
    repeats: int = 20
    warmup: int = 3
    device: int = 0
    batch_total: int = 64 * 1024**2
    batch_chunk: int = 64 * 1024
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.sizes, (str, bytes)) or not isinstance(self.sizes, Sequence):
            raise ArgumentTypeError(f"sizes must be a sequence of byte counts, got {self.sizes!r}")
        if not self.sizes:
            raise ArgumentError("the size sweep is empty")
        for n in self.sizes:
            check_int("every size", n, ge=1)
        check_run_options(self.repeats, self.warmup, self.device)
        check_int("--batch-total", self.batch_total, ge=1)
        check_int("--batch-chunk", self.batch_chunk, ge=1)
        if self.batch_chunk > self.batch_total or self.batch_total % self.batch_chunk:
            raise ArgumentError(
                f"batched-copy total ({fmt_bytes(self.batch_total)}) must be a whole multiple "
                f"of the chunk ({fmt_bytes(self.batch_chunk)})"
            )
        check_host_room(HOST_BUFFERS * self.buffer_bytes, f"the sweep up to {fmt_bytes(self.buffer_bytes)}")

    @property
    def buffer_bytes(self) -> int:
        return max(max(self.sizes), self.batch_total)

    @property
    def steps(self) -> int:
        """ProgressBar steps of a run: one per (size, memory), one per memory for the batching test."""
        return len(self.sizes) * len(MEMORIES) + len(MEMORIES)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sizes"] = list(self.sizes)
        return d


@dataclass(frozen=True)
class BandwidthPoint:
    """One (direction, memory, size): seconds per copy and GB/s per sample."""

    direction: str
    memory: str
    nbytes: int
    copies_per_sample: int
    seconds: Summary
    gbps: Summary
    verified: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "memory": self.memory,
            "nbytes": self.nbytes,
            "copies_per_sample": self.copies_per_sample,
            "seconds": self.seconds.to_dict(),
            "gbps": self.gbps.to_dict(),
            "verified": self.verified,
        }


@dataclass(frozen=True)
class Speedup:
    """Pinned over pageable at one size and direction (median GB/s over median GB/s)."""

    direction: str
    nbytes: int
    pageable_gbps: float
    pinned_gbps: float

    @property
    def speedup(self) -> float:
        return self.pinned_gbps / self.pageable_gbps if self.pageable_gbps > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speedup"] = self.speedup
        return d


def link_rate(link: cuda.PcieLink | None) -> tuple[float | None, str]:
    """The link rate to compare against, and which figure it is ("max", "current" or "none").

    The maximum generation and width the GPU and its slot negotiate is preferred: the current
    figure drops when the GPU idles, so it understates the link unless read under load.
    """
    if link is not None and link.max_gbps:
        return link.max_gbps, "max"
    if link is not None and link.current_gbps:
        return link.current_gbps, "current"
    return None, "none"


def speedups(points: tuple[BandwidthPoint, ...] | list[BandwidthPoint]) -> tuple[Speedup, ...]:
    """Pinned/pageable per (direction, size) wherever both were measured, in sweep order."""
    index = {(p.direction, p.memory, p.nbytes): p for p in points}
    out = []
    for direction in DIRECTIONS:
        for nbytes in sorted({p.nbytes for p in points if p.direction == direction}):
            pageable = index.get((direction, "pageable", nbytes))
            pinned = index.get((direction, "pinned", nbytes))
            if pageable and pinned:
                out.append(Speedup(direction, nbytes, pageable.gbps.median, pinned.gbps.median))
    return tuple(out)


@dataclass(frozen=True)
class BandwidthResult:
    """A whole bandwidth run: configuration, machine, link and every measured point."""

    config: BandwidthConfig
    device: cuda.DeviceInfo
    host: system.HostInfo
    link: cuda.PcieLink | None
    points: tuple[BandwidthPoint, ...]
    batching: tuple[BatchingPoint, ...]

    @property
    def link_choice(self) -> tuple[float | None, str]:
        """The rate every share is taken of, and its basis: "max", "gpu-max", "current" or "none".

        NVML's maximum for this system comes first. When a pinned copy beat it and the GPU's own
        maximum is higher, the system figure cannot be the link (a VM's virtual port reads low):
        the GPU's own maximum is used instead, and ``link_label`` says so.
        """
        rate, basis = link_rate(self.link)
        gpu = self.link.gpu_max_gbps if self.link is not None else None
        best = max((p.gbps.median for p in self.points if p.memory == "pinned"), default=0.0)
        if rate and gpu and basis == "max" and best > rate and gpu > rate:
            return gpu, "gpu-max"
        return rate, basis

    @property
    def link_gbps(self) -> float | None:
        return self.link_choice[0]

    @property
    def link_basis(self) -> str:
        return self.link_choice[1]

    @property
    def link_label(self) -> str:
        """Human description of the link figure used, e.g. 'Gen5 x16 (max, nvml): 63.0 GB/s'."""
        basis, link, rate = self.link_basis, self.link, self.link_gbps
        if link is None:
            return "link limit unknown (neither NVML nor sysfs reports the link, as inside some VMs)"
        if rate is None:
            return f"link limit unknown (the {link.source} reading has no usable generation and width)"
        if basis == "gpu-max":
            return (f"Gen{link.gpu_max_gen} x{link.gpu_max_width} (the GPU's own max; {link.source}'s max for this "
                    f"system, Gen{link.max_gen} x{link.max_width} = {link.max_gbps:.1f} GB/s, was beaten by a "
                    f"copy, as behind a VM's virtual port): {rate:.1f} GB/s per direction")
        gen, width = (link.max_gen, link.max_width) if basis == "max" else (link.current_gen, link.current_width)
        return f"Gen{gen} x{width} ({basis}, {link.source}): {rate:.1f} GB/s per direction"

    @property
    def over_link(self) -> tuple[BandwidthPoint, ...]:
        """Points faster than the link they are compared with: a wrong link reading, never a result."""
        return tuple(p for p in self.points if (f := self.link_fraction(p)) is not None and f > 1.0)

    @property
    def verified(self) -> bool:
        return all(p.verified for p in self.points) and all(b.verified for b in self.batching)

    @property
    def speedups(self) -> tuple[Speedup, ...]:
        return speedups(self.points)

    def link_fraction(self, point: BandwidthPoint) -> float | None:
        """Median GB/s of ``point`` as a fraction of the link's theoretical rate."""
        rate = self.link_gbps
        return point.gbps.median / rate if rate else None

    def point(self, direction: str, memory: str, nbytes: int) -> BandwidthPoint:
        for p in self.points:
            if (p.direction, p.memory, p.nbytes) == (direction, memory, nbytes):
                return p
        raise UnknownKeyError(f"no {direction} {memory} point at {nbytes} B")

    def to_dict(self) -> dict[str, Any]:
        points = []
        for p in self.points:
            d = p.to_dict()
            d["link_fraction"] = self.link_fraction(p)
            points.append(d)
        return {
            "experiment": "bandwidth",
            "config": self.config.to_dict(),
            "device": self.device.to_dict(),
            "host": self.host.to_dict(),
            "link_after_warmup": self.link.to_dict() if self.link else None,
            "link_gbps": self.link_gbps,
            "link_basis": self.link_basis,
            "over_link": [{"direction": p.direction, "memory": p.memory, "nbytes": p.nbytes,
                           "link_fraction": self.link_fraction(p)} for p in self.over_link],
            "verified": self.verified,
            "points": points,
            "speedups": [s.to_dict() for s in self.speedups],
            "batching": [b.to_dict() for b in self.batching],
        }


def run_bandwidth(config: BandwidthConfig | None = None, progress: ProgressBar | None = None) -> BandwidthResult:
    """Measure the sweep and the batching comparison on ``config.device``; raises NoGPUError without one."""
    config = config or BandwidthConfig()
    return run_on_device(config.device, lambda tick: _run(config, tick), progress)


def run_on_device(device: int, experiment: Callable[[ProgressBar], R], progress: ProgressBar | None = None) -> R:
    """Run ``experiment(tick)`` with ``device`` current; the memory pools go back to the driver after.

    Raises NoGPUError without a usable GPU, ValueError for a device index this machine lacks.
    """
    cuda.require_gpu()
    check_device_index(device)
    cuda.use_device(device)
    try:
        return experiment(progress or (lambda _label: None))
    finally:
        cuda.release_memory_pools()


def check_device_index(device: int) -> None:
    count = cuda.device_count()
    if not 0 <= device < count:
        raise ArgumentError(f"there is no GPU {device}: this machine has {count} (use --device 0..{count - 1})")


def _run(config: BandwidthConfig, tick: ProgressBar) -> BandwidthResult:
    device = cuda.device_info(config.device)
    host = system.host_info()
    n = config.buffer_bytes
    pattern = np.frombuffer(np.random.default_rng(config.seed).bytes(n), dtype=np.uint8)
    dev = cuda.device_empty(n, np.uint8)
    buffers = {"pageable": (np.empty(n, np.uint8), np.empty(n, np.uint8)),
               "pinned": (cuda.pinned_empty(n, np.uint8), cuda.pinned_empty(n, np.uint8))}
    for src, dst in buffers.values():
        src[:] = pattern
        dst.fill(0)  # touch every page now, not inside a timed copy
    s = cuda.stream()
    hold = kernels.SpinKernel().hold

    points: list[BandwidthPoint] = []
    for nbytes in sorted(config.sizes):
        for memory in MEMORIES:
            src, dst = buffers[memory]
            points += _round_trip(dev[:nbytes], src[:nbytes], dst[:nbytes], memory, config, s,
                                  hold if memory == "pinned" else None)
            tick(f"{memory} {fmt_bytes(nbytes)}")
    # Read right after the largest copies: the link is at its working speed now.
    link = cuda.pcie_link(config.device)

    batching: list[BatchingPoint] = []
    total = config.batch_total
    for memory in MEMORIES:
        src, dst = buffers[memory]
        for direction in DIRECTIONS:
            batching.append(batched_vs_many(direction, memory, dev[:total], src[:total], dst[:total], config, s,
                                             hold if memory == "pinned" else None))
        tick(f"{memory} batching")
    return BandwidthResult(config, device, host, link, tuple(points), tuple(batching))


def _round_trip(dev, src: np.ndarray, dst: np.ndarray, memory: str, config: BandwidthConfig, s,
                hold: Hold | None) -> list[BandwidthPoint]:
    """Time H2D into a zeroed device buffer, then D2H into a zeroed host buffer; check the bytes."""
    nbytes = src.nbytes
    k = copies_per_sample(nbytes)
    with s:
        dev.fill(0)
    dst.fill(0)
    up_t = [t / k for t in queued(repeated_copy("h2d", dev, src, k, s), config, s, hold)]
    down_t = [t / k for t in queued(repeated_copy("d2h", dev, dst, k, s), config, s, hold)]
    s.synchronize()
    ok = bool(np.array_equal(dst, src))
    return [_point(direction, memory, nbytes, k, times, ok)
            for direction, times in (("h2d", up_t), ("d2h", down_t))]


def repeated_copy(direction: str, dev: Any, host: np.ndarray, count: int, stream: Any) -> cuda.CopyBurst:
    """``count`` back-to-back copies host -> ``dev`` ("h2d") or ``dev`` -> host ("d2h") on ``stream``.

    One timed sample of a copy size: a lone small copy lasts about as long as the events' resolution.
    Everything but the copies themselves is done here, before any timing starts.
    """
    if direction not in DIRECTIONS:
        raise ArgumentError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    pair = (dev, host) if direction == "h2d" else (host, dev)
    return cuda.CopyBurst(direction, [pair] * count, stream)


def _point(direction: str, memory: str, nbytes: int, k: int, times: list[float], ok: bool) -> BandwidthPoint:
    return BandwidthPoint(direction, memory, nbytes, k, timing.summarize(times),
                          timing.summarize([timing.gbps(nbytes, t) for t in times]), ok)


def bandwidth_summary(result: BandwidthResult) -> str:
    """The readable report: device and link, the sweep with speed-ups, then the batching test."""
    d = result.device
    head = report.key_values([
        ("device", f"GPU {d.index}: {d.name} (cc {d.compute_capability}, {d.copy_engines} copy engines)"),
        ("PCIe link", result.link_label),
        ("repeats", f"{result.config.repeats} timed (median), {result.config.warmup} warm-up, CUDA events"),
        ("data check", "all copies verified" if result.verified else "MISMATCH: copied bytes differ"),
    ], title="bandwidth (GB/s = 1e9 B/s)")
    rows = []
    for nbytes in sorted(result.config.sizes):
        row: list[Any] = [fmt_bytes(nbytes)]
        for direction in DIRECTIONS:
            page = result.point(direction, "pageable", nbytes).gbps.median
            pin = result.point(direction, "pinned", nbytes)
            frac = result.link_fraction(pin)
            row += [page, pin.gbps.median, pin.gbps.median / page if page else None,
                    None if frac is None else f"{100 * frac:.0f}%" + ("!" if frac > 1.0 else "")]
        rows.append(row)
    sweep = report.table(
        ["size", "H2D pageable", "H2D pinned", "x", "H2D %link", "D2H pageable", "D2H pinned", "x", "D2H %link"],
        rows, title="pinned vs pageable (median GB/s; x = pinned/pageable; %link = pinned vs link)")
    brows = [[b.direction.upper(), b.memory, f"{b.chunks} x {fmt_bytes(b.chunk_bytes)}",
              b.one_copy_gbps, b.many_copies_gbps, b.slowdown] for b in result.batching]
    total = fmt_bytes(result.config.batch_total)
    batch = report.table(["dir", "memory", "many", "one copy GB/s", "many copies GB/s", "slowdown"],
                         brows, title=f"{total} as one copy vs many small copies")
    parts = [head, sweep, batch]
    if over := result.over_link:
        parts.append(f"WARNING: {len(over)} point(s) marked ! ran over 100% of the link figure used "
                     f"({result.link_label}): that reading is wrong for this machine, so no share of it is a result")
    return "\n\n".join(parts)
