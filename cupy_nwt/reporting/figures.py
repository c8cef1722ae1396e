"""A headline figure from repeats: its median, a bootstrap interval, and whether its target is met.

A figure from one short run can sit on either side of its target by noise alone, so the GPU run's
studies judge a target only where the interval allows it: ``met`` when the whole interval is on the
good side, ``missed`` when the whole interval is on the bad side, ``undecided`` when the target lies
inside it (more repeats, or longer ones, would decide it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError

BOOTSTRAP = 2000


def median_interval(values: Sequence[float] | np.ndarray, level: float = 0.9, seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and a bootstrap ``level`` interval of it (seeded: a report gives the same
    interval every time it is read). For per-round ratios of two counts measured in the same rounds.

    Args:
        values: the rounds' figures.
        level: the interval's coverage.
        seed: the bootstrap's seed.

    Returns:
        ``(median, low, high)``.
    """
    v = np.asarray(values, dtype=np.float64)
    medians = np.median(np.random.default_rng(seed).choice(v, size=(BOOTSTRAP, v.size)), axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(v)), float(lo), float(hi)


LEVEL = 0.9  # the bootstrap interval's coverage, as the tuner's studies use
VERDICTS = ("met", "missed", "undecided")


def judge(low: float, high: float, target: float, higher_is_better: bool = True) -> str:
    """``met``, ``missed`` or ``undecided``: where ``target`` lies against the interval ``[low, high]``.

    Args:
        low: the interval's lower end.
        high: its upper end.
        target: the figure's goal (a share, a ratio, a fraction).
        higher_is_better: True when the target is a floor (">= 0.97"), False when it is a ceiling ("< 5 %").
    """
    if low > high:
        raise ArgumentError(f"an interval needs low <= high, got [{low}, {high}]")
    good_low, good_high = (low >= target, high < target) if higher_is_better else (high < target, low >= target)
    return "met" if good_low else "missed" if good_high else "undecided"


def figure(values: Sequence[float], target: float | None = None, higher_is_better: bool = True,
           level: float = LEVEL) -> dict[str, Any]:
    """The repeats of one figure summarised: repeats, values, median, ``level`` interval and verdict.

    Args:
        values: one value per repeat, Python or NumPy numbers (non-finite ones, and anything not a number, are
            dropped and counted as ``dropped``).
        target: the goal to judge against; None leaves ``verdict`` None.
        higher_is_better: see :func:`judge`.
        level: the bootstrap interval's coverage.
    """
    finite = [float(v) for v in values if isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v)]
    out: dict[str, Any] = {"repeats": len(finite), "values": finite, "dropped": len(values) - len(finite),
                           "median": None, "low": None, "high": None, "level": level, "target": target,
                           "verdict": None}
    if not finite:
        return out
    median, low, high = median_interval(finite, level=level)
    out.update(median=median, low=low, high=high)
    if target is not None:
        out["verdict"] = judge(low, high, target, higher_is_better) if len(finite) >= 3 else "undecided"
    return out
