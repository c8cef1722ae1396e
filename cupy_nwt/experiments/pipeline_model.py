"""The overlap experiment's pipelined ideal, and the same ideal rebuilt from what the pipeline really pays.

The blog's ideal takes each stage's time alone: ``(h + k + d) + (streams - 1) * max(h, k, d)``.
Two things a pipeline pays are outside it, and both are measured beside it, so that a miss of the
ideal splits into parts with a number each:

* **duplex**: once the pipeline is full, chunk i's D2H runs while chunk i+1's H2D does, so the
  ``streams - 1`` steady-state steps move at the rates each direction gets while the other runs,
  not at its rate alone (``duplex.py`` measures both);
* **hand-off**: each chunk's H2D -> kernel -> D2H chain crosses from a copy engine to the SMs and
  back; the first chunk's two crossings are on the critical path whatever the rest overlap.

The measured ideal keeps the blog's shape with those two in it:
``(h + k + d + 2 * handoff) + (streams - 1) * max(h * r_h2d, k, d * r_d2h)``, ``r`` being a
direction's time with the other direction running over its time alone at the chunk size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ArgumentError

# Crossings of the first chunk (H2D -> kernel, kernel -> D2H) that no later chunk can hide.
HANDOFFS_ON_THE_FILL = 2


def ideal_pipeline_seconds(h2d: float, kernel: float, d2h: float, streams: int) -> float:
    """Time of a perfect ``streams``-deep pipeline: fill it once, then one slowest stage per chunk.

    (h + k + d) + (streams - 1) * max(h, k, d). Assumes H2D and D2H run on separate copy engines.
    """
    if streams < 1:
        raise ArgumentError(f"streams must be >= 1, got {streams}")
    if min(h2d, kernel, d2h) < 0:
        raise ArgumentError("stage times cannot be negative")
    return (h2d + kernel + d2h) + (streams - 1) * max(h2d, kernel, d2h)


def measured_ideal_seconds(h2d: float, kernel: float, d2h: float, streams: int, h2d_duplex_ratio: float = 1.0,
                           d2h_duplex_ratio: float = 1.0, handoff: float = 0.0) -> float:
    """The ideal with each copy's steady-state time scaled by its duplex ratio, and the fill's hand-offs added.

    A ratio is (time with the other direction running) / (time alone), both from one procedure, so
    that a link that gives full duplex (ratio 1) and free hand-offs give back the blog's ideal exactly.
    """
    ideal_pipeline_seconds(h2d, kernel, d2h, streams)  # the same checks
    if h2d_duplex_ratio <= 0 or d2h_duplex_ratio <= 0:
        raise ArgumentError("duplex ratios must be positive")
    steady = max(h2d * h2d_duplex_ratio, kernel, d2h * d2h_duplex_ratio)
    return (h2d + kernel + d2h + HANDOFFS_ON_THE_FILL * handoff) + (streams - 1) * steady


def handoff_seconds(serial: float, h2d: float, kernel: float, d2h: float, chunks: int) -> float:
    """Seconds per hand-off, from every chunk run one stage after another on one stream.

    Nothing overlaps there, so duplex cannot enter, and the stages are the very ones timed alone:
    what the serial run takes beyond ``chunks * (h + k + d)`` is spent between stages, over the
    ``3 * chunks - 1`` crossings between a copy engine and the SMs (the last D2H ends the run).
    Chosen over "N chunks against 1 chunk of the same bytes", which would also count how a copy's
    and a kernel's speed change with their size. Can come out slightly negative from noise.
    """
    if chunks < 1:
        raise ArgumentError(f"chunks must be >= 1, got {chunks}")
    if chunks == 1:
        return (serial - (h2d + kernel + d2h)) / 2
    return (serial - chunks * (h2d + kernel + d2h)) / (3 * chunks - 1)


@dataclass(frozen=True)
class ExcessExplained:
    """One version's time against the blog's ideal, and how much of the gap each measured ideal closes.

    ``duplex_ideal`` adds only the duplex rates, ``measured_ideal`` the hand-off too. Shares are of
    the excess over the blog's ideal (0.5: half of it); None when the version is not slower than it.
    ``crossings_for_the_rest`` reads the model the other way: how many hand-offs of ``handoff``
    seconds, not the fill's two alone, would close what the duplex rates leave (about ``3 * streams
    - 1`` if every crossing stayed on the critical path).
    """

    version: str
    measured: float
    ideal: float
    duplex_ideal: float
    measured_ideal: float
    handoff: float = 0.0

    @property
    def excess(self) -> float:
        return self.measured - self.ideal

    def _share(self, part: float) -> float | None:
        return part / self.excess if self.excess > 0 else None

    @property
    def by_duplex(self) -> float | None:
        return self._share(self.duplex_ideal - self.ideal)

    @property
    def by_handoff(self) -> float | None:
        return self._share(self.measured_ideal - self.duplex_ideal)

    @property
    def unexplained(self) -> float | None:
        return self._share(self.measured - self.measured_ideal)

    @property
    def vs_measured_ideal(self) -> float:
        return self.measured / self.measured_ideal

    @property
    def crossings_for_the_rest(self) -> float | None:
        rest = self.measured - self.duplex_ideal
        return rest / self.handoff if self.handoff > 0 and rest > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "excess_seconds": self.excess, "by_duplex": self.by_duplex,
                "by_handoff": self.by_handoff, "unexplained": self.unexplained,
                "vs_measured_ideal": self.vs_measured_ideal, "crossings_for_the_rest": self.crossings_for_the_rest}
