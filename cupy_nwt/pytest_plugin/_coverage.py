"""Whether a run judged what its baseline can judge: the gate's guard against passing without having looked.

A figure that regressed fails; so, under ``--nwt-require-baseline``, must a benchmark the baseline holds
that this run could not judge where the baseline could: one that ran in this session but gave no figure
(skipped, failed, its fixture never called), one whose entry holds no figure this run has, and one counted
exactly in the baseline but not judged exactly now (it would not count: a part that does not pickle, a
count past its time; or the counts no longer compare: another CPU, other software). Each would otherwise
pass with a line nobody reads, a real slowdown included. Entries this session did not run at all
(removed, renamed, or left out by ``-k`` or a shard) are listed, not failed: a shard runs part of the suite.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ._gate import EXACT_KEYS, Comparison

#: the verdicts that mean a figure was judged (compared under the limit, whatever the outcome)
JUDGED = ("ok", "regressed", "inconclusive")


def exact_in(info: Mapping[str, Any]) -> bool:
    """Whether a benchmark's figures hold a cost counted exactly (callgrind), the figure a stored baseline judges."""
    return info.get("instructions_counted_by") == "callgrind" and info.get("cost_per_sample") is not None


def coverage(current: Mapping[str, Mapping[str, Any]], baseline: Mapping[str, Mapping[str, Any]],
             collected: Collection[str], comparisons: Sequence[Comparison], max_drop_pct: float | None,
             require: bool, path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The lines (text, verdict) saying what the baseline holds that this run did not judge, and the benchmarks
    that fail for it (only under ``require``)."""
    lines: list[tuple[str, str]] = []
    failing: list[str] = []
    verdict = "regressed" if require else "note"
    why_fail = " (--nwt-require-baseline)" if require else ""

    def flag(name: str, text: str) -> None:
        lines.append((f"{name}: {text}{why_fail}", verdict))
        if require:
            failing.append(name)

    for name in baseline:
        if name not in current and name in collected:
            flag(name, f"in the baseline {path}, but it gave no figures in this run (skipped, failed, or its "
                       "benchmark fixture was not called): not judged")
    gone = [name for name in baseline if name not in current and name not in collected]
    if gone:
        shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
        lines.append((f"{len(gone)} baseline entr{'y' if len(gone) == 1 else 'ies'} of {path} not run in this "
                      f"session (removed, renamed, or not selected): {shown}", "note"))
    if max_drop_pct is None:
        return lines, failing
    for name, info in current.items():
        entry = baseline.get(name)
        if entry is None:
            continue
        old = entry.get("extra_info") or {}
        mine = [c for c in comparisons if c.fullname == name]
        if not mine:
            flag(name, f"its entry in the baseline {path} holds no figure this run measured: not judged")
        elif exact_in(old) and not any(c.key in EXACT_KEYS and c.judgement(max_drop_pct).verdict in JUDGED
                                       for c in mine):
            flag(name, f"counted exactly in the baseline {path}, not judged exactly here ({_why(info, mine, max_drop_pct)}); "
                       "save the baseline again where the gate runs once the cause is known")
    return lines, failing


def _why(info: Mapping[str, Any], mine: Sequence[Comparison], max_drop_pct: float) -> str:
    note = info.get("instructions_note")
    if note:
        return f"instructions not counted: {note}"
    reasons = [c.judgement(max_drop_pct).reason for c in mine if c.key == "cost_per_sample"]
    return next((r for r in reasons if r), "its cost was not counted")
