"""Trials: what one measurement of a worker count reports, and the runner both searches share.

A trial is ``measure(workers, iterations, warmup)``: the loader by default
(:class:`~cupy_nwt.nwt.measure.LoaderMeasure`), any callable in tests (deterministic cost curves) or
for other loaders. It returns a :class:`Measurement` or just seconds per iteration. A search's cost
is the sum of its trials' ``wall_seconds``, so the fast search's bound is checked without spending
real time. Each run is recorded as a :class:`~cupy_nwt.picks.trials.Trial` (what a saved pick keeps).
Nothing here builds a loader: both searches run on this module alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import ArgumentError
from ..picks.trials import Trial, combine_runs
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
    ``step_seconds`` the step's mean time; None without a step. ``other_cpus``: how many of the
    usable CPUs other processes kept busy during the trial, on average (``contention.py``; None:
    not measured).
    """

    seconds_per_iteration: float
    wall_seconds: float
    peak_memory_bytes: int | None = None
    peak_uss_bytes: int | None = None
    rel_error: float | None = None
    warmup_batches: int | None = None
    wait_fraction: float | None = None
    step_seconds: float | None = None
    other_cpus: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MeasureFn = Callable[[int, int, int], "Measurement | float"]


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


def _other_cpus(value: float | None) -> float | None:
    """A measure's ``other_cpus``, checked: a finite number >= 0 (None: not measured)."""
    if value is None:
        return None
    f = float(value)
    if not (f >= 0 and math.isfinite(f)):
        raise ArgumentError(f"a measure gave other_cpus {value!r}; need a finite number of CPUs >= 0")
    return f


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
            try:
                spi = float(m)
            except (TypeError, ValueError):
                raise ArgumentError(f"measure({workers}, {iterations}, {warmup}) gave {m!r}; need a Measurement or "
                                    "seconds per iteration") from None
            m = Measurement(spi, spi * (iterations + warmup))
        spi = float(m.seconds_per_iteration)
        if not (spi > 0 and math.isfinite(spi)):
            raise ArgumentError(f"measure({workers}, {iterations}, {warmup}) gave {spi!r} s/iteration; need > 0")
        if m.warmup_batches is not None:
            warmup = int(m.warmup_batches)
        t = Trial(workers, iterations, warmup, spi, self.batch_size / spi, float(m.wall_seconds),
                  m.peak_memory_bytes, m.peak_uss_bytes, m.rel_error, phase, _fraction(m.wait_fraction),
                  None if m.step_seconds is None else float(m.step_seconds), _other_cpus(m.other_cpus))
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
