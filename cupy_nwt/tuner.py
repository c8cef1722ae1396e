"""Num Worker Tuner (NWT): pick the loader's worker count by measuring it.

Two strategies over the same measurements:

``strategy="paper"`` is Algorithm 1 of Synn & Kim, "Num Worker Tuner": for i = 0 .. N-1 run
``iterations`` loader iterations with i workers, normalise, and accept i only when
``normalized < best - alpha``. The paper leaves several things open; what we chose, and why:

* N. "N <- number of CPU cores" and ``while i != N``: counts 0..N-1 are tried (N workers plus the
  main process would oversubscribe N cores). The paper's machine had 64 hardware threads and
  Table 2 stops at 63, so "cores" meant logical CPUs there. We default to
  ``system.usable_cpus()`` (affinity mask and cgroup quota), not ``os.cpu_count()``: in a container
  or under ``taskset`` the latter reports CPUs the process may not run on. ``max_workers`` is N.
* j is never reset. Initialised once (``i, j, result <- 0``), the inner loop would run only for
  i = 0; every later i would get ``cumm = 0`` and the pseudo-code would always return 1. We reset
  j (and cumm) per i, as the text ("for each i, iterate and normalise") clearly intends.
* What is timed. "MemCpyTime (host to device)" cannot be the copy alone: a CIFAR batch copies in
  well under a millisecond at any worker count, yet Table 2 moves 10x with workers. We time what
  the training loop waits for: getting batch j from the loader and its H2D copy finishing (with no
  GPU: the batch delivered to the caller).
* Loader start-up. The pseudo-code has no warm-up, so in "paper" the clock starts before the
  loader is built: worker start-up and the first batches' latency count, as they do for a training
  loop that iterates a fresh loader. (This is much of why 63 workers look slow in Table 2.)
* Units. The paper calls 14.25 s "normalized" and says it is per data transfer, yet 14.25 s per
  batch of 128 CIFAR images is 9 images/s; the values read as seconds per 100 iterations (the
  accumulated ``cumm`` at the default iter = 100), and alpha = 0.5 s only separates anything at
  that scale (per batch it would swallow every real difference and NWT would keep i = 0).
  So the paper strategy compares seconds per ``PAPER_TIME_SCALE`` = 100 iterations with alpha, whatever
  ``iterations`` is; trials report seconds per single iteration.
* The greedy rule. ``best`` moves only when a count beats the last accepted one by more than
  alpha, so the pick is the last count so accepted, not "the fewest workers within alpha of the
  fastest": which count that is depends on the whole curve, see tests/test_tuner.py.
* "Memory usage of the entire system". The paper used tracemalloc, which sees only Python
  allocations of the main process. We record, per trial, the peak of the summed PSS (and USS) of the
  main process and every live worker (``memory.py``): the loader's whole footprint. Memory does
  not enter Algorithm 1's decision; it is reported, as in the paper's Fig. 3.

``strategy="fast"`` (the default of ``DataLoader(num_workers="auto")`` and ``cupy-nwt tune``) aims
at a count whose throughput is within 5% of the exhaustive best, for at most 30% of the paper
search's cost, with the least memory among counts that fast:

1. Each trial first takes ``workers + 1`` untimed batches (start-up and the first round of every
   worker, which arrive as one burst), then times ``iterations / 10`` batches in the coarse pass
   and ``iterations / 5`` later; repeated runs of a count are combined (inverse-variance).
2. Coarse: 0, 2, 4, 8, ... and N-1 (1 is left to step 4), stopping early once throughput falls
   by more than ``tolerance`` from the best, or two steps in a row bring no gain beyond it.
3. Local: halve the wider gap beside the fastest measured count until both its neighbours are
   measured (one valley assumed), since the true minimum may hide between coarse points.
4. Bisect for the fewest workers within ``tolerance`` (relative, plus half the best's error) of
   the best measured time, between the largest measured count that is slower and the smallest
   that is within; then re-measure the counts that decide this (while their error is above
   ``tolerance / 2`` and the budget allows) and repeat 3-4 if the picture changed.
   Every trial after the coarse pass must fit a budget: 25% of the paper search's cost as
   estimated from the trials so far (throughput and start-up interpolated between counts).
5. Pick, among measured counts within tolerance, the one with the least peak memory (the fewest
   workers when memory was not measured).

A trial is ``measure(workers, iterations, warmup)``: the loader by default, any callable in tests
(deterministic cost curves) or for other loaders. It returns a :class:`Measurement` or just seconds
per iteration. The search's cost is the sum of the trials' ``wall_seconds``, so the fast bound is
checked without spending real time.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from . import cuda, system
from .distributed import RankLayout, agree, device_for_rank, rank_layout, worker_budget
from .fingerprint import (
    Fingerprint, ResultStore, machine_fingerprint, read_json, resolve_device, work_fingerprint,
    write_json_atomic,
)
from .memory import DEFAULT_INTERVAL_S, MemorySampler
from .progress import Progress
from .units import plural

PAPER_TIME_SCALE = 100
DEFAULT_TOLERANCE = 0.02
FAST_FRACTION = 0.2
MIN_FAST_ITERATIONS = 8
FAST_BUDGET = 0.25
STEADY_FRACTION = 0.5
STRATEGIES = ("paper", "fast")
RESULT_FORMAT = "cupy_nwt.tune_result/1"

_log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class TuneResult:
    """The pick, every run in order (``runs``) and one combined trial per count (``trials``)."""

    best_workers: int
    strategy: str
    runs: tuple[Trial, ...]
    max_workers: int
    iterations: int
    alpha: float
    tolerance: float
    batch_size: int
    prefetch_factor: int
    pin_memory: bool | str
    device: str
    fingerprint: Fingerprint | None = None
    created: str = ""

    @property
    def trials(self) -> tuple[Trial, ...]:
        by: dict[int, list[Trial]] = {}
        for r in self.runs:
            by.setdefault(r.workers, []).append(r)
        return tuple(_combine(by[w]) for w in sorted(by))

    @property
    def best_trial(self) -> Trial | None:
        return next((t for t in self.trials if t.workers == self.best_workers), None)

    @property
    def search_seconds(self) -> float:
        """What the search cost: the sum of its runs' wall time."""
        return sum(r.wall_seconds for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in (
            "best_workers", "strategy", "max_workers", "iterations", "alpha", "tolerance", "batch_size",
            "prefetch_factor", "pin_memory", "device", "created")}
        d["format"] = RESULT_FORMAT
        d["search_seconds"] = self.search_seconds
        d["fingerprint"] = self.fingerprint.to_dict() if self.fingerprint else None
        d["trials"] = [t.to_dict() for t in self.trials]
        d["runs"] = [r.to_dict() for r in self.runs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuneResult":
        if not isinstance(d, dict) or d.get("format") != RESULT_FORMAT:
            raise ValueError(f"not a {RESULT_FORMAT} document")
        try:
            return cls(
                best_workers=int(d["best_workers"]),
                strategy=str(d["strategy"]),
                runs=tuple(Trial(**r) for r in d["runs"]),
                max_workers=int(d["max_workers"]),
                iterations=int(d["iterations"]),
                alpha=float(d["alpha"]),
                tolerance=float(d["tolerance"]),
                batch_size=int(d["batch_size"]),
                prefetch_factor=int(d["prefetch_factor"]),
                pin_memory=d["pin_memory"] if isinstance(d["pin_memory"], str) else bool(d["pin_memory"]),
                device=str(d["device"]),
                fingerprint=Fingerprint.from_dict(d["fingerprint"]) if d.get("fingerprint") else None,
                created=str(d.get("created", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tune result: {exc!r}") from None

    def save(self, path: str | Path | None = None, cache_dir: str | Path | None = None) -> Path:
        """Write to ``path``; without one, into the machine-wide store under this result's fingerprint."""
        if path is not None:
            return write_json_atomic(path, self.to_dict())
        if self.fingerprint is None:
            raise ValueError("this result has no fingerprint (tuned without a dataset): give save() a path")
        return ResultStore(cache_dir).put(self.fingerprint.key, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "TuneResult":
        return cls.from_dict(read_json(path))


def lookup(fp: Fingerprint, cache_dir: str | Path | None = None, similar: bool = True) -> TuneResult | None:
    """The saved result for this machine and work (or similar work), if any."""
    rec = ResultStore(cache_dir).find(fp, similar=similar)
    return TuneResult.from_dict(rec) if rec is not None else None


# ---------------------------------------------------------------- running trials


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


def _paper(runner: _Runner, n: int, iterations: int, alpha: float) -> int:
    """Algorithm 1, with j reset per i and times on the seconds-per-100-iterations scale."""
    best, result = math.inf, 0
    for i in range(n):
        normalized = runner.run(i, iterations, 0, "scan").seconds_per_iteration * PAPER_TIME_SCALE
        if normalized < best - alpha:
            best, result = normalized, i
    return result


def _ladder(n: int) -> list[int]:
    """0, 2, 4, 8, ... below n, and n - 1 (1 is left to the bisection: it is rarely the answer)."""
    out, w = [0], 2
    while w < n:
        out.append(w)
        w *= 2
    if n - 1 not in out:
        out.append(n - 1)
    return out


class _OverBudget(Exception):
    """The next optional trial would take the fast search past its share of the exhaustive cost."""


class _Fast:
    """The coarse-to-fine search of the module docstring, on a shared :class:`_Runner`."""

    def __init__(self, runner: _Runner, n: int, iterations: int, tolerance: float, budget: float) -> None:
        self.r = runner
        self.n = n
        self.max_iterations = iterations
        self.k_coarse = min(iterations, max(MIN_FAST_ITERATIONS, round(iterations * FAST_FRACTION / 2)))
        self.k_fine = min(iterations, max(MIN_FAST_ITERATIONS, round(iterations * FAST_FRACTION)))
        self.tol = tolerance
        self.budget = budget

    def search(self) -> int:
        if self.n == 1:
            return 0
        self.coarse()
        try:
            for _ in range(self.n):  # each round either measures something new or ends
                self.local()
                self.bisect()
                if not self.steady():
                    break
        except _OverBudget:
            pass
        return self.pick()

    # -- measuring

    def t(self, w: int, phase: str) -> float:
        """Seconds per iteration of ``w`` workers, measured once when first asked for."""
        est = self.r.estimate(w)
        if est is None:
            if phase == "coarse":
                est = self.r.run(w, self.k_coarse, w + 1, phase)
            else:
                est = self.run_within_budget(w, self.k_fine, phase)
        return est.seconds_per_iteration

    def run_within_budget(self, w: int, iterations: int, phase: str) -> Trial:
        spi, overhead = self.predict(w)
        expected = overhead + (w + 1 + iterations) * spi
        if self.r.spent() + expected > self.budget * self.exhaustive_cost():
            raise _OverBudget
        self.r.run(w, iterations, w + 1, phase)
        return self.r.estimate(w)

    def predict(self, w: int) -> tuple[float, float]:
        """Seconds per iteration and per-trial overhead (start-up, shutdown) of ``w`` workers,
        interpolated between measured counts (throughput, not time, is interpolated: it grows about
        linearly with workers until the loader saturates, where time per iteration goes as 1/w)."""
        m = self.r.measured()
        ws = sorted(m)
        rates = [1.0 / m[k].seconds_per_iteration for k in ws]
        overheads = []
        for k in ws:
            runs = self.r.runs_of(k)
            overheads.append(sum(max(0.0, r.wall_seconds - (r.warmup + r.iterations) * r.seconds_per_iteration)
                                 for r in runs) / len(runs))
        return 1.0 / float(np.interp(w, ws, rates)), float(np.interp(w, ws, overheads))

    def exhaustive_cost(self) -> float:
        """What the paper's search over 0..N-1 at ``iterations`` each would cost, as far as we can tell."""
        total = 0.0
        for w in range(self.n):
            spi, overhead = self.predict(w)
            total += overhead + self.max_iterations * spi
        return total

    # -- the steps

    def best(self) -> tuple[int, float]:
        m = self.r.measured()
        w = min(m, key=lambda k: (m[k].seconds_per_iteration, k))
        return w, m[w].seconds_per_iteration

    def within(self) -> tuple[float, int, int | None]:
        """The time limit, the fewest workers within it, and the largest measured count below that.

        The limit is the best time x (1 + tol + half its relative error, at most tol): the minimum
        of several noisy times is biased low, and without the correction a count that is truly as
        fast would be rejected (more workers, more memory) whenever it drew the unlucky side of the
        noise; the cap keeps a very noisy best from admitting clearly slower counts.
        """
        b, tb = self.best()
        m = self.r.measured()
        limit = tb * (1 + self.tol + min(self.tol, 0.5 * (m[b].rel_error or 0.0)))
        g = min(w for w, t in m.items() if t.seconds_per_iteration <= limit)
        return limit, g, max((w for w in m if w < g), default=None)

    def coarse(self) -> None:
        best = math.inf
        stale = 0
        for w in _ladder(self.n):
            tw = self.t(w, "coarse")
            if tw < best * (1 - self.tol):
                stale = 0
            else:
                stale += 1
                if tw > best * (1 + self.tol) or stale >= 2:
                    return
            best = min(best, tw)

    def local(self) -> None:
        """Shrink the bracket around the fastest count until its neighbours are measured.

        Assumes one valley (falling then rising), so the minimum may hide in either gap beside the
        best measured count; each probe halves the wider gap.
        """
        while True:
            b, _ = self.best()
            seen = sorted(self.r.measured())
            lo = max((w for w in seen if w < b), default=None)
            hi = min((w for w in seen if w > b), default=None)
            gaps = [(b - lo, (lo + b) // 2)] if lo is not None and b - lo > 1 else []
            if hi is not None and hi - b > 1:
                gaps.append((hi - b, (b + hi) // 2))
            if not gaps:
                return
            self.t(max(gaps)[1], "local")

    def bisect(self) -> None:
        """Narrow the gap between the fewest workers within the limit and the next count below."""
        while True:
            _, g, lo = self.within()
            if lo is None or g - lo <= 1:
                return
            self.t((lo + g) // 2, "bisect")

    def steady(self) -> bool:
        """Re-measure the counts the pick hinges on while their error is above ``STEADY_FRACTION`` x tolerance.

        Those are the slower count just below the pick candidate (first: re-measuring it is what
        can save workers), the candidate, and the fastest count; each only if it fits the budget.
        Returns whether anything was re-measured (the search then runs local and bisect again).
        """
        b, _ = self.best()
        _, g, lo = self.within()
        again = False
        for w in dict.fromkeys(x for x in (lo, g, b) if x is not None):
            est = self.r.estimate(w)
            if est.rel_error is None or est.rel_error <= STEADY_FRACTION * self.tol:
                continue
            more = max(self.k_fine, est.iterations)
            if est.iterations + more > self.max_iterations:
                continue
            try:
                self.run_within_budget(w, more, "steady")
            except _OverBudget:
                continue
            again = True
        return again

    def pick(self) -> int:
        limit, g, _ = self.within()
        within = [t for t in self.r.measured().values() if t.seconds_per_iteration <= limit]
        if all(t.peak_memory_bytes is not None for t in within):
            return min(within, key=lambda t: (t.peak_memory_bytes, t.workers)).workers
        return g


class LoaderMeasure:
    """A trial on the real loader, as ``measure(workers, iterations, warmup)``.

    Builds a :class:`~cupy_nwt.loader.DataLoader` with that many workers (shuffled, seeded,
    ``drop_last`` so every batch is full, persistent workers so a short dataset wraps into the
    next epoch without a restart), takes ``warmup + iterations`` batches and closes it. On the GPU
    each batch counts as arrived once the consumer's stream has its H2D copy (we synchronise it).
    Memory is sampled over the main process and the live workers for the whole trial.

    With ``warmup == 0`` (the paper) the clock starts before the loader is built, so start-up
    counts; otherwise it runs from the last warm-up batch to the last timed one.

    Before the first trial, one untimed batch is made in this process (``preflight``): it compiles
    Numba transforms and pages in a memory-mapped dataset, one-off costs that would otherwise land
    on whichever trial runs first. It counts in neither strategy's cost.
    """

    def __init__(self, dataset: Any, *, batch_size: int = 128, prefetch_factor: int = 2,
                 pin_memory: bool | str = False, device: str = "auto", batch_transform: Any = None,
                 seed: int = 0, start_method: str | None = None,
                 memory_interval: float = DEFAULT_INTERVAL_S) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.device = resolve_device(device)
        self.loader_device = _trial_device(device, self.device)
        self.batch_transform = batch_transform
        self.seed = seed
        self.start_method = start_method
        self.memory_interval = memory_interval
        self._ready = False
        if len(dataset) < batch_size:
            raise ValueError(f"the dataset has {len(dataset)} samples, fewer than one batch of {batch_size}")

    def _loader(self, workers: int) -> Any:
        from .loader import DataLoader  # noqa: PLC0415 - the loader imports this module lazily too

        # rank 0 of 1 explicitly: under a launcher a trial measures one loader, not a shard of the data
        return DataLoader(
            self.dataset, batch_size=self.batch_size, shuffle=True, seed=self.seed, drop_last=True,
            num_workers=workers, prefetch_factor=self.prefetch_factor, pin_memory=self.pin_memory,
            device=self.loader_device, batch_transform=self.batch_transform, persistent_workers=True,
            start_method=self.start_method, rank=0, world_size=1,
        )

    def preflight(self) -> None:
        with self._loader(0) as loader:
            next(iter(loader))
        self._ready = True

    def __call__(self, workers: int, iterations: int, warmup: int) -> Measurement:
        if not self._ready:
            self.preflight()
        stamps: list[float] = []
        t_begin = time.perf_counter()
        loader = self._loader(workers)
        sync = None
        if loader.device_id is not None:
            sync = cuda.stream_synchronizer(loader.device_id)
        try:
            with MemorySampler(loader.worker_pids, interval=self.memory_interval) as sampler:
                for _ in _endless(loader, warmup + iterations):
                    if sync is not None:
                        sync()
                    stamps.append(time.perf_counter())
        finally:
            loader.close()
        wall = time.perf_counter() - t_begin
        start = t_begin if warmup == 0 else stamps[warmup - 1]
        spi = (stamps[-1] - start) / iterations
        peak = sampler.peak
        return Measurement(spi, wall, peak.bytes if peak.samples else None, peak.uss_bytes,
                           _batch_means_error(stamps[max(warmup, 1) - 1:]))


def _trial_device(device: str, resolved: str) -> str:
    """The device trial loaders use: "cuda:N" as given, else this rank's GPU (trials run as rank 0 of 1)."""
    if resolved != "cuda" or device.startswith("cuda:"):
        return device if resolved == "cuda" else resolved
    cuda.require_gpu()
    return f"cuda:{device_for_rank(rank_layout(), cuda.device_count())}"


def steady_rates(measure: Measure, counts: Sequence[int], *, batch_size: int, iterations: int = 50,
                 repeats: int = 3) -> dict[int, float]:
    """Median samples/s of each worker count, start-up excluded, the counts interleaved per round.

    For judging picks after a search on equal footing: interleaving makes drift on a shared machine
    (another job, thermal throttling) hit every count alike instead of whichever ran last.
    """
    if repeats < 1 or iterations < 1:
        raise ValueError(f"repeats and iterations must be >= 1, got {repeats}, {iterations}")
    rates: dict[int, list[float]] = {int(w): [] for w in counts}
    for _ in range(repeats):
        for w in rates:
            m = measure(w, iterations, w + 1)
            spi = m.seconds_per_iteration if isinstance(m, Measurement) else float(m)
            rates[w].append(batch_size / spi)
    return {w: statistics.median(r) for w, r in rates.items()}


def _endless(loader: Any, count: int) -> Iterator[Any]:
    """``count`` batches, starting new epochs as needed."""
    while count > 0:
        for batch in loader:
            yield batch
            count -= 1
            if count == 0:
                return


def _batch_means_error(stamps: Sequence[float], groups: int = 4) -> float | None:
    """Relative standard error of the mean interval, from the means of consecutive groups.

    Batches arrive in bursts (one per worker round), so single intervals are far from independent;
    the means of a few long consecutive groups are close to it, which is what makes this estimate
    honest for a pipelined loader.
    """
    intervals = [b - a for a, b in zip(stamps, stamps[1:])]
    size = len(intervals) // groups
    if size < 2:
        return None
    means = [sum(intervals[i * size:(i + 1) * size]) / size for i in range(groups)]
    mean = sum(means) / groups
    if mean <= 0:
        return None
    var = sum((m - mean) ** 2 for m in means) / (groups - 1)
    return math.sqrt(var / groups) / mean


# ---------------------------------------------------------------- the public entry points


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return value


def tune_num_workers(dataset: Any = None, batch_size: int = 128, max_workers: int | None = None,
                     iterations: int = 100, alpha: float = 0.5, strategy: str = "paper", device: str = "auto",
                     pin_memory: bool | str = False, prefetch_factor: int = 2, measure: Measure | None = None,
                     progress: bool = True, *, tolerance: float = DEFAULT_TOLERANCE,
                     batch_transform: Any = None) -> TuneResult:
    """Search worker counts 0 .. max_workers-1 for the loader of ``dataset`` (see the module doc).

    ``alpha`` is the paper's threshold in seconds per 100 iterations (strategy "paper");
    ``tolerance`` is the fast strategy's relative one. ``measure(workers, iterations, warmup)``
    replaces the real loader trial. ``pin_memory`` defaults to the DataLoader's own default
    (False): it is part of the saved result's key, so tune with the loader's settings for
    ``num_workers="auto"`` to find the pick.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    _check_int("batch_size", batch_size, 1)
    _check_int("iterations", iterations, 1)
    _check_int("prefetch_factor", prefetch_factor, 1)
    n = system.usable_cpus() if max_workers is None else _check_int("max_workers", max_workers, 1)
    if not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise ValueError(f"alpha must be a number >= 0 (seconds per 100 iterations), got {alpha!r}")
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < 0.5):
        raise ValueError(f"tolerance must be a fraction in [0, 0.5), got {tolerance!r}")
    if strategy == "fast" and iterations < MIN_FAST_ITERATIONS:
        raise ValueError(f"the fast strategy needs iterations >= {MIN_FAST_ITERATIONS}, got {iterations}")
    resolved = resolve_device(device)
    fp = None
    if dataset is not None:
        fp = Fingerprint(machine_fingerprint(), work_fingerprint(
            dataset, batch_size=batch_size, batch_transform=batch_transform, prefetch_factor=prefetch_factor,
            pin_memory=pin_memory, device=resolved))
    if measure is None:
        if dataset is None:
            raise ValueError("give a dataset to tune the loader on, or a measure callable")
        measure = LoaderMeasure(dataset, batch_size=batch_size, prefetch_factor=prefetch_factor,
                                pin_memory=pin_memory, device=device, batch_transform=batch_transform)

    with Progress(n if strategy == "paper" else None, f"NWT ({strategy})", unit="trial", enabled=progress) as bar:
        runner = _Runner(measure, batch_size, bar)
        if strategy == "paper":
            best = _paper(runner, n, iterations, float(alpha))
        else:
            best = _Fast(runner, n, iterations, float(tolerance), FAST_BUDGET).search()
    return TuneResult(
        best_workers=best, strategy=strategy, runs=tuple(runner.runs), max_workers=n, iterations=iterations,
        alpha=float(alpha), tolerance=float(tolerance), batch_size=batch_size, prefetch_factor=prefetch_factor,
        pin_memory=pin_memory if isinstance(pin_memory, str) else bool(pin_memory), device=resolved, fingerprint=fp,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


TUNE_LOCK_SUFFIX = ".tune.lock"


def auto_num_workers(dataset: Any, *, batch_size: int, prefetch_factor: int = 2, pin_memory: bool | str = False,
                     device: str = "auto", batch_transform: Any = None,
                     cache_dir: str | Path | None = None, layout: RankLayout | None = None) -> int:
    """``DataLoader(num_workers="auto")``: a saved pick for this machine and work, else tune (fast) once and save.

    Several ranks (``layout``; by default the launcher's variables): a rank may use its share of the
    node's CPUs (``distributed.worker_budget``: counts 0 .. budget-1 are searched) and the
    fingerprint records how many ranks share the node. Tuning happens only under a machine-wide
    lock beside the store, and whoever holds it looks in the store again before tuning, so when all
    ranks of a node start at once exactly one tunes while the others wait and then reuse its result
    (the lock also keeps unrelated tunings on one machine from measuring each other). The tuning
    rank measures while the others wait, so its trials see less contention than training will.
    Where the program has a communicator (``torch.distributed`` initialised, or mpi4py under an MPI
    launcher), every rank then takes rank 0's pick, so all nodes use one count. Every rank must call
    this at the same point, as the DataLoader constructor does.
    """
    layout = rank_layout() if layout is None else layout
    resolved = resolve_device(device)
    fp = Fingerprint(machine_fingerprint(), work_fingerprint(
        dataset, batch_size=batch_size, batch_transform=batch_transform, prefetch_factor=prefetch_factor,
        pin_memory=pin_memory, device=resolved, local_world_size=layout.local_world_size))
    saved = lookup(fp, cache_dir)
    if saved is not None:
        _log_saved(saved, fp)
        pick = saved.best_workers
    else:
        _log.info("num_workers='auto': no saved pick for this machine and work (%s): searching (fast strategy)",
                  ResultStore(cache_dir).why_missing(fp))
        pick = _tune_once(fp, dataset, cache_dir, batch_size=batch_size, device=device, pin_memory=pin_memory,
                          prefetch_factor=prefetch_factor, batch_transform=batch_transform,
                          max_workers=worker_budget(layout))
    agreed, via = agree(pick, layout)
    if via is not None and agreed != pick:
        _log.info("num_workers='auto': this rank's saved pick is %d, rank 0's (via %s) is %d; using rank 0's",
                  pick, via, agreed)
    return int(agreed)


def _tune_once(fp: Fingerprint, dataset: Any, cache_dir: str | Path | None, **kw: Any) -> int:
    """Tune under the machine-wide lock unless someone saved a pick while we waited for it."""
    store_path = ResultStore(cache_dir).path
    store_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(store_path) + TUNE_LOCK_SUFFIX)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _log.info("num_workers='auto': another process is tuning on this machine; waiting for its result")
        lock.acquire()  # flock: released by the OS too if the tuning process dies, so no stale lock
    try:
        saved = lookup(fp, cache_dir)
        if saved is not None:
            _log_saved(saved, fp)
            return saved.best_workers
        result = tune_num_workers(dataset, strategy="fast", progress=False, **kw)
        replace(result, fingerprint=fp).save(cache_dir=cache_dir)
        return result.best_workers
    finally:
        lock.release()


def _log_saved(saved: TuneResult, fp: Fingerprint) -> None:
    key = saved.fingerprint.key if saved.fingerprint is not None else "?"
    similar = ""
    if saved.fingerprint is not None and key != fp.key:
        similar = (f", similar work: {saved.fingerprint.work.sample_bytes} bytes per sample saved, "
                   f"{fp.work.sample_bytes} here")
    _log.info("num_workers='auto': using saved pick %d (key %s%s)", saved.best_workers, key, similar)


def summary_text(result: TuneResult, saved_to: Path | None = None) -> str:
    """The trials as a table, the pick, and what the search cost."""
    from .report import table  # noqa: PLC0415
    from .units import fmt_bytes  # noqa: PLC0415

    trials = result.trials
    fastest = min(trials, key=lambda t: (t.seconds_per_iteration, t.workers)).workers if trials else None
    rows = []
    for t in trials:
        notes = [n for n, hit in (("pick", t.workers == result.best_workers), ("fastest", t.workers == fastest)) if hit]
        rows.append([t.workers, t.seconds_per_iteration * 1e3, round(t.samples_per_second),
                     fmt_bytes(t.peak_memory_bytes) if t.peak_memory_bytes is not None else None,
                     fmt_bytes(t.peak_uss_bytes) if t.peak_uss_bytes is not None else None,
                     t.iterations, ", ".join(notes)])
    title = (f"NWT ({result.strategy}): {plural(len(trials), 'worker count')} measured in "
             f"{plural(len(result.runs), 'run')}, "
             f"device {result.device}, batch {result.batch_size}")
    lines = [table(["workers", "ms/iter", "samples/s", "peak PSS", "peak USS", "timed iters", "note"], rows, title=title)]
    rule = (f"alpha {result.alpha:g} s per {PAPER_TIME_SCALE} iterations" if result.strategy == "paper"
            else f"tolerance {result.tolerance:.0%}")
    lines.append("")
    lines.append(f"pick: {plural(result.best_workers, 'worker')} ({rule}); search took {result.search_seconds:.1f} s")
    if saved_to is not None:
        lines.append(f"saved to {saved_to}")
    return "\n".join(lines)
