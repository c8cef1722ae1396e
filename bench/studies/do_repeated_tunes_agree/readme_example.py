"""Does the README's tuner example pick the same count when run again, or say that it cannot?

Runs the README's "Num Worker Tuner" code block ``--runs`` times (default 3), each in a fresh process
as a user would paste it, all sharing one pick store that starts empty (a private one: the machine's
store is left alone) and one dataset cache (the synthetic CIFAR-10 is built once, before the first
run, so no run pays for it). After each run it records the search's own pick, the pick in force in
the store (``result.save()`` keeps a saved pick unless the new one is faster beyond the
uncertainty), the trials' relative errors, and whether the run warned that its pick is unreliable
(``UnreliablePickWarning`` on stderr, or the result's ``warning``). ``--source DIR`` runs another
checkout of the package (e.g. the commit before a change), first on ``PYTHONPATH``.

Writes ``<host>/readme_example-<label>.json`` beside this script::

    .venv/bin/python bench/studies/do_repeated_tunes_agree/readme_example.py --label after
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cupy_nwt import system
from cupy_nwt.reporting import tables as report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MARK = "README-EXAMPLE-RESULT "

# Appended to the README's block: what the study reads back from the run (old and new results alike).
PROBE = """
import json as _json
import cupy_nwt as _pkg
_t = result.trials
print({mark!r} + _json.dumps({{
    "search_pick": result.best_workers,
    "rel_errors": [t.rel_error for t in _t],
    "counts": [t.workers for t in _t],
    "samples_per_second": [t.samples_per_second for t in _t],
    "warning": getattr(result, "warning", None),
    "search_seconds": result.search_seconds,
    "auto_workers": loader.num_workers,
    "package": _pkg.__file__,
}}), flush=True)
"""


def readme_block() -> str:
    """The README's tuner example, verbatim: the Python block under the "Num Worker Tuner" heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Num Worker Tuner", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    if m is None:
        raise SystemExit("readme_example: no Python block under '## Num Worker Tuner' in README.md")
    return m.group(1)


def run_once(code: str, env: dict[str, str], i: int, cwd: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    # run outside any checkout: "python -c" puts the working folder first on sys.path
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"readme_example: run {i} failed: {proc.stderr.strip()[-800:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(MARK))
    out = json.loads(line[len(MARK):])
    store = Path(env["CUPY_NWT_CACHE_DIR"]) / "num_workers.json"
    (record,) = json.loads(store.read_text())["results"].values()
    warned = "UnreliablePickWarning" in proc.stderr or bool(out["warning"])
    errs = [e for e in out["rel_errors"] if e is not None]
    out.update(run=i, in_force=record["best_workers"], warned=warned, wall_seconds=wall,
               rel_error_range=[min(errs), max(errs)] if errs else None,
               stderr_warning_lines=[ln for ln in proc.stderr.splitlines() if "nreliable" in ln])
    print(f"run {i}: search picked {out['search_pick']}, in force {out['in_force']}, "
          f"auto {out['auto_workers']}, warned {warned}, errors {out['rel_error_range']}, {wall:.0f} s",
          file=sys.stderr, flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs of the README example (default 3)")
    p.add_argument("--label", default="after", help="names the result file (default after)")
    p.add_argument("--source", type=Path, default=None, help="a checkout of cupy_nwt to run instead of this one")
    p.add_argument("--data-cache", type=Path, default=None,
                   help="where the synthetic CIFAR-10 is kept between invocations (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="folder (default <host>/ beside this script)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    cache = args.data_cache.resolve() if args.data_cache else Path(tempfile.mkdtemp(prefix="readme-example-"))
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "num_workers.json").unlink(missing_ok=True)  # every measurement starts with no saved pick
    source = str((args.source or ROOT).resolve())
    env = {**os.environ, "CUPY_NWT_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    build = "from cupy_nwt.data import SyntheticCIFAR10\nSyntheticCIFAR10()\n"
    subprocess.run([sys.executable, "-c", build], env=env, check=True, cwd=cache)
    block = readme_block()
    code = block + PROBE.format(mark=MARK)
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    runs = [run_once(code, env, i, cache) for i in range(1, args.runs + 1)]
    if any(not r["package"].startswith(source) for r in runs):
        raise SystemExit(f"readme_example: the runs imported {runs[0]['package']}, not the package in {source}")
    picks = [r["search_pick"] for r in runs]
    in_force = [r["in_force"] for r in runs]
    doc = {
        "question": "does the README's tuner example pick the same count when run again, or warn?",
        "config": {"label": args.label, "runs": args.runs, "source": source, "host_tag": system.host_tag(),
                   "readme_block": block},
        "host": system.host_info(),
        "runs": runs,
        "search_picks": picks,
        "in_force": in_force,
        "search_picks_agree": len(set(picks)) == 1,
        "in_force_agrees": len(set(in_force)) == 1,
        "disagreeing_runs_warned": all(r["warned"] for r in runs) if len(set(picks)) > 1 else None,
        "wall_seconds": time.perf_counter() - t0,
        "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
    }
    out = args.out or HERE / system.host_tag()
    path = report.write_json(doc, out / f"readme_example-{args.label}.json")
    print(f"search picks {picks}, in force {in_force}, warned {[r['warned'] for r in runs]}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
