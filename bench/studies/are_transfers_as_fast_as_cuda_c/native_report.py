"""cupy_nwt against the native CUDA C reference (bench/native/), figure by figure, from one run's JSON.

Reads, from one folder (what ``bench/gpu_session.sh transfers`` writes):

* ``bandwidth.json`` and ``overlap.json``: ``cupy-nwt bandwidth`` / ``cupy-nwt overlap`` output;
* ``native-bandwidth.json`` and ``native-overlap.json``: ``nwt_native bandwidth`` / ``overlap``;
* optionally further rounds of all four, ``<name>-r2.json``, ``<name>-r3.json``, ...: the step runs
  cupy_nwt and native alternately, so a neighbour's load or the GPU's clocks hit both alike.

Every figure becomes one row: cupy_nwt's speed as a share of native's (GB/s over GB/s, or native's
seconds over cupy_nwt's), so 1.00 is "as fast as CUDA C" whatever the unit. Rows where the copy, not
the issuing code, sets the time (pinned copies from 1 MiB, batched pinned copies, the overlap stages
and versions; a pageable copy is set by the host's staging through the driver's bounce buffer) are marked ``copy-bound``: the goal is >= 0.97 on each of them. Writes
``native_vs_cupy_nwt.json`` into the folder and prints the table:

    PYTHONPATH=. python bench/studies/are_transfers_as_fast_as_cuda_c/native_report.py bench/results/<device>/transfers

Each round gives each figure one share; a figure's ``rounds`` hold their median and 90 % bootstrap
interval, and its ``verdict`` judges the goal only where that interval allows (``met``, ``missed``,
``undecided``; ``undecided`` too below 3 rounds). Both files' ``excess_explained`` (how much of each async version's miss of the ideal pipelined time
the duplex rates and the hand-off account for) are listed side by side under ``excess``.

Exit 0 (a report, whatever the shares); 2 a file missing, unreadable, or not the experiment it names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from cupy_nwt.reporting.figures import figure
from cupy_nwt.reporting.tables import write_json

GOAL = 0.97
COPY_BOUND_FROM = 1024**2  # pinned copies from this size are set by the link, not by the call
FILES = {("bandwidth", "cupy_nwt"): "bandwidth.json", ("overlap", "cupy_nwt"): "overlap.json",
         ("bandwidth", "native"): "native-bandwidth.json", ("overlap", "native"): "native-overlap.json"}


class ReportError(ValueError):
    """An input that cannot be compared; one line for the user."""


def load(folder: Path, experiment: str, source: str, suffix: str = "") -> dict[str, Any]:
    path = folder / FILES[(experiment, source)].replace(".json", f"{suffix}.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("experiment") != experiment:
        raise ReportError(f"{path}: not a {experiment} result")
    if "error" in doc:
        raise ReportError(f"{path}: the {source} run failed: {doc['error']}")
    return doc


def _median(stats: Any) -> float | None:
    value = stats.get("median") if isinstance(stats, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _row(figure: str, cupy_nwt: float | None, native: float | None, unit: str, copy_bound: bool,
         higher_is_faster: bool) -> dict[str, Any]:
    share = None
    if cupy_nwt and native:
        share = cupy_nwt / native if higher_is_faster else native / cupy_nwt
    return {"figure": figure, "unit": unit, "cupy_nwt": cupy_nwt, "native": native, "share": share,
            "copy_bound": copy_bound, "meets_goal": None if share is None or not copy_bound else share >= GOAL}


def bandwidth_rows(ours: dict[str, Any], native: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    theirs = {(p["direction"], p["memory"], p["nbytes"]): p for p in native.get("points", [])}
    for p in ours.get("points", []):
        key = (p["direction"], p["memory"], p["nbytes"])
        other = theirs.get(key)
        bound = p["memory"] == "pinned" and p["nbytes"] >= COPY_BOUND_FROM
        rows.append(_row(f"{p['direction']} {p['memory']} {p['nbytes']} B", _median(p.get("gbps")),
                         _median(other.get("gbps")) if other else None, "GB/s", bound, True))
    theirs_b = {(b["direction"], b["memory"]): b for b in native.get("batching", [])}
    for b in ours.get("batching", []):
        other = theirs_b.get((b["direction"], b["memory"]), {})
        name = f"{b['direction']} {b['memory']} {b['total_bytes']} B"
        rows.append(_row(f"{name} as one copy", b.get("one_copy_gbps"), other.get("one_copy_gbps"), "GB/s",
                         b["memory"] == "pinned", True))
        rows.append(_row(f"{name} as {b['chunks']} copies", b.get("many_copies_gbps"),
                         other.get("many_copies_gbps"), "GB/s", b["memory"] == "pinned", True))
    return rows


def overlap_rows(ours: dict[str, Any], native: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for stage in ("h2d", "kernel", "d2h"):
        rows.append(_row(f"overlap stage {stage}", _median(ours.get("stages", {}).get(stage)),
                         _median(native.get("stages", {}).get(stage)), "s", True, False))
    theirs = {v["name"]: v for v in native.get("versions", [])}
    for v in ours.get("versions", []):
        other = theirs.get(v["name"], {})
        rows.append(_row(f"overlap {v['name']}", _median(v.get("seconds")), _median(other.get("seconds")), "s",
                         True, False))
    return rows + duplex_rows(ours, native)


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def duplex_rows(ours: dict[str, Any], native: dict[str, Any]) -> list[dict[str, Any]]:
    """The duplex stage (GB/s each way, alone and with the other direction running), the serial chunks,
    the hand-off and the ideal rebuilt from them; none for a cupy_nwt file from before they existed."""
    rows = []
    theirs = {p["nbytes"]: p for p in native.get("duplex", [])}
    for p in ours.get("duplex", []):
        other = theirs.get(p["nbytes"], {}).get("gbps", {})
        for key in ("h2d_alone", "d2h_alone", "h2d_duplex", "d2h_duplex"):
            rows.append(_row(f"overlap duplex {key} {p['nbytes']} B", _positive(p["gbps"].get(key)),
                             _positive(other.get(key)), "GB/s", p["nbytes"] >= COPY_BOUND_FROM, True))
    handoff, their_handoff = ours.get("handoff"), native.get("handoff") or {}
    if handoff:
        rows.append(_row("overlap serial_chunks", _median(handoff["serial_chunks"].get("seconds")),
                         _median(their_handoff.get("serial_chunks", {}).get("seconds")), "s", True, False))
        rows.append(_row("overlap hand-off", _positive(handoff.get("seconds")),
                         _positive(their_handoff.get("seconds")), "s", False, False))
    measured = (ours.get("ideal_from_measured_stages") or {}).get("seconds")
    if measured is not None:
        rows.append(_row("overlap ideal from measured stages", _positive(measured),
                         _positive((native.get("ideal_from_measured_stages") or {}).get("seconds")), "s", False,
                         False))
    return rows


def excess_rows(docs: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Per source and pipelined version: its ratio to the blog's ideal and to the measured one, and the
    share of its excess that the duplex rates, the hand-off and nothing measured explain."""
    rows = []
    for source in ("cupy_nwt", "native"):
        for v in docs[("overlap", source)].get("versions", []):
            ex = v.get("excess_explained")
            if ex:
                rows.append({"source": source, "version": v["name"], "vs_ideal": v.get("vs_ideal"),
                             **{k: ex.get(k) for k in ("vs_measured_ideal", "by_duplex", "by_handoff",
                                                       "unexplained", "crossings_for_the_rest")}})
    return rows


