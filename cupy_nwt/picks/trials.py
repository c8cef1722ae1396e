"""A tuning's record: one run of a worker count (:class:`Trial`) and how repeated runs of a count combine.

What a saved pick keeps of the trials behind it, read back by ``store.TuneResult``; the searches
that make the runs live in ``cupy_nwt.nwt`` (its ``trials`` module runs the measure and records
each run here). Pure arithmetic: nothing here measures or builds a loader.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Trial:
    """A worker count's measurement: one run, or (in ``TuneResult.trials``) its runs combined.

    ``wait_fraction`` and ``step_seconds``: the consumer's wait and the step's time with the user's
    step in the loop (a search's ``nwt.trials.Measurement``, or the training loop a loader tuned
    online watched; ``phase`` "online"), else None. ``other_cpus``: how many of the usable CPUs
    other processes kept busy during the run (None: not measured); runs combined keep the most.
    """

    workers: int
    iterations: int
    warmup: int
    seconds_per_iteration: float
    samples_per_second: float
    wall_seconds: float
    peak_memory_bytes: int | None
    peak_uss_bytes: int | None
    rel_error: float | None
    phase: str
    wait_fraction: float | None = None
    step_seconds: float | None = None
    other_cpus: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


OUTLIER_Z = 3.0
MIN_PAIRS = 4


def error_floor(runs: Sequence[Trial]) -> float:
    """The least relative error of one timed iteration, pooled over every run of a search.

    A trial's own error comes from a handful of batch groups (a few degrees of freedom), so it is
    often several times too small; and it cannot see what slows a whole trial alike. Two figures,
    the larger wins, each scaled to one iteration (errors fall as 1/sqrt(iterations)): the median
    of the runs' own errors (pooled over every count, so no single lucky estimate passes), and
    the spread between repeated runs of a count that agree (pairs set aside as outliers excluded).
    """
    own = [r.rel_error * math.sqrt(r.iterations) for r in runs if r.rel_error]
    if not own:
        return 0.0
    floor = statistics.median(own)
    spread = []
    for same in _by_count(runs).values():
        for a, b in zip(same, same[1:]):
            d = math.log(a.seconds_per_iteration / b.seconds_per_iteration)
            scale = math.sqrt(1 / a.iterations + 1 / b.iterations)
            if abs(d) <= OUTLIER_Z * floor * scale:
                spread.append(abs(d) / scale)
    if len(spread) >= MIN_PAIRS:
        floor = max(floor, statistics.median(spread) / 0.6745)  # the median |z| of a normal is 0.6745 sigma
    return floor


def _error(run: Trial, floor: float) -> float | None:
    if run.rel_error is None:
        return None
    return max(run.rel_error, floor / math.sqrt(run.iterations))


def _mean(runs: Sequence[Trial], errs: Sequence[float | None]) -> tuple[float, float | None]:
    """Inverse-variance mean and its error when every error is known, else weighted by iterations."""
    if all(e is not None and e > 0 for e in errs):
        weights = [1.0 / (e * e) for e in errs if e is not None]
        rel_error: float | None = 1.0 / math.sqrt(sum(weights))
    else:
        weights = [float(r.iterations) for r in runs]
        rel_error = None
    return sum(w * r.seconds_per_iteration for w, r in zip(weights, runs)) / sum(weights), rel_error


def _combine(runs: Sequence[Trial], floor: float = 0.0) -> Trial:
    """Merge repeated runs of one count, setting aside runs slowed beyond their error.

    Each run's error is at least ``floor / sqrt(iterations)`` (:func:`error_floor`). Interference
    on a shared machine (another job, a page-cache flush) only ever slows a trial, so the slowest
    run is set aside while it is more than ``OUTLIER_Z`` standard errors slower than the mean of
    the others; the rest are combined by inverse variance. Costs (iterations, wall time) count
    every run.
    """
    errs = [_error(r, floor) for r in runs]
    kept = sorted(range(len(runs)), key=lambda i: runs[i].seconds_per_iteration)
    while len(kept) > 1 and errs[kept[-1]] is not None:
        rest = kept[:-1]
        m, e = _mean([runs[i] for i in rest], [errs[i] for i in rest])
        slow = errs[kept[-1]]
        if e is None or slow is None or runs[kept[-1]].seconds_per_iteration - m <= OUTLIER_Z * m * math.hypot(slow, e):
            break
        kept = rest
    kept.sort()
    spi, rel_error = _mean([runs[i] for i in kept], [errs[i] for i in kept])
    mems = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    usss = [r.peak_uss_bytes for r in runs if r.peak_uss_bytes is not None]
    others = [r.other_cpus for r in runs if r.other_cpus is not None]
    first = runs[0]
    wait, step = _combined_wait([runs[i] for i in kept], spi)
    return replace(
        first,
        wait_fraction=wait,
        step_seconds=step,
        iterations=sum(r.iterations for r in runs),
        warmup=sum(r.warmup for r in runs),
        seconds_per_iteration=spi,
        samples_per_second=first.samples_per_second * first.seconds_per_iteration / spi,
        wall_seconds=sum(r.wall_seconds for r in runs),
        peak_memory_bytes=max(mems) if mems else None,
        peak_uss_bytes=max(usss) if usss else None,
        other_cpus=max(others) if others else None,
        rel_error=rel_error,
        phase="+".join(dict.fromkeys(r.phase for r in runs)),
    )


def _combined_wait(runs: Sequence[Trial], spi: float) -> tuple[float | None, float | None]:
    """The wait fraction and step time of runs combined into ``spi`` seconds per iteration.

    The step's time is the runs' iteration-weighted mean; the wait is what the combined loop time
    leaves of it (``1 - step / spi``), so that the fraction agrees with the loop time the searches
    compare. Runs that report a wait without the step's time are averaged as they are.
    """
    if len(runs) == 1 or any(r.wait_fraction is None for r in runs):
        return runs[0].wait_fraction if len(runs) == 1 else None, runs[0].step_seconds if len(runs) == 1 else None
    total = sum(r.iterations for r in runs)
    if any(r.step_seconds is None for r in runs):
        return sum(r.iterations * (r.wait_fraction or 0.0) for r in runs) / total, None
    step = sum(r.iterations * (r.step_seconds or 0.0) for r in runs) / total
    return min(1.0, max(0.0, 1.0 - step / spi)), step


def _by_count(runs: Sequence[Trial]) -> dict[int, list[Trial]]:
    by: dict[int, list[Trial]] = {}
    for r in runs:
        by.setdefault(r.workers, []).append(r)
    return dict(sorted(by.items()))


def combine_runs(runs: Sequence[Trial]) -> dict[int, Trial]:
    """Each count's runs combined (:func:`_combine`) under the floor that all ``runs`` give."""
    floor = error_floor(runs)
    return {w: _combine(same, floor) for w, same in _by_count(runs).items()}
