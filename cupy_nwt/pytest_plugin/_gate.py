"""The throughput gate's rule: this run's rounds against a baseline's, judged against their own noise.

pytest-benchmark's ``--benchmark-compare-fail=median:10%`` compares one statistic of two runs with a
fixed percentage, whatever the spread behind it; on a shared machine one slow stretch then fails an
unchanged rerun. Here a benchmark records each figure per round (``<key>_rounds`` in ``extra_info``,
beside the headline ``<key>``) and each figure is judged on its own (:func:`judge`):

* the **change** is the Hodges-Lehmann estimate of the ratio of this run's rounds to the baseline's,
  with its 95% Mann-Whitney interval (:mod:`cupy_nwt.pytest_plugin._interval`): distribution-free,
  so a stalled round moves it little;
* **regressed** (the run fails) when the change is worse than the limit *and* its interval excludes
  no change, so the slowdown is both larger than allowed and real; **inconclusive** (reported, never
  a failure) when not regressed but the interval reaches past the limit, so a slowdown of the limit's
  size could hide in the noise; **ok** otherwise. With one figure on each side (a benchmark of yours
  that sets only ``samples_per_s``) there is no interval and the rule is "worse than the limit".

The interval knows only the rounds of the two runs; what moves between runs the limit absorbs. The
figures (:data:`MEASURES`): ``samples_per_s`` (wall clock) and ``gbps`` (device time, higher is
better); ``cpu_s_per_1k`` (CPU seconds of the pipeline per 1,000 samples) and
``cost_per_sample`` and ``instructions_per_sample`` (lower is better). Against a **stored baseline**
(:class:`~cupy_nwt.pytest_plugin._circumstances.Context`):

* **exact counts** (callgrind, the same samples on both sides: ``Context.exact_counts``) do not move
  between runs of the same code, so they are judged at their own tight limit (``--nwt-instructions-drop``,
  1%) and decide for a CPU-bound pipeline: the cost (:mod:`cupy_nwt.pytest_plugin._cost`: instructions,
  cache misses, page faults and system calls weighed into estimated cycles) where both sides have it
  under the same weights, its instructions component alone where one side has only that;
* **no clock is failed**: a shared host's speed drifts by tens of percent between hours, and CPU time
  per sample drifts with it, by more than a 40% slowdown moves it (``bench/studies/does_the_gate_hold/gate_noise_proof.py
  --mode cpu``, figures in ``bench/results/README.md``). So samples/s and CPU per sample from another
  time are reported as information, and the summary says when a benchmark was judged on nothing;
  ``--nwt-against`` judges both in the same job;
* an **I/O-bound** pipeline (under ``IO_BOUND_CORES`` cores in both runs, with CPU idle beside it) has its CPU and
  instructions reported, not judged: wall clock is its figure, judged under ``--nwt-against``;
* a baseline from **another machine** (the recorded machine fingerprints differ) is compared and
  reported, never failed: the line names the difference.

Against the **base revision measured in the same job** (``--nwt-against``, :func:`compare_against`)
samples/s and CPU per sample are judged by the ratios of rounds run side by side (``paired``): a
drift of the machine falls on both rounds of a pair; and the base revision's exact counts, counted in
the same job, are judged against this run's as against a stored baseline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ArgumentError
from ._circumstances import Context, context_of
from ._cost import components_of, finite
from ._interval import paired_interval, shift_interval


@dataclass(frozen=True)
class Measure:
    unit: str
    higher_is_better: bool
    worse: str  # the verb of a regression: "fell" or "rose"


#: extra_info keys the gate watches, in the order lines are printed.
MEASURES: dict[str, Measure] = {
    "gbps": Measure("GB/s", True, "fell"),
    "samples_per_s": Measure("samples/s", True, "fell"),
    "cpu_s_per_1k": Measure("CPU s/1k samples", False, "rose"),
    "cost_per_sample": Measure("cost/sample", False, "rose"),
    "instructions_per_sample": Measure("instructions/sample", False, "rose"),
}
#: the exact counts (callgrind, the same samples on both sides), judged at their own tight limit
EXACT_KEYS = ("cost_per_sample", "instructions_per_sample")
THROUGHPUT_KEYS: dict[str, str] = {k: m.unit for k, m in MEASURES.items()}
#: ``<key>_rounds`` in extra_info holds the key's figure per round.
ROUNDS_SUFFIX = "_rounds"
#: the figures judged round for round against the base revision under ``--nwt-against``
PAIRED_KEYS = ("samples_per_s", "cpu_s_per_1k")


# ---------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Judgement:
    """One figure's verdict: ``ok``, ``regressed``, ``inconclusive``, ``reported`` (not judged) or ``compared``
    (no limit). Percentages are changes of the figure (+ up, - down); ``worse_pct`` is signed so that
    positive is worse whichever way the figure points."""

    verdict: str
    old: float
    new: float
    change_pct: float
    low_pct: float | None  # the 95% interval of the change; None: one figure on a side
    high_pct: float | None
    worse_pct: float
    old_rounds: int
    new_rounds: int
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(log_ratio: float) -> float:
    if log_ratio == math.inf:
        return math.inf
    if log_ratio == -math.inf:
        return -100.0
    return (math.exp(log_ratio) - 1.0) * 100.0


def judge(old: Sequence[float], new: Sequence[float], max_drop_pct: float | None,
          higher_is_better: bool = True, paired: bool = False) -> Judgement:
    """Judge this run's rounds (``new``) against the baseline's (``old``); the rule is the module's.

    ``paired``: round i of each side ran side by side in time (``--nwt-against``), so the change is
    that of the pairs' ratios (:func:`~cupy_nwt.pytest_plugin._interval.paired_interval`).
    """
    if not old or not new or not all(_positive(x) is not None for x in (*old, *new)):
        raise ArgumentError("judge needs at least one round on each side, all positive and finite")
    if paired and len(old) != len(new):
        raise ArgumentError("paired rounds need the same number on each side")
    sign = -1.0 if higher_is_better else 1.0  # worse = sign * change
    m_old, m_new = statistics.median(old), statistics.median(new)
    if len(old) == 1 and len(new) == 1:
        change = (m_new / m_old - 1.0) * 100.0
        low = high = None
        worse, significant, worst_end = sign * change, True, sign * change
    else:
        s = paired_interval(old, new) if paired else shift_interval(old, new)
        change, low, high = _pct(s.estimate), _pct(s.low), _pct(s.high)
        worse = sign * change
        significant = (high < 0) if higher_is_better else (low > 0)
        worst_end = sign * (low if higher_is_better else high)
    if max_drop_pct is None:
        verdict = "compared"
    elif worse > max_drop_pct and significant:
        verdict = "regressed"
    elif worst_end > max_drop_pct:
        verdict = "inconclusive"
    else:
        verdict = "ok"
    return Judgement(verdict, m_old, m_new, change, low, high, worse, len(old), len(new))


# ---------------------------------------------------------------- comparisons of benchmarks


@dataclass(frozen=True)
class Comparison:
    """One figure of one benchmark now against the same in a baseline.

    ``old``/``new`` are the medians of the rounds where there are rounds (the rounds ride along), else
    the headline figures.
    """

    fullname: str
    key: str
    old: float
    new: float
    source: str
    old_rounds: tuple[float, ...] = ()
    new_rounds: tuple[float, ...] = ()
    context: Context = field(default_factory=Context)
    paired: bool = False  # the base revision measured beside this run, round for round (--nwt-against)
    instructions_limit_pct: float | None = None  # the limit for exact counts, else max_drop_pct
    old_components: Mapping[str, float] | None = None  # cost_per_sample's, per sample (._cost)
    new_components: Mapping[str, float] | None = None

    @property
    def measure(self) -> Measure:
        return MEASURES.get(self.key, Measure(self.key, True, "fell"))

    @property
    def change_pct(self) -> float:
        return (self.new - self.old) / self.old * 100.0

    def limit(self, max_drop_pct: float | None) -> float | None:
        """The limit this figure is judged at: exact counts have their own, tighter one."""
        if max_drop_pct is not None and self.key in EXACT_KEYS and self.context.exact_counts:
            return self.instructions_limit_pct or max_drop_pct
        return max_drop_pct

    def largest_rise(self) -> str:
        """The cost component whose weighted share rose most, as ``name OLD -> NEW/sample``; "" when unknown."""
        from ._cost import COMPONENTS, WEIGHTS  # noqa: PLC0415

        old, new = self.old_components, self.new_components
        if not old or not new:
            return ""
        rises = {k: (new[k] - old[k]) * WEIGHTS.get(k, 1.0) for k, _ in COMPONENTS if k in old and k in new}
        if not rises:
            return ""
        k = max(rises, key=lambda key: rises[key])
        if rises[k] <= 0:
            return ""
        name = dict(COMPONENTS)[k]
        return f"most of it {name}, {_num(old[k])} -> {_num(new[k])} a sample ({signed_change(old[k], new[k])})"

    def judgement(self, max_drop_pct: float | None) -> Judgement:
        m, ctx = self.measure, self.context
        max_drop_pct = self.limit(max_drop_pct)
        j = judge(self.old_rounds or (self.old,), self.new_rounds or (self.new,), max_drop_pct, m.higher_is_better,
                  paired=self.paired)
        if max_drop_pct is None:
            return j
        reason, verdict = "", j.verdict
        if self.paired:
            reason = f"measured beside the base revision in this job, {j.new_rounds} pairs of rounds"
        elif self.key in EXACT_KEYS and ctx.count_machine:
            verdict, reason = "other-machine", f"baseline from another machine ({ctx.count_machine}): not judged"
        elif self.key in EXACT_KEYS and ctx.software_change:
            verdict, reason = "reported", f"counted by other software in the baseline ({ctx.software_change})"
        elif ctx.other_machine and self.key not in EXACT_KEYS:
            verdict, reason = "other-machine", f"baseline from another machine ({ctx.other_machine}): not judged"
        elif ctx.io_bound and self.key in ("cpu_s_per_1k", *EXACT_KEYS):
            verdict, reason = "reported", "I/O-bound, judged by wall clock (--nwt-against)"
        elif self.key == "samples_per_s":
            verdict = "reported"
            reason = ("wall clock against a baseline from another time is information; --nwt-against REV "
                      "judges it in the same job")
        elif self.key == "cost_per_sample" and not ctx.exact_cost:
            verdict = "reported"
            reason = ("counted over different samples or with other weights in the baseline"
                      if ctx.exact_counts else "not counted exactly on both sides")
        elif self.key == "instructions_per_sample" and ctx.exact_cost:
            verdict, reason = "reported", "a component of cost/sample, which decides"
        elif self.key == "instructions_per_sample" and ctx.old_counted != ctx.new_counted:
            verdict = "reported"
            reason = f"counted by {ctx.old_counted or 'nothing'} in the baseline, {ctx.new_counted or 'nothing'} here"
        elif self.key == "instructions_per_sample" and ctx.old_counted == "callgrind" and not ctx.exact_counts:
            verdict, reason = "reported", "callgrind counted a different number of samples in the baseline"
        elif self.key == "cpu_s_per_1k" and ctx.exact_counts:
            verdict, reason = "reported", "exact counts decide"
        elif self.key == "cpu_s_per_1k":
            verdict = "reported"
            reason = ("CPU time against a baseline from another time is information (it drifts with the machine); "
                      "exact instruction counts or --nwt-against REV judge it")
        return Judgement(verdict, j.old, j.new, j.change_pct, j.low_pct, j.high_pct, j.worse_pct,
                         j.old_rounds, j.new_rounds, reason)

    def regressed(self, max_drop_pct: float | None) -> bool:
        return self.judgement(max_drop_pct).verdict == "regressed"

    def message(self, max_drop_pct: float | None) -> str:
        j = self.judgement(max_drop_pct)
        m = self.measure
        max_drop_pct = self.limit(max_drop_pct)
        figures = f"{_num(j.old)} -> {_num(j.new)}"
        detail = ""
        if j.low_pct is not None and j.high_pct is not None:
            interval = ("no finite interval" if not (math.isfinite(j.low_pct) and math.isfinite(j.high_pct))
                        else f"95% interval {j.low_pct:+.1f}% to {j.high_pct:+.1f}%")
            detail = f" (medians of {j.old_rounds}|{j.new_rounds} rounds, {interval})"
        if j.verdict == "regressed":
            head = f"{m.unit} {m.worse} {j.worse_pct:.1f}% (more than {max_drop_pct:g}%): {figures}"
            rise = self.largest_rise() if self.key == "cost_per_sample" else ""
            head += f"; {rise}" if rise else ""
        elif j.verdict == "inconclusive":
            head = f"{m.unit} inconclusive, the noise reaches past the {max_drop_pct:g}% limit: {figures} ({signed_change(j.old, j.new)})"
            if j.reason:
                head = f"{m.unit} inconclusive: {figures} ({signed_change(j.old, j.new)})"
        else:
            head = f"{m.unit} {figures} ({signed_change(j.old, j.new)})"
        why = f"; {j.reason}" if j.reason else ""
        changed = f" (pipeline changed: {self.context.pipeline_change})" if self.context.pipeline_change else ""
        return f"{self.fullname}: {head}{detail}{why}{changed} [baseline {self.source}]"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["change_pct"] = self.change_pct
        return d


def _num(x: float) -> str:
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.4g}"


def signed_change(old: float, new: float) -> str:
    """The change from ``old`` to ``new`` as shown beside them: two significant digits below 1%, so that a
    small real change never prints as +0.0%."""
    if old == 0:
        return "new" if new else "+0%"
    pct = (new - old) / old * 100.0
    if pct == 0:
        return "+0%"
    if abs(pct) >= 1:
        return f"{pct:+.1f}%"
    return f"{pct:+.2g}%"


def _positive(value: Any) -> float | None:
    value = finite(value)
    return value if value is not None and value > 0 else None


def _rounds(info: Mapping[str, Any], key: str) -> tuple[float, ...]:
    """The key's rounds in an extra_info; () when absent or not a list of positive numbers."""
    raw = info.get(key + ROUNDS_SUFFIX)
    if not isinstance(raw, (list, tuple)) or not raw:
        return ()
    values = [_positive(x) for x in raw]
    return tuple(v for v in values if v is not None) if all(v is not None for v in values) else ()


