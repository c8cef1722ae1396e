"""One big copy vs many small ones of the same bytes: the bandwidth run's batching comparison.

Both plans are bursts of ``cudaMemcpyAsync`` worked out before timing and queued behind a spin,
so the gap between them is what the driver and the link charge per copy, not Python's call cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import cuda
from . import timing
from .timing import Summary


class RunOptions(Protocol):
    """What a timed comparison reads from the run's configuration (``transfers.BandwidthConfig``)."""

    @property
    def repeats(self) -> int: ...
    @property
    def warmup(self) -> int: ...
    @property
    def batch_total(self) -> int: ...
    @property
    def batch_chunk(self) -> int: ...

Hold = Callable[[Any, float], object]


def queued(issue: Callable[[], object], config: RunOptions, s: Any, hold: Hold | None) -> tuple[float, ...]:
    """Device seconds of each sample of ``issue()``, queued behind a hold (see ``timing.queued_time``).

    ``hold`` None: an event window alone. For pageable memory, where each copy returns only once the
    driver has staged (H2D) or delivered (D2H) its bytes, a hold would only make the host wait.
    """
    if hold is None:
        return tuple(timing.device_time(lambda _s: issue(), config.repeats, config.warmup, s))
    return timing.queued_time(lambda _s: issue(), hold, config.repeats, config.warmup, s).device


@dataclass(frozen=True)
class BatchingPoint:
    """The same bytes moved as one copy and as ``chunks`` copies of ``chunk_bytes``."""

    direction: str
    memory: str
    total_bytes: int
    chunk_bytes: int
    one_copy: Summary
    many_copies: Summary
    verified: bool

    @property
    def chunks(self) -> int:
        return self.total_bytes // self.chunk_bytes

    @property
    def one_copy_gbps(self) -> float:
        return timing.gbps(self.total_bytes, self.one_copy.median)

    @property
    def many_copies_gbps(self) -> float:
        return timing.gbps(self.total_bytes, self.many_copies.median)

    @property
    def slowdown(self) -> float:
        """How many times longer the many small copies take than the one batched copy."""
        return self.many_copies.median / self.one_copy.median if self.one_copy.median > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "memory": self.memory,
            "total_bytes": self.total_bytes,
            "chunk_bytes": self.chunk_bytes,
            "chunks": self.chunks,
            "one_copy_seconds": self.one_copy.to_dict(),
            "many_copies_seconds": self.many_copies.to_dict(),
            "one_copy_gbps": self.one_copy_gbps,
            "many_copies_gbps": self.many_copies_gbps,
            "slowdown": self.slowdown,
            "verified": self.verified,
        }


def batched_vs_many(direction: str, memory: str, dev, src: np.ndarray, dst: np.ndarray,
                     config: RunOptions, s, hold: Hold | None) -> BatchingPoint:
    """Same bytes, one copy vs ``total/chunk`` copies; each plan's destination is checked after.

    Both plans are bursts built before timing and queued behind a hold, so the many small copies
    cost what the driver and the link make them cost, not what issuing them from Python does.
    """
    total, chunk = config.batch_total, config.batch_chunk
    offsets = range(0, total, chunk)
    if direction == "h2d":
        plans = ([(dev, src)], [(dev[o:o + chunk], src[o:o + chunk]) for o in offsets])
    else:
        plans = ([(dst, dev)], [(dst[o:o + chunk], dev[o:o + chunk]) for o in offsets])
        cuda.memcpy_h2d(dev, src, s)  # the device side must hold the pattern to copy back
    stats, ok = [], True
    for plan in plans:
        burst = cuda.CopyBurst(direction, plan, s)
        if direction == "h2d":
            with s:
                dev.fill(0)
        else:
            s.synchronize()
            dst.fill(0)
        stats.append(timing.summarize(queued(burst, config, s, hold)))
        if direction == "h2d":
            s.synchronize()
            dst.fill(0)
            cuda.memcpy_d2h(dst, dev, s)
        s.synchronize()
        ok = ok and bool(np.array_equal(dst, src))
    return BatchingPoint(direction, memory, total, chunk, stats[0], stats[1], ok)
