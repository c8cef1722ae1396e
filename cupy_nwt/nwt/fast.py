"""The fast search (``strategy="fast"``): near the exhaustive best for a fraction of its cost.

``strategy="fast"`` (the default of ``cupy-nwt tune``; ``tune_num_workers`` defaults to ``"paper"``) aims
at a count whose throughput is within 5% of the exhaustive best, for at most 30% of the paper
search's cost, with the least memory among counts that fast:

1. Each trial first takes ``workers + 1`` untimed batches (start-up and the first round of every
   worker, which arrive as one burst; the loader's measure adds the other prefetch rounds made at
   start-up, see ``measure.LoaderMeasure``), then times ``iterations / 10`` batches in the coarse pass
   and ``iterations / 5`` later, rounded up to whole rounds of the workers (``trials.whole_rounds``:
   batches arrive in waves, one per worker). Repeated runs of a count are combined robustly
   (``picks.trials.combine_runs``):
   each run's error is at least a floor pooled over the whole search, and a run slowed beyond its
   error (interference on a shared machine only ever slows a trial) is set aside.
2. Coarse: 0, 2, 4, 8, ... and N-1 (1 is left to step 4), stopping early once throughput falls
   by more than ``tolerance`` from the best, or two steps in a row bring no gain beyond it; a step
   that would stop the pass is first confirmed by an independent run (one slowed trial must not
   end it: a single noisy trial would otherwise cut a falling curve short).
3. Local: halve the wider gap beside the fastest measured count until both its neighbours are
   measured (one valley assumed), since the true minimum may hide between coarse points.
4. Bisect for the fewest workers within ``tolerance`` (relative, plus half the best's error) of
   the best measured time, between the largest measured count that is slower and the smallest
   that is within. Then re-check: give an independent run to the counts the pick hinges on that
   rest on a single run (the count just below the candidate, the fastest count, its neighbours),
   since one slowed trial there moves the pick; then re-measure the counts that decide it while
   their error is above ``tolerance / 2``; repeat 3-4 while anything changed.
   Every trial after the first coarse steps must fit a budget: 25% of the paper search's cost as
   estimated from the trials so far (throughput and start-up interpolated between counts).
5. Pick, among measured counts within tolerance, the one with the least peak memory (the fewest
   workers when memory was not measured). With the user's step in the loop (trials that report the
   consumer's wait), the fewest workers within tolerance of the shortest loop (wait plus step): a
   count whose loop is as short frees its cores for the main process and its memory for training.

Where the range ends. Given ``max_workers``, counts 0..max_workers-1 and no
further. Without it (the default) the search is open: the best count need not follow the core count
(the paper's machine was fastest at 16 workers of 32 cores; on a 2-CPU machine 2 workers are), so
the coarse pass measures every ladder step up to the usable CPUs, with no early stop, and then,
while the highest count measured is the fastest and beats the ladder step below it by more than
``tolerance``, the range doubles (one coarse trial at the new top, then steps 3-4 again), up to a
cap and while the peak memory, extrapolated from the counts measured, stays within a limit.
``stop_reason`` says which of these ended it.
"""

from __future__ import annotations

import math

import numpy as np

from ..picks.trials import Trial
from .trials import _Runner, whole_rounds

DEFAULT_TOLERANCE = 0.02
FAST_FRACTION = 0.2
MIN_FAST_ITERATIONS = 8
FAST_BUDGET = 0.25
STEADY_FRACTION = 0.5
SLOWDOWN = 1.5
OPEN_CAP_MAX = 256


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


def open_cap(cpus: int) -> int:
    """The most workers an open search may reach: 4 per usable CPU, at least 8, at most ``OPEN_CAP_MAX``."""
    return min(OPEN_CAP_MAX, max(8, 4 * cpus))


