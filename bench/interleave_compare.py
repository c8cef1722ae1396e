"""Two revisions of the loader measured side by side: ``loader_compare.py`` of each, interleaved.

Why interleaved: on a shared machine the load drifts over minutes, so "before" measured now and
"after" measured later differ by the drift as much as by the change. Here each revision is checked
out into its own temporary git worktree and the two run in turns, a few rounds, the order flipped
every round (before-after, after-before, ...), so drift hits both alike. Each run is the revision's
own ``loader_compare.py`` with the same arguments, its package imported from its own worktree.

Per cell (workload, loader, workers) the result holds each round's median samples/s of both
revisions, the ratio of their medians over the rounds (after / before), and the noise: the largest
relative spread between rounds of one revision. A ratio within 1 +- noise is "within noise" (with one
round there is no noise to judge by: the verdict is left out).
Writes one JSON and its PNG, by default ``bench/results/<host>/interleave_compare.json``:

    .venv/bin/python bench/interleave_compare.py --before <rev> --after HEAD --rounds 3 \\
        -- --workers 0,1,2 --repeats 3 --loaders cupy_nwt,cupy_nwt-thread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cupy_nwt import system  # noqa: E402 - the checkout this script belongs to
from cupy_nwt.reporting import tables as report  # noqa: E402

Cell = tuple[str, str, int]  # (workload, loader, num_workers)


def resolve(rev: str) -> str:
    """The commit a revision names, or a one-line error."""
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"interleave_compare: {rev!r} is not a revision of {ROOT}")
    return out.stdout.strip()


def medians(result: dict[str, Any]) -> dict[Cell, float]:
    """Median samples/s per cell of one ``loader_compare`` JSON."""
    return {(p["workload"], p["loader"], int(p["num_workers"])): float(p["samples_per_s"]["median"])
            for p in result["points"]}


def summarize(runs: dict[str, list[dict[Cell, float]]]) -> list[dict[str, Any]]:
    """Per cell: both revisions' per-round medians, the ratio of their medians, the noise, the verdict."""
    cells = sorted(set.intersection(*(set(r) for rev in runs.values() for r in rev)))
    rows = []
    for cell in cells:
        before = [r[cell] for r in runs["before"]]
        after = [r[cell] for r in runs["after"]]
        mb, ma = statistics.median(before), statistics.median(after)
        noise = max((max(v) - min(v)) / statistics.median(v) if len(v) > 1 else 0.0 for v in (before, after))
        ratio = ma / mb if mb > 0 else float("nan")
        within = abs(ratio - 1) <= noise if len(before) > 1 and len(after) > 1 else None  # one round: no noise known
        rows.append({"workload": cell[0], "loader": cell[1], "num_workers": cell[2], "before": before,
                     "after": after, "ratio": ratio, "noise": noise, "within_noise": within})
    return rows


def loader_compare_in(tree: Path) -> Path:
    """The checkout's ``loader_compare.py``: in its study's folder, or in ``bench/`` at older revisions."""
    study = tree / "bench" / "studies" / "is_the_loader_faster_than_torch" / "loader_compare.py"
    return study if study.is_file() else tree / "bench" / "loader_compare.py"


def names_out_dir(arg: str) -> bool:
    """Whether ``loader_compare.py`` reads ``arg`` as its ``--out-dir``: spelled out, with ``=``, or
    abbreviated as argparse allows (``--out``); the runs' files must land where this script looks."""
    name = arg.split("=", 1)[0]
    return len(name) >= 3 and "--out-dir".startswith(name)


