"""H2D and D2H at the same time: what each direction keeps of its bandwidth alone.

A pipeline's steady state copies chunk i back while chunk i+1 goes up, so its ideal needs the rate
of each direction *during* the other. Per size, each round times three samples, interleaved so that
drift moves all three alike: H2D alone, D2H alone, and both at once on two streams, the same bytes
each way from and to pinned memory. A sample is ``copies`` back-to-back copies each way, queued
behind a spin kernel as the overlap stages are (``timing.event_seconds_each``: one window, and each
stream's own end). The faster direction's own end is its duplex time; the slower one gets the last
moments alone, so its duplex rate reads a little high: the ratio errs towards "duplex costs nothing".
Every copy is checked: the bytes that arrive must be the bytes sent.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import cuda
from ..errors import ArgumentError
from . import timing
from .timing import Summary


@dataclass(frozen=True)
class DuplexPoint:
    """Seconds per copy of ``nbytes`` at one size: each direction alone, each while the other runs, the pair."""

    nbytes: int
    copies: int
    h2d_alone: Summary
    d2h_alone: Summary
    h2d_duplex: Summary
    d2h_duplex: Summary
    both: Summary
    verified: bool

    def ratio(self, direction: str) -> float:
        """A direction's median time with the other running over its time alone: 1.25 = 25% slower in duplex."""
        if direction not in ("h2d", "d2h"):
            raise ArgumentError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        alone, duplex = (self.h2d_alone, self.h2d_duplex) if direction == "h2d" else (self.d2h_alone, self.d2h_duplex)
        return duplex.median / alone.median

    def gbps(self, stats: Summary) -> float:
        return timing.gbps(self.nbytes, stats.median)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nbytes": self.nbytes, "copies_per_sample": self.copies,
            "seconds": {"h2d_alone": self.h2d_alone.to_dict(), "d2h_alone": self.d2h_alone.to_dict(),
                        "h2d_duplex": self.h2d_duplex.to_dict(), "d2h_duplex": self.d2h_duplex.to_dict(),
                        "both": self.both.to_dict()},
            "gbps": {"h2d_alone": self.gbps(self.h2d_alone), "d2h_alone": self.gbps(self.d2h_alone),
                     "h2d_duplex": self.gbps(self.h2d_duplex), "d2h_duplex": self.gbps(self.d2h_duplex),
                     "both_ways": 2 * self.gbps(self.both)},
            "duplex_ratio": {"h2d": self.ratio("h2d"), "d2h": self.ratio("d2h")},
            "verified": self.verified,
        }


def duplex_line(point: DuplexPoint) -> str:
    """One report line: each direction's GB/s alone -> in duplex, and the time ratio."""
    return (f"H2D {point.gbps(point.h2d_alone):.1f} -> {point.gbps(point.h2d_duplex):.1f} GB/s "
            f"(x{point.ratio('h2d'):.3f} time), D2H {point.gbps(point.d2h_alone):.1f} -> "
            f"{point.gbps(point.d2h_duplex):.1f} GB/s (x{point.ratio('d2h'):.3f}), "
            f"{'checked' if point.verified else 'MISMATCH'}")


def measure_duplex(sizes: Sequence[int], copies: int, repeats: int, warmup: int,
                   hold: Callable[[Any, float], object]) -> tuple[tuple[DuplexPoint, ...], int]:
    """Duplex points for each byte size in ``sizes``, and how many samples outran their hold.

    ``hold(stream, seconds)`` keeps a stream busy (the spin kernel) while a sample is issued. Runs
    on the current device; its buffers (two pinned, two device, the largest size each) are its own.
    """
    if copies < 1 or repeats < 1 or warmup < 0 or not sizes or min(sizes) < 1:
        raise ArgumentError("duplex needs copies >= 1, repeats >= 1, warmup >= 0 and positive sizes")
    n = max(sizes)
    sent = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    host_up, host_down = cuda.pinned_empty(n, np.uint8), cuda.pinned_empty(n, np.uint8)
    host_up[:] = sent
    dev_up, dev_down = cuda.device_empty(n, np.uint8), cuda.device_empty(n, np.uint8)
    main, a, b = cuda.stream(), cuda.stream(), cuda.stream()
    cuda.CopyBurst("h2d", [(dev_down, host_up)], main)()  # what the D2H copies bring back
    main.synchronize()
    points, overran = [], 0
    for m in sizes:
        host_down.fill(0)
        cuda.CopyBurst("h2d", [(dev_up[:m], host_down[:m])], main)()  # zeros: a copy that never ran shows
        main.synchronize()
        up = cuda.CopyBurst("h2d", [(dev_up[:m], host_up[:m])] * copies, a)
        down = cuda.CopyBurst("d2h", [(host_down[:m], dev_down[:m])] * copies, b)

        def both(up: cuda.CopyBurst = up, down: cuda.CopyBurst = down) -> None:
            up()
            down()

        samples: dict[str, list[float]] = {k: [] for k in ("h2d_alone", "d2h_alone", "h2d_duplex", "d2h_duplex",
                                                           "both")}
        slowest = 0.0
        for i in range(warmup + repeats):
            for name, work in (("h2d", up), ("d2h", down), ("both", both)):
                held = timing.HOLD_FACTOR * slowest + timing.HOLD_MARGIN_S
                total, (end_a, end_b), issued = _sample(work, main, (a, b), functools.partial(hold, main, held))
                slowest = max(slowest, issued)
                if i < warmup:
                    continue
                overran += issued > held
                if name == "both":
                    samples["h2d_duplex"].append(end_a / copies)
                    samples["d2h_duplex"].append(end_b / copies)
                    samples["both"].append(total / copies)
                else:
                    samples[f"{name}_alone"].append(total / copies)
        main.synchronize()
        verified = bool(np.array_equal(cuda.as_numpy(dev_up[:m]), sent[:m])
                        and np.array_equal(host_down[:m], sent[:m]))
        s = {k: timing.summarize(v) for k, v in samples.items()}
        points.append(DuplexPoint(m, copies, s["h2d_alone"], s["d2h_alone"], s["h2d_duplex"], s["d2h_duplex"],
                                  s["both"], verified))
    return tuple(points), overran


def _sample(work: Callable[[], None], main: Any, streams: Sequence[Any],
            lead: Callable[[], object]) -> tuple[float, tuple[float, ...], float]:
    """(window seconds, each stream's own end, host seconds to issue ``work``) of one sample behind ``lead``."""
    issued = [0.0]

    def timed() -> None:
        t0 = time.perf_counter()
        work()
        issued[0] = time.perf_counter() - t0

    total, ends = timing.event_seconds_each(timed, main, streams, lead=lead)
    return total, ends, issued[0]