class _FastSearch:
    """The coarse-to-fine search of the module docstring, on a shared :class:`_Runner`.

    ``cap`` (an open search) lets the range grow past counts 0..n-1 up to ``cap`` workers while the
    curve still rises; ``memory_limit`` (bytes of peak PSS) bounds that growth.
    """

    def __init__(self, runner: _Runner, n: int, iterations: int, tolerance: float, budget: float, *,
                 cap: int | None = None, memory_limit: int | None = None) -> None:
        self.r = runner
        self.n = n
        self.cap = cap
        self.memory_limit = memory_limit
        self.stop_reason = f"counts 0..{n - 1} asked for"
        self.max_iterations = iterations
        self.k_coarse = min(iterations, max(MIN_FAST_ITERATIONS, round(iterations * FAST_FRACTION / 2)))
        self.k_fine = min(iterations, max(MIN_FAST_ITERATIONS, round(iterations * FAST_FRACTION)))
        self.tol = tolerance
        self.budget = budget

    def search(self) -> int:
        if self.n == 1:
            return 0
        self.coarse()
        while True:
            try:
                for _ in range(4 * self.n):  # each round either measures something new or ends
                    self.local()
                    self.bisect()
                    if not (self.recheck() or self.steady()):
                        break
            except _OverBudget:
                pass
            if not self.extend():
                break
        return self.pick()

    # -- measuring

    def t(self, w: int, phase: str) -> float:
        """Seconds per iteration of ``w`` workers, measured once when first asked for."""
        if not self.r.runs_of(w):
            if phase == "coarse":
                self.r.run(w, whole_rounds(self.k_coarse, w), w + 1, phase)
            else:
                self.run_within_budget(w, self.k_fine, phase)
        return self.estimate(w).seconds_per_iteration

    def run_within_budget(self, w: int, iterations: int, phase: str) -> Trial:
        iterations = whole_rounds(iterations, w)
        spi, overhead, warmup = self.predict(w)
        expected = overhead + (max(w + 1, warmup) + iterations) * spi
        if self.r.spent() + expected > self.budget * self.exhaustive_cost():
            raise _OverBudget
        self.r.run(w, iterations, w + 1, phase)
        return self.estimate(w)

    def estimate(self, w: int) -> Trial:
        est = self.r.estimate(w)
        assert est is not None, w
        return est

    def single(self, w: int) -> bool:
        """Whether ``w`` rests on one run whose error is known: a hiccup there cannot be told from
        the truth. (A measure reporting no error is trusted as exact and never re-run for this.)"""
        runs = self.r.runs_of(w)
        return len(runs) == 1 and runs[0].rel_error is not None

    def predict(self, w: int) -> tuple[float, float, float]:
        """Seconds per iteration, per-trial overhead (start-up, shutdown) and warm-up batches of
        ``w`` workers, interpolated between measured counts (throughput, not time, is interpolated:
        it grows about linearly with workers until the loader saturates, where time per iteration
        goes as 1/w; the warm-up is the measure's, which may add start-up prefetch rounds)."""
        m = self.r.measured()
        ws = sorted(m)
        rates = [1.0 / m[k].seconds_per_iteration for k in ws]
        overheads, warmups = [], []
        for k in ws:
            runs = self.r.runs_of(k)
            overheads.append(sum(max(0.0, r.wall_seconds - (r.warmup + r.iterations) * r.seconds_per_iteration)
                                 for r in runs) / len(runs))
            warmups.append(sum(r.warmup for r in runs) / len(runs))
        return (1.0 / float(np.interp(w, ws, rates)), float(np.interp(w, ws, overheads)),
                float(np.interp(w, ws, warmups)))

    def exhaustive_cost(self) -> float:
        """What the paper's search over 0..N-1 at ``iterations`` each would cost, as far as we can tell."""
        total = 0.0
        for w in range(self.n):
            spi, overhead, _ = self.predict(w)
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
        ladder = _ladder(self.n)
        for w in ladder:
            tw = self.t(w, "coarse")
            if self.cap is not None:
                continue  # open: every step up to the usable CPUs, whatever the curve did so far
            stops = tw > best * (1 + self.tol) or (tw >= best * (1 - self.tol) and stale >= 1)
            if stops and w != ladder[-1] and self.single(w):
                # one slowed trial must not end the pass early: confirm by an independent run
                try:
                    tw = self.run_within_budget(w, self.k_coarse, "recheck").seconds_per_iteration
                except _OverBudget:
                    pass
            if tw < best * (1 - self.tol):
                stale = 0
            else:
                stale += 1
                if tw > best * (1 + self.tol) or stale >= 2:
                    return
            best = min(best, tw)

    def extend(self) -> bool:
        """Open search: double the range while its top is the fastest count and still gaining.

        Gaining: faster by more than ``tolerance`` than the highest measured count at or below half
        the top (the ladder step before it). Returns whether a new top was measured.
        """
        top = self.n - 1
        if self.cap is None:
            return False
        m = self.r.measured()
        b, tb = self.best()
        below = max((w for w in m if w <= top // 2), default=None)
        if b != top or below is None or not tb < m[below].seconds_per_iteration * (1 - self.tol):
            self.stop_reason = f"the curve stopped rising by {top} workers"
            return False
        if top >= self.cap:
            self.stop_reason = f"the cap of {self.cap} workers (still rising there)"
            return False
        nxt = self.memory_fit(top, min(self.cap, 2 * top))
        if nxt <= top:
            self.stop_reason = f"memory: more than {top} workers would pass the limit"
            return False
        self.n = nxt + 1
        self.t(nxt, "coarse")
        return True

    def memory_fit(self, top: int, want: int) -> int:
        """The largest count up to ``want`` whose peak memory, extrapolated linearly from the measured
        counts with workers, stays within ``memory_limit`` (``want`` itself without a limit or figures)."""
        if self.memory_limit is None:
            return want
        mem = {w: t.peak_memory_bytes for w, t in self.r.measured().items() if w > 0 and t.peak_memory_bytes}
        if top not in mem:
            return want
        lows = [w for w in mem if w < top]
        slope = max(0.0, (mem[top] - mem[min(lows)]) / (top - min(lows))) if lows else mem[top] / top
        if slope <= 0:
            return want if mem[top] <= self.memory_limit else top
        return min(want, top + int((self.memory_limit - mem[top]) // slope))

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
            est = self.estimate(w)
            if est.rel_error is None or est.rel_error <= STEADY_FRACTION * self.tol:
                continue
            more = whole_rounds(max(self.k_fine, est.iterations), w)
            if est.iterations + more > self.max_iterations:
                continue
            try:
                self.run_within_budget(w, more, "steady")
            except _OverBudget:
                continue
            again = True
        return again

    def recheck(self) -> bool:
        """Give one independent run to the first count the pick hinges on that rests on one run.

        In order: the count just below the pick candidate (a slowed trial there hides the best or
        costs workers), the fastest count when it is not the candidate (it sets the limit), and its
        measured neighbours (a slowed trial can hide the true best beside it). Only counts that a
        slow-down of up to ``SLOWDOWN`` x could have pushed past the limit, and only within the
        budget. Returns whether a run was made (the search then runs local and bisect again).
        """
        b, _ = self.best()
        limit, g, lo = self.within()
        m = self.r.measured()
        seen = sorted(m)
        left = max((w for w in seen if w < b), default=None)
        right = min((w for w in seen if w > b), default=None)
        for w in dict.fromkeys(x for x in (lo, b if g != b else None, left, right) if x is not None):
            if not self.single(w) or m[w].seconds_per_iteration > SLOWDOWN * limit:
                continue
            try:
                self.run_within_budget(w, self.k_coarse, "recheck")
            except _OverBudget:
                continue
            return True
        return False

    def pick(self) -> int:
        limit, g, _ = self.within()
        within = [t for t in self.r.measured().values() if t.seconds_per_iteration <= limit]
        if all(t.wait_fraction is not None for t in within):
            return g
        if all(t.peak_memory_bytes is not None for t in within):
            return min(within, key=lambda t: (t.peak_memory_bytes, t.workers)).workers
        return g

