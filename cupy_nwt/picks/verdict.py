"""What a tuning decided, in one line, and whether its trials were steady enough to trust it.

A pick alone ("3 workers") does not say whether 4 would have done as well or 2 nearly so, nor
whether the trials were so noisy that the next run will pick something else. :func:`explain` gives
the one line (the pick's figure beside its measured neighbours', each marked within noise or not);
:func:`reliability` the warning, or None. With the user's step in the loop the figure is the
consumer's loop per batch and the share of it spent waiting in ``next()``; without, samples/s.

Why these thresholds. A pick is unreliable when the relative standard error of the pick's or the
fastest count's mean time is above ``MAX_REL_ERROR`` (10%: the 2-sigma band then spans +-20%, so
counts 5% apart, the agreement repeated runs aim at, cannot be told apart), or when a count measured
more than twice the tolerance slower than the fastest still lies within ``OVERLAP_Z`` combined
standard errors of it: the search treated as different two counts it could not tell apart; when a
count next to the fastest or just below the pick went unmeasured (the fast search's budget ran out
before its local steps closed the gap); and when other processes kept busy more than
``OTHER_CPUS`` of the usable CPUs (at least ``MIN_OTHER_CPUS``) during any run
(``Trial.other_cpus``): a trial's own error cannot see a load steady within it, yet a neighbour
started mid-search slows every count measured after it, and one running throughout makes the pick
one for a machine that busy. Pure: reads a result's trials, measures nothing.
"""

from __future__ import annotations

import math
from typing import Protocol

from ..reporting.units import plural
from .trials import Trial

MAX_REL_ERROR = 0.10
OVERLAP_Z = 2.0
TARGET_REL_ERROR = 0.03  # what a suggested longer trial aims at (errors fall as 1 / sqrt(batches timed))
MAX_LONGER = 8.0  # at most this many times longer: noise from a changing load does not average away
GAP_LONGER = 4.0  # longer trials where counts went unmeasured: start-up then weighs less in the search's budget
OTHER_CPUS = 0.1  # other processes' share of the usable CPUs during a run that makes the pick conditional
MIN_OTHER_CPUS = 0.5  # in CPUs: below, the kernel's tick accounting over a short trial cannot tell


class Judged(Protocol):
    """What a verdict reads of a result (``store.TuneResult`` has it): the pick, its trials, the rules."""

    @property
    def best_workers(self) -> int: ...
    @property
    def placement(self) -> str: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def usable_cpus(self) -> int | None: ...
    @property
    def iterations(self) -> int: ...
    @property
    def trials(self) -> tuple[Trial, ...]: ...
    @property
    def runs(self) -> tuple[Trial, ...]: ...


class UnreliablePickWarning(UserWarning):
    """A tuning's pick may not hold on another run: its trials were too noisy, its search left a count beside
    the pick unmeasured, or other processes kept the CPUs busy (``verdict.reliability``)."""


def _noise(a: Trial, b: Trial) -> float:
    """The 2-sigma relative band of the ratio of two counts' mean times (0 when errors are unknown)."""
    return OVERLAP_Z * math.hypot(a.rel_error or 0.0, b.rel_error or 0.0)


def _equal(a: Trial, b: Trial, tolerance: float) -> bool:
    """Whether two counts' times lie within the tolerance or the noise of each other."""
    return abs(math.log(a.seconds_per_iteration / b.seconds_per_iteration)) <= max(tolerance, _noise(a, b))


def _figure(t: Trial) -> str:
    if t.wait_fraction is None:
        return f"{t.samples_per_second:,.0f} samples/s"
    return f"{t.seconds_per_iteration * 1e3:.1f} ms, {t.wait_fraction:.1%} waiting"


def _neighbours(trials: dict[int, Trial], pick: int) -> list[Trial]:
    """The measured counts next to the pick on either side, and the fastest when it is neither."""
    below = max((w for w in trials if w < pick), default=None)
    above = min((w for w in trials if w > pick), default=None)
    fastest = min(trials.values(), key=lambda t: (t.seconds_per_iteration, t.workers)).workers
    picked = [w for w in dict.fromkeys((above, below, fastest)) if w is not None and w != pick]
    return [trials[w] for w in picked]


