"""A tuning's result as text: the trials and the pick, and why the paper strategy picked what it did.

Algorithm 1 is greedy: it takes a worker count only when that count's time for 100 iterations
beats the last count it took by more than ``alpha``. Its pick is therefore the last count taken,
which can be well short of the fastest count it measured; a bare "pick: 4" next to a faster 6 reads
like a bug. The paper search measures every count once, in order, so the result alone is enough to
replay each accept/reject decision and show them beside the exhaustive best.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ArgumentError
from ..nwt.paper import PAPER_TIME_SCALE
from ..picks.verdict import reliability
from ..reporting.tables import table
from ..reporting.units import fmt_bytes, plural

if TYPE_CHECKING:
    from ..picks.store import SaveOutcome, TuneResult

MAIN_PROCESS_TEXT = {
    "waits": "main process: waits in every trial, as in a GPU step (it mostly waits for the device)",
    "busy": "main process: busy in every trial, as in a CPU step (one CPU kept busy beside the workers)",
    "step": "main process: ran your step on every batch of every trial, as training will",
}

WIDTH = 100  # the prose is wrapped: it is printed, and kept in a Markdown code block by reproduce


@dataclass(frozen=True)
class PaperDecision:
    """One step of Algorithm 1: a count's time on the paper's scale, the bar it had to beat, the verdict.

    ``gain`` is how much faster than the last accepted count it was (seconds per 100 iterations;
    negative: slower); None for the first count, which is always taken.
    """

    workers: int
    seconds_per_100: float
    accepted_before: int | None
    gain: float | None
    accepted: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paper_decisions(result: TuneResult) -> tuple[PaperDecision, ...]:
    """Replay ``normalized < best - alpha`` over the counts in the order the search ran them."""
    if result.strategy != "paper":
        raise ArgumentError(f"only the paper strategy follows Algorithm 1, this result is {result.strategy!r}")
    out: list[PaperDecision] = []
    best, taken = math.inf, None
    for t in result.trials:
        normalized = t.seconds_per_iteration * PAPER_TIME_SCALE
        accepted = normalized < best - result.alpha
        out.append(PaperDecision(t.workers, normalized, taken, None if taken is None else best - normalized, accepted))
        if accepted:
            best, taken = normalized, t.workers
    return tuple(out)


def _verdict(d: PaperDecision, alpha: float) -> str:
    if d.gain is None:
        return "taken: the first count"
    if d.accepted:
        return f"taken: {d.gain:.2f} s faster than {d.accepted_before}, more than alpha"
    if d.gain > 0:
        return f"passed over: only {d.gain:.2f} s faster than {d.accepted_before}, not more than alpha {alpha:g}"
    return f"passed over: {-d.gain:.2f} s slower than {d.accepted_before}"


def explain_paper_pick(result: TuneResult) -> str:
    """What alpha is, each decision, and the pick next to the fastest count measured ("" unless paper)."""
    if result.strategy != "paper" or not result.trials:
        return ""
    decisions = paper_decisions(result)
    rows = [[d.workers, d.seconds_per_100, _verdict(d, result.alpha)] for d in decisions]
    lines = [table(["workers", f"s per {PAPER_TIME_SCALE} iter", "Algorithm 1"], rows,
                   title=f"why the paper's rule picked {result.best_workers}"), ""]
    lines.append(
        f"alpha = {result.alpha:g} s per {PAPER_TIME_SCALE} iterations: Algorithm 1 takes a worker count only when its "
        f"time for {PAPER_TIME_SCALE} iterations beats the last count it took by more than alpha, and keeps the last "
        "count taken; it never goes back to a faster count it passed over.")
    by = {d.workers: d for d in decisions}
    pick = by[result.best_workers]
    later = [d for d in decisions if d.workers > pick.workers]
    if later:
        nearest = min(later, key=lambda d: (d.seconds_per_100, d.workers))
        margin = pick.seconds_per_100 - nearest.seconds_per_100
        lines.append(
            f"It stopped at {plural(pick.workers, 'worker')} ({pick.seconds_per_100:.2f} s): no later count beat that "
            f"by more than {result.alpha:g} s (the fastest later count, {nearest.workers}, was "
            + (f"{margin:.2f} s faster)." if margin > 0 else f"{-margin:.2f} s slower)."))
    else:
        lines.append(f"It took the last count, {plural(pick.workers, 'worker')} ({pick.seconds_per_100:.2f} s).")
    fastest = min(decisions, key=lambda d: (d.seconds_per_100, d.workers))
    if fastest.workers == pick.workers:
        lines.append(f"Exhaustive best (fastest count measured): {fastest.workers}, the same as the pick.")
    else:
        slower = pick.seconds_per_100 / fastest.seconds_per_100 - 1
        lines.append(
            f"Exhaustive best (fastest count measured): {plural(fastest.workers, 'worker')} at "
            f"{fastest.seconds_per_100:.2f} s; the pick takes {slower:.1%} longer per iteration"
            + (f" and runs {plural(fastest.workers - pick.workers, 'fewer worker', 'fewer workers')}."
               if fastest.workers > pick.workers else "."))
    return "\n".join(lines[:2] + [textwrap.fill(p, WIDTH) for p in lines[2:]])


def pick_in_force(result: TuneResult, outcome: SaveOutcome | None = None) -> TuneResult:
    """The result whose pick holds after this run: a saved one kept over this search's, else this search's."""
    return outcome.in_force if outcome is not None and not outcome.replaced else result


def verdict(result: TuneResult, outcome: SaveOutcome | None = None) -> dict[str, Any]:
    """The run's one verdict: the pick in force (what ``num_workers="auto"`` will use), where it came
    from, why, and the warning when the trials were too noisy to trust this search's pick."""
    held = pick_in_force(result, outcome)
    kept = held is not result
    return {"workers": held.best_workers, "worker_type": held.worker_type, "placement": held.placement,
            "source": "saved" if kept else "this search", "search_pick": result.best_workers,
            "why": result.why, "saved": None if outcome is None else outcome.reason,
            "warning": reliability(result, "this search's pick" if kept else "the pick")}