def figure(info: Mapping[str, Any], key: str) -> tuple[float | None, tuple[float, ...]]:
    """A key's figure (the median of its rounds, else the headline) and its rounds."""
    rounds = _rounds(info, key)
    return (statistics.median(rounds) if rounds else _positive(info.get(key))), rounds


def compare_throughput(
    current: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Mapping[str, Any]],
    source: str,
    instructions_limit_pct: float | None = None,
) -> list[Comparison]:
    """Pair each watched key in ``current[fullname]`` (an extra_info) with the baseline's.

    ``baseline`` maps fullname -> a benchmark entry (with ``extra_info``) of pytest-benchmark's JSON or
    of a ``--nwt-save-baseline`` file. Benchmarks or keys missing on either side, and figures that are
    not positive numbers, are not compared.
    """
    out = []
    for fullname, info in current.items():
        entry = baseline.get(fullname)
        if not entry:
            continue
        old_info = entry.get("extra_info") or {}
        ctx = context_of(old_info, info)
        for key in MEASURES:
            (old, old_rounds), (new, new_rounds) = figure(old_info, key), figure(info, key)
            if old is not None and new is not None:
                out.append(Comparison(fullname, key, old, new, source, old_rounds, new_rounds, ctx,
                                      instructions_limit_pct=instructions_limit_pct,
                                      old_components=components_of(old_info), new_components=components_of(info)))
    return out


def compare_against(current: Mapping[str, Mapping[str, Any]],
                    instructions_limit_pct: float | None = None) -> list[Comparison]:
    """Each benchmark measured beside a base revision (``extra_info["against"]``): its paired figures, and
    its exact counts against the base revision's, counted in the same job."""
    out = []
    for fullname, info in current.items():
        base = info.get("against")
        if not isinstance(base, Mapping):
            continue
        source = f"{base.get('rev_name')} ({str(base.get('rev'))[:10]}), same job"
        for key in PAIRED_KEYS:
            old_rounds, new_rounds = _rounds(base, key), _rounds(info, key)
            if old_rounds and len(old_rounds) == len(new_rounds):
                out.append(Comparison(fullname, key, statistics.median(old_rounds), statistics.median(new_rounds),
                                      source, old_rounds, new_rounds, paired=True))
        ctx = context_of(base, info)
        for key in EXACT_KEYS:
            old, new = _positive(base.get(key)), _positive(info.get(key))
            if old is not None and new is not None and ctx.exact_counts:
                out.append(Comparison(fullname, key, old, new, source, context=ctx,
                                      instructions_limit_pct=instructions_limit_pct,
                                      old_components=components_of(base), new_components=components_of(info)))
    return out
