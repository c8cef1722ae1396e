"""Trials: what one measurement of a worker count reports, and how repeated runs of a count combine.

A trial is ``measure(workers, iterations, warmup)``: the loader by default
(:class:`~cupy_nwt.nwt.measure.LoaderMeasure`), any callable in tests (deterministic cost curves) or
for other loaders. It returns a :class:`Measurement` or just seconds per iteration. A search's cost
is the sum of its trials' ``wall_seconds``, so the fast search's bound is checked without spending
real time. Nothing here builds a loader: both searches run on this module alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from .._reporting.progress import Progress
from .._reporting.units import plural


@dataclass(frozen=True)
class Measurement:
    """One trial as a measure callable reports it.

    ``wall_seconds`` is everything the trial cost (building the loader, start-up, warm-up, the
    timed batches, shutting down); ``rel_error`` estimates the relative standard error of
    ``seconds_per_iteration`` (None: unknown, trusted as exact).
    """

    seconds_per_iteration: float
    wall_seconds: float
    peak_memory_bytes: int | None = None
    peak_uss_bytes: int | None = None
    rel_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Measure = Callable[[int, int, int], "Measurement | float"]
# Builds a measure for one workload, called like LoaderMeasure: (dataset, batch_size=, prefetch_factor=,
# pin_memory=, device=, batch_transform=). num_workers="auto" takes one so that it need not know the loader.
MeasureFactory = Callable[..., Measure]


@dataclass(frozen=True)
class Trial:
    """A worker count's measurement: one run, or (in ``TuneResult.trials``) its runs combined."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _combine(runs: Sequence[Trial]) -> Trial:
    """Merge repeated runs of one count: inverse-variance weights when errors are known."""
    if len(runs) == 1:
        return runs[0]
    errs = [r.rel_error for r in runs]
    if all(e is not None and e > 0 for e in errs):
        weights = [1.0 / (e * e) for e in errs]
        rel_error = 1.0 / math.sqrt(sum(weights))
    else:
        weights = [float(r.iterations) for r in runs]
        rel_error = None
    spi = sum(w * r.seconds_per_iteration for w, r in zip(weights, runs)) / sum(weights)
    mems = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    usss = [r.peak_uss_bytes for r in runs if r.peak_uss_bytes is not None]
    first = runs[0]
    return replace(
        first,
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


class _Runner:
    """Calls the measure, records each run, keeps per-count estimates, drives the progress bar."""

    def __init__(self, measure: Measure, batch_size: int, bar: Progress) -> None:
        self.measure = measure
        self.batch_size = batch_size
        self.bar = bar
        self.runs: list[Trial] = []
        self._by: dict[int, list[Trial]] = {}

    def run(self, workers: int, iterations: int, warmup: int, phase: str) -> Trial:
        m = self.measure(workers, iterations, warmup)
        if not isinstance(m, Measurement):
            spi = float(m)
            m = Measurement(spi, spi * (iterations + warmup))
        spi = float(m.seconds_per_iteration)
        if not (spi > 0 and math.isfinite(spi)):
            raise ValueError(f"measure({workers}, {iterations}, {warmup}) gave {spi!r} s/iteration; need > 0")
        t = Trial(workers, iterations, warmup, spi, self.batch_size / spi, float(m.wall_seconds),
                  m.peak_memory_bytes, m.peak_uss_bytes, m.rel_error, phase)
        self.runs.append(t)
        self._by.setdefault(workers, []).append(t)
        self.bar.step(f"{plural(workers, 'worker')}: {t.samples_per_second:,.0f} samples/s")
        return t

    def estimate(self, workers: int) -> Trial | None:
        runs = self._by.get(workers)
        return _combine(runs) if runs else None

    def runs_of(self, workers: int) -> list[Trial]:
        return self._by.get(workers, [])

    def spent(self) -> float:
        return sum(r.wall_seconds for r in self.runs)

    def measured(self) -> dict[int, Trial]:
        return {w: _combine(r) for w, r in sorted(self._by.items())}