def run_once(tree: Path, out_dir: Path, args: Sequence[str]) -> dict[Cell, float]:
    """``loader_compare.py`` of the checkout at ``tree``, importing its own package; its medians."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(loader_compare_in(tree)), *args, "--out-dir", str(out_dir)]  # the last one wins
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"interleave_compare: loader_compare failed in {tree}:\n{proc.stderr.strip()[-2000:]}")
    (path,) = out_dir.glob("loader_compare-*.json")
    return medians(json.loads(path.read_text()))


def interleaved(revs: dict[str, str], rounds: int, measure: Callable[[str, Path, int, Path], Any],
                prefix: str, folders: dict[str, Path] | None = None) -> dict[str, list[Any]]:
    """``measure(label, tree, round, scratch)`` for "before" and "after" in alternating order, round by round,
    each in a detached git worktree of its revision (removed afterwards): a drift of the machine then
    hits both sides alike. A side named in ``folders`` is measured in that source tree as it stands, no
    worktree made (a copy without git history, as a GPU machine may receive). Returns each side's results in
    round order."""
    folders = folders or {}
    runs: dict[str, list[Any]] = {label: [] for label in revs}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        trees = {label: folders.get(label, Path(tmp) / label) for label in revs}
        made = [label for label in revs if label not in folders]
        try:
            for label in made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(trees[label]),
                                revs[label]], check=True, capture_output=True)
            for k in range(rounds):
                for label in (("before", "after") if k % 2 == 0 else ("after", "before")):
                    shown = str(folders[label]) if label in folders else revs[label][:10]
                    print(f"round {k + 1}/{rounds}: {label} ({shown})", file=sys.stderr, flush=True)
                    runs[label].append(measure(label, trees[label], k, Path(tmp)))
        finally:
            for label in made:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees[label])],
                               capture_output=True)
    return runs


def plot(result: dict[str, Any], path: Path) -> Path:
    """after / before per cell, each round's ratio a dot, the noise band shaded."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    rows = result["cells"]
    fig = Figure(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.5), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for i, r in enumerate(rows):
        ax.bar(i, r["ratio"], color={True: "tab:green", False: "tab:red", None: "tab:grey"}[r["within_noise"]], alpha=0.6)
        ax.fill_between([i - 0.4, i + 0.4], 1 - r["noise"], 1 + r["noise"], color="grey", alpha=0.2, linewidth=0)
        ax.plot([i] * len(r["after"]), [a / b for a, b in zip(r["after"], r["before"])], "k.", markersize=4)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['workload']}\n{r['loader']} w={r['num_workers']}" for r in rows], fontsize=7)
    ax.set_ylabel("samples/s, after / before (median of rounds)")
    ax.set_title(f"{result['before'][:10]} -> {result['after'][:10]}, {result['rounds']} interleaved rounds "
                 f"on {result['host']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="arguments after -- go to loader_compare.py unchanged")
    p.add_argument("--before", required=True, help="the revision to compare against (e.g. main~3)")
    p.add_argument("--after", default="HEAD", help="the revision under test (default HEAD)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the order flips every round")
    p.add_argument("--out", type=Path, default=None,
                   help="the JSON to write (default bench/results/<host>/interleave_compare.json)")
    p.add_argument("--note", default="", help="free text kept in the JSON (e.g. what else ran on the host)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.rounds < 1:
        print("interleave_compare: --rounds must be >= 1", file=sys.stderr)
        return 2
    if any(names_out_dir(arg) for arg in passthrough):
        print("interleave_compare: --out-dir is this script's to choose; use --out", file=sys.stderr)
        return 2
    revs = {"before": resolve(args.before), "after": resolve(args.after)}
    out = args.out or ROOT / "bench" / "results" / system.host_tag() / "interleave_compare.json"
    started = time.perf_counter()
    runs = interleaved(revs, args.rounds, lambda label, tree, k, tmp: run_once(
        tree, tmp / "out" / f"{label}-{k}", passthrough), prefix="interleave-")
    cells = summarize(runs)
    result = {"host": system.host_tag(), "before": revs["before"], "after": revs["after"], "rounds": args.rounds,
              "loader_compare_args": passthrough, "wall_s": time.perf_counter() - started, "note": args.note,
              "cells": cells, "all_within_noise": all(c["within_noise"] is True for c in cells)}
    report.write_json(result, out)
    print(report.table(["workload", "loader", "workers", "before", "after", "after/before", "noise", "within"],
                       [[c["workload"], c["loader"], c["num_workers"], round(statistics.median(c["before"])),
                         round(statistics.median(c["after"])), f"{c['ratio']:.3f}", f"{c['noise']:.1%}",
                         {True: "yes", False: "NO", None: "n/a"}[c["within_noise"]]] for c in cells],
                       title=f"{revs['before'][:10]} -> {revs['after'][:10]}, {args.rounds} interleaved rounds"))
    print(report.wrote(out, lambda png: plot(result, png)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