def explain(result: Judged) -> str:
    """One line: what was picked and why, e.g. "picked 3 workers: the consumer's loop takes 5.1 ms a
    batch, 1.2% of it waiting, with a 5.0-ms step (4 workers: 5.1 ms, 1.1% waiting, within noise;
    2: 5.5 ms, 9.8% waiting)". With a step the figure compared is the consumer's loop (the step
    and its wait): workers that slow the step itself, by taking the main process's CPU, cost too."""
    trials = {t.workers: t for t in result.trials}
    pick = trials.get(result.best_workers)
    head = f"picked {plural(result.best_workers, 'worker')}"
    if result.placement != "cpu":
        head += f" ({result.placement} decode)"
    if pick is None:
        return f"{head}: the only count to search, not measured"
    if pick.wait_fraction is not None and pick.step_seconds is not None:
        head += (f": the consumer's loop takes {pick.seconds_per_iteration * 1e3:.1f} ms a batch, "
                 f"{pick.wait_fraction:.1%} of it waiting, with a {pick.step_seconds * 1e3:.1f}-ms step")
    else:
        err = f" +-{pick.rel_error:.0%}" if pick.rel_error is not None else ""
        head += f": {pick.samples_per_second:,.0f} samples/s{err}"
    parts = []
    for i, t in enumerate(_neighbours(trials, pick.workers)):
        name = plural(t.workers, "worker") if i == 0 else str(t.workers)
        if _equal(t, pick, result.tolerance):
            note = "within noise"
        elif t.wait_fraction is None:
            ratio = t.samples_per_second / pick.samples_per_second - 1
            note = f"{abs(ratio):.0%} {'faster' if ratio > 0 else 'slower'}"
        else:
            note = ""
        parts.append(f"{name}: {_figure(t)}" + (f", {note}" if note else ""))
    core = core_left(result)
    return head + (f" ({'; '.join(parts)})" if parts else "") + (f"; {core}" if core else "")


def core_left(result: Judged) -> str | None:
    """One clause when the pick leaves a CPU to the main process and that lowered the wait, else None.

    With the user's step in the loop, workers that take every CPU crowd the main process, and the
    step (or its wait) lengthens; the searches compare that loop, so a count below the CPU count
    wins where it helps. Said when the pick is below the usable CPUs and the smallest measured count
    at or above them made the loop longer beyond the tolerance and the noise.
    """
    cpus = result.usable_cpus
    trials = {t.workers: t for t in result.trials}
    pick = trials.get(result.best_workers)
    if cpus is None or pick is None or pick.wait_fraction is None or pick.workers >= cpus:
        return None
    busy = next((trials[w] for w in sorted(trials) if w >= cpus), None)
    if busy is None or busy.seconds_per_iteration <= pick.seconds_per_iteration or _equal(busy, pick, result.tolerance):
        return None
    return (f"a core left to the main process: {plural(busy.workers, 'worker')} on {plural(cpus, 'usable CPU')} "
            f"made the loop {_figure(busy)}")


def reliability(result: Judged, subject: str = "the pick") -> str | None:
    """Why the pick may not hold on another run, with what to do; None when its trials were steady.

    ``subject`` names the pick in the sentence ("this search's pick" where a saved one was kept)."""
    noisy, worst = _noise_reasons(result)
    gaps = _gap_reason(result)
    loaded = _load_reason(result)
    if not (noisy or gaps or loaded):
        return None
    reasons = "; ".join(noisy + [r for r in (gaps, loaded) if r])
    head = f"{subject} of {plural(result.best_workers, 'worker')} is unreliable: {reasons}. Another run may pick another count: "
    if not (noisy or gaps):
        return head + ("tune again when other processes leave the CPUs alone (more batches per trial do not "
                       "average out a load that comes and goes)")
    factor = (max(worst, MAX_REL_ERROR) / TARGET_REL_ERROR) ** 2 if noisy else 1.0
    suggest = _round_up(result.iterations * min(MAX_LONGER, max(GAP_LONGER if gaps else 2.0, factor)))
    return head + (f"time more batches per trial (iterations={suggest}, cupy-nwt tune --iterations {suggest}; "
                   f"now {result.iterations})" + (", on a quieter machine if you can" if noisy or loaded else ""))