def rounds(folder: Path) -> list[str]:
    """The suffix of each round's files in ``folder``: "" (the four plain names), then "-r2", "-r3", ...
    while all four of that round exist."""
    out = [""]
    while all((folder / name.replace(".json", f"-r{len(out) + 1}.json")).is_file() for name in FILES.values()):
        out.append(f"-r{len(out) + 1}")
    return out


def compare_round(folder: Path, suffix: str = "") -> tuple[list[dict[str, Any]], dict[tuple[str, str], Any]]:
    """One round's rows, and its four documents."""
    docs = {key: load(folder, *key, suffix=suffix) for key in FILES}
    rows = (bandwidth_rows(docs[("bandwidth", "cupy_nwt")], docs[("bandwidth", "native")])
            + overlap_rows(docs[("overlap", "cupy_nwt")], docs[("overlap", "native")]))
    return rows, docs


def merge(per_round: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per figure over the rounds: the medians of each side and of the per-round shares, and
    the shares' interval and verdict (copy-bound figures only are judged)."""
    rows = []
    for first in per_round[0]:
        same = [r for rs in per_round for r in rs if r["figure"] == first["figure"]]
        shares = [r["share"] for r in same if r["share"] is not None]
        summary = figure(shares, GOAL if first["copy_bound"] else None)

        def med(key: str, same: list[dict[str, Any]] = same) -> float | None:
            vals = [r[key] for r in same if r[key] is not None]
            return statistics.median(vals) if vals else None

        share = summary["median"]
        rows.append({**first, "cupy_nwt": med("cupy_nwt"), "native": med("native"), "share": share,
                     "meets_goal": None if share is None or not first["copy_bound"] else share >= GOAL,
                     "rounds": summary, "verdict": summary["verdict"]})
    return rows


def compare(folder: Path) -> dict[str, Any]:
    names = rounds(folder)
    results = [compare_round(folder, n) for n in names]
    rows = merge([rs for rs, _ in results])
    bound = [r for r in rows if r["copy_bound"] and r["share"] is not None]
    return {"goal": GOAL, "rounds": len(names), "rows": rows, "excess": excess_rows(results[0][1]),
            "unmatched": [r["figure"] for r in rows if r["share"] is None],
            "copy_bound_min_share": min((r["share"] for r in bound), default=None),
            "copy_bound_below_goal": [r["figure"] for r in bound if r["share"] < GOAL],
            "verdicts": {v: [r["figure"] for r in rows if r["verdict"] == v] for v in ("met", "missed", "undecided")}}


def table(report: dict[str, Any]) -> str:
    lines = [f"{'figure':48} {'cupy_nwt':>11} {'native':>11} {'share':>6}  {'90% interval':>13}  copy-bound"]
    for r in report["rows"]:
        def fmt(x: float | None, unit: str = r["unit"]) -> str:
            return "-" if x is None else (f"{x:.2f}" if unit == "GB/s" else f"{1e6 * x:.1f} us")

        share = "-" if r["share"] is None else f"{r['share']:.3f}"
        mark = {True: "ok", False: "BELOW", None: ""}[r["meets_goal"]]
        if r.get("verdict"):
            mark = f"{mark} ({r['verdict']})"
        span = r.get("rounds") or {}
        ci = "-" if span.get("low") is None else f"{span['low']:.3f}-{span['high']:.3f}"
        lines.append(f"{r['figure']:48} {fmt(r['cupy_nwt']):>11} {fmt(r['native']):>11} {share:>6}  {ci:>13}  {mark}")
    low = report["copy_bound_min_share"]
    lines.append(f"share = cupy_nwt's speed / native's, median of {report.get('rounds', 1)} alternated round(s); "
                 f"goal >= {GOAL} where the copy sets the time, judged where the interval allows; "
                 f"lowest there: {'-' if low is None else f'{low:.3f}'}")
    if report["excess"]:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{100 * x:.0f}%"

        lines += ["", f"{'excess over the ideal':24} {'vs ideal':>8} {'vs measured':>11} {'by duplex':>9} "
                      f"{'by hand-off':>11} {'unexplained':>11} {'crossings for the rest':>22}"]
        for e in report["excess"]:
            rest = e.get("crossings_for_the_rest")
            lines.append(f"{e['source'] + ' ' + e['version']:24} {e['vs_ideal']:>8.3f} {e['vs_measured_ideal']:>11.3f} "
                         f"{pct(e['by_duplex']):>9} {pct(e['by_handoff']):>11} {pct(e['unexplained']):>11} "
                         f"{'-' if rest is None else f'{rest:.1f}':>22}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the folder with the four JSON files")
    args = p.parse_args(argv)
    try:
        report = compare(args.folder)
    except ReportError as exc:
        print(f"native_report: {exc}", file=sys.stderr)
        return 2
    write_json(report, args.folder / "native_vs_cupy_nwt.json")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