def _pick_line(result: TuneResult, held: TuneResult, rule: str) -> str:
    kind = f", {held.worker_type} workers" if held.worker_type != "process" else ""
    if held is result:
        return f"pick: {plural(held.best_workers, 'worker')}{kind} ({rule})"
    if (held.best_workers, held.worker_type) == (result.best_workers, result.worker_type):
        return f"pick: {plural(held.best_workers, 'worker')}{kind} ({rule})"
    return (f"pick: {plural(held.best_workers, 'worker')}{kind}, the saved pick, kept: this search's "
            f"{result.best_workers} is not faster than it beyond the uncertainty")


def tune_summary(result: TuneResult, saved_to: Path | None = None, *, outcome: SaveOutcome | None = None) -> str:
    """The trials as a table, the one pick in force and why, what the search cost, how far it looked,
    what was saved, and a warning when the trials were too noisy to trust the search's pick."""
    held = pick_in_force(result, outcome)
    trials = result.trials
    fastest = min(trials, key=lambda t: (t.seconds_per_iteration, t.workers)).workers if trials else None
    waits = any(t.wait_fraction is not None for t in trials)
    rows = []
    for t in trials:
        notes = [n for n, hit in (("pick", t.workers == held.best_workers),
                                  ("this search's pick", t.workers == result.best_workers != held.best_workers),
                                  ("fastest", t.workers == fastest)) if hit]
        rows.append([t.workers, t.seconds_per_iteration * 1e3, round(t.samples_per_second),
                     *([None if t.wait_fraction is None else f"{t.wait_fraction:.1%}"] if waits else []),
                     f"{t.rel_error:.1%}" if t.rel_error is not None else None,
                     fmt_bytes(t.peak_memory_bytes) if t.peak_memory_bytes is not None else None,
                     fmt_bytes(t.peak_uss_bytes) if t.peak_uss_bytes is not None else None,
                     t.iterations, ", ".join(notes)])
    title = (f"NWT ({result.strategy}): {plural(len(trials), 'worker count')} measured in "
             f"{plural(len(result.runs), 'run')}, "
             f"device {result.device}, batch {result.batch_size}")
    headers = ["workers", "ms/iter", "samples/s", *(["waits"] if waits else []), "error", "peak PSS", "peak USS",
               "timed iters", "note"]
    lines = [table(headers, rows, title=title)]
    rule = (f"alpha {result.alpha:g} s per {PAPER_TIME_SCALE} iterations" if result.strategy == "paper"
            else f"tolerance {result.tolerance:.0%}")
    lines.append("")
    lines.append(_pick_line(result, held, rule))
    lines.append(("this search " if held is not result else "why: ") + result.why)
    lines.append(f"search took {result.search_seconds:.1f} s")
    if result.search_end and result.strategy == "fast":
        cpus = f", {plural(result.usable_cpus, 'usable CPU')}" if result.usable_cpus else ""
        lines.append(f"searched counts 0..{result.max_workers - 1}{cpus}; it looked no further: {result.search_end}")
    if result.main_process in MAIN_PROCESS_TEXT and result.trials:  # no trial ran (one count to search): nothing to say
        lines.append(MAIN_PROCESS_TEXT[result.main_process])
    if outcome is not None:
        if outcome.replaced:
            lines.append(f"saved to {outcome.path}: {outcome.reason}")
        else:  # the pick line says why a different saved pick was kept
            lines.append(f"{outcome.reason} ({outcome.path})" if held.best_workers == result.best_workers
                         else f"kept in {outcome.path}")
    elif saved_to is not None:
        lines.append(f"saved to {saved_to}")
    warning = reliability(result, "the pick" if held is result else "this search's pick")
    if warning:
        lines.append(textwrap.fill(f"WARNING: {warning}", WIDTH, subsequent_indent="  "))
    return "\n".join(lines)
