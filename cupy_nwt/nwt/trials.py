"""Trials: what one measurement of a worker count reports, and how repeated runs of a count combine.

A trial is ``measure(workers, iterations, warmup)``: the loader by default
(:class:`~cupy_nwt.nwt.measure.LoaderMeasure`), any callable in tests (deterministic cost curves) or
for other loaders. It returns a :class:`Measurement` or just seconds per iteration. A search's cost
is the sum of its trials' ``wall_seconds``, so the fast search's bound is checked without spending
real time. Nothing here builds a loader: both searches run on this module alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import ArgumentError
from ..reporting.progress import ProgressBar
from ..reporting.units import plural


@dataclass(frozen=True)
class Measurement:
    """One trial as a measure callable reports it.

    ``wall_seconds`` is everything the trial cost (building the loader, start-up, warm-up, the
    timed batches, shutting down); ``rel_error`` estimates the relative standard error of
    ``seconds_per_iteration`` (None: unknown, trusted as exact). ``warmup_batches``: the untimed
    batches the trial took, when the measure takes more than it was asked for (the loader's
    takes the workers' start-up prefetch too); the fast search needs it to tell start-up cost
    from warm-up batches when it predicts what the exhaustive search would cost.

    With the user's step in the loop (``tune_num_workers(step=...)``) ``seconds_per_iteration`` is
    the consumer's whole loop per batch (its wait in ``next()`` plus the step), ``wait_fraction``
    the share of that loop spent waiting (the GPU's idle share when the step runs on a GPU) and
    ``step_seconds`` the step's mean time; None without a step.
    """

    seconds_per_iteration: float
    wall_seconds: float
    peak_memory_bytes: int | None = None
    peak_uss_bytes: int | None = None
    rel_error: float | None = None
    warmup_batches: int | None = None
    wait_fraction: float | None = None
    step_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MeasureFn = Callable[[int, int, int], "Measurement | float"]
# Builds a measure for one workload, called like LoaderMeasure: (dataset, batch_size=, prefetch_factor=,
# pin_memory=, device=, batch_transform=). num_workers="auto" takes one so that it need not know the loader.
MeasureFactory = Callable[..., MeasureFn]


@dataclass(frozen=True)
class Trial:
    """A worker count's measurement: one run, or (in ``TuneResult.trials``) its runs combined.

    ``wait_fraction`` and ``step_seconds``: the consumer's wait and the step's time with the user's
    step in the loop (:class:`Measurement`), else None.
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def whole_rounds(iterations: int, workers: int) -> int:
    """``iterations`` rounded up to whole rounds of ``workers`` batches (at least two rounds).

    Each of w workers makes one batch of every w in turn, and workers that share the CPUs progress
    together, so batches arrive in waves of w. A timed window that is not a whole number of waves covers one
    wave more or less depending on where it starts: 10 batches from 7 workers time one wave or
    two. A window of whole waves covers the same work wherever it starts.
    """
    if workers < 2:
        return iterations
    return max(2 * workers, -(-iterations // workers) * workers)


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


def _fraction(value: float | None) -> float | None:
    """A measure's wait fraction, checked: a number in [0, 1] (None: no step in the loop)."""
    if value is None:
        return None
    f = float(value)
    if not 0.0 <= f <= 1.0:
        raise ArgumentError(f"a measure gave wait_fraction {value!r}; need a fraction in [0, 1]")
    return f


class _Runner:
    """Calls the measure, records each run, keeps per-count estimates, drives the progress bar."""

    def __init__(self, measure: MeasureFn, batch_size: int, bar: ProgressBar, cpus: int | None = None) -> None:
        self.measure = measure
        self.batch_size = batch_size
        self.bar = bar
        self.cpus = cpus
        self._noted = False
        self.runs: list[Trial] = []
        self._by: dict[int, list[Trial]] = {}
        self._measured: dict[int, Trial] | None = None

    def run(self, workers: int, iterations: int, warmup: int, phase: str) -> Trial:
        if self.cpus is not None and workers > self.cpus and not self._noted:
            self._noted = True  # once per search, one line: the loader's own warning is silenced in trials
            self.bar.note(f"{self.bar.desc}: measuring counts above the {plural(self.cpus, 'usable CPU')} too "
                          "(workers share the CPUs; the best count need not follow the core count)")
        m = self.measure(workers, iterations, warmup)
        if not isinstance(m, Measurement):
            spi = float(m)
            m = Measurement(spi, spi * (iterations + warmup))
        spi = float(m.seconds_per_iteration)
        if not (spi > 0 and math.isfinite(spi)):
            raise ArgumentError(f"measure({workers}, {iterations}, {warmup}) gave {spi!r} s/iteration; need > 0")
        if m.warmup_batches is not None:
            warmup = int(m.warmup_batches)
        t = Trial(workers, iterations, warmup, spi, self.batch_size / spi, float(m.wall_seconds),
                  m.peak_memory_bytes, m.peak_uss_bytes, m.rel_error, phase, _fraction(m.wait_fraction),
                  None if m.step_seconds is None else float(m.step_seconds))
        self.runs.append(t)
        self._by.setdefault(workers, []).append(t)
        self._measured = None
        waits = "" if t.wait_fraction is None else f", consumer waits {t.wait_fraction:.1%}"
        self.bar.step(f"{plural(workers, 'worker')}: {t.samples_per_second:,.0f} samples/s{waits}")
        return t

    def estimate(self, workers: int) -> Trial | None:
        return self.measured().get(workers)

    def runs_of(self, workers: int) -> list[Trial]:
        return self._by.get(workers, [])

    def spent(self) -> float:
        return sum(r.wall_seconds for r in self.runs)

    def measured(self) -> dict[int, Trial]:
        """Every count's runs combined (:func:`combine_runs`); computed once per new run."""
        if self._measured is None:
            self._measured = combine_runs(self.runs)
        return dict(self._measured)