def unreliable_because(result: Judged) -> str | None:
    """The short reason a pick is unreliable, for a line that carries the pick's why; None when it is not."""
    noisy, _ = _noise_reasons(result)
    if noisy:
        return "its trials were too noisy to tell the counts apart"
    if _gap_reason(result):
        return "its search left a count next to the pick unmeasured"
    if _load_reason(result):
        return "other processes kept the CPUs busy during its trials"
    return None


def _gap_reason(result: Judged) -> str | None:
    """Counts next to the fastest (either side) or below the pick left unmeasured between measured ones; else None.

    The fast search measures them before it picks, unless its budget (a share of the exhaustive
    search's cost) ran out first, which start-ups that outweigh short trials make likely. Longer
    trials weigh start-up less in that budget.
    """
    measured = sorted({t.workers for t in result.trials})
    if len(measured) < 2:
        return None
    fastest = min(result.trials, key=lambda t: (t.seconds_per_iteration, t.workers)).workers
    gaps = sorted({w for w in (fastest - 1, fastest + 1, result.best_workers - 1)
                   if w not in measured and measured[0] < w < measured[-1]})
    if not gaps:
        return None
    return (f"it never measured {', '.join(str(w) for w in gaps)}, next to the fastest count ({fastest}) or the pick: "
            "the search's budget ran out first")


def _noise_reasons(result: Judged) -> tuple[list[str], float]:
    """The trials' own noise: the reasons it makes the pick unreliable, and the worst decisive error."""
    trials = {t.workers: t for t in result.trials}
    if len(trials) < 2:
        return [], 0.0
    fastest = min(trials.values(), key=lambda t: (t.seconds_per_iteration, t.workers))
    decisive = [t for t in dict.fromkeys((trials.get(result.best_workers), fastest)) if t is not None]
    worst = max((t.rel_error for t in decisive if t.rel_error is not None), default=0.0)
    reasons = []
    if worst > MAX_REL_ERROR:
        reasons.append(f"its trials' times vary by +-{worst:.0%} (relative standard error, over {MAX_REL_ERROR:.0%})")
    hidden = []
    for t in sorted(trials.values(), key=lambda t: t.workers):
        gap = math.log(t.seconds_per_iteration / fastest.seconds_per_iteration)
        if t is not fastest and gap > 2 * result.tolerance and gap <= _noise(t, fastest):
            hidden.append(f"{t.workers} ({-math.expm1(-gap):.0%} slower)")
    if hidden:
        reasons.append(f"the trials cannot tell {', '.join(hidden)} from the fastest, {fastest.workers}")
    return reasons, worst


def _load_reason(result: Judged) -> str | None:
    """Where other processes took a share of the CPUs during some run, which counts met it; else None."""
    runs = [r for r in result.runs if r.other_cpus is not None]
    if len({r.workers for r in result.runs}) < 2 or not runs:
        return None
    cpus = result.usable_cpus
    limit = max(MIN_OTHER_CPUS, OTHER_CPUS * cpus) if cpus else MIN_OTHER_CPUS
    hit = [r for r in runs if (r.other_cpus or 0.0) > limit]
    if not hit:
        return None
    most = max(r.other_cpus or 0.0 for r in hit)
    least = min(r.other_cpus or 0.0 for r in runs)
    of = f" of the {plural(cpus, 'usable CPU')}" if cpus else ""
    if len(hit) == len(runs) and most - least <= limit:
        return f"other processes kept up to {most:.1f}{of} busy during every trial: the pick suits a machine that busy"
    where = ("every trial" if len(hit) == len(runs) else
             f"the trials of {', '.join(str(w) for w in sorted({r.workers for r in hit}))} workers")
    return (f"other processes kept up to {most:.1f}{of} busy during {where} ({least:.1f} in the least busy), "
            "so counts measured at different times met different loads")


def _round_up(x: float) -> int:
    """``x`` rounded up to two significant digits (a number to type)."""
    n = max(1, math.ceil(x))
    scale = 10 ** max(0, len(str(n)) - 2)
    return -(-n // scale) * scale
