"""What does a loader worker pay to import its own modules, beside torch, as a worker and as a plain import?

A forkserver or spawn worker imports the loader's worker package while multiprocessing unpickles its
process object, after the script's imports (torch); the package then freezes what exists out of the
garbage collector before its own imports. Each measurement is a fresh interpreter that imports
torch (unless ``--no-torch``) and then times ``import cupy_nwt.loader.workers.process_main``, once
marked as a worker being unpickled (``as_worker``, multiprocessing's own mark) and once not
(``plain``: what it cost before the freeze, and what the main process pays); the two alternate, and
the count of the package's modules imported is kept. Writes ``worker_import-<host>.json`` beside itself:

    PYTHONPATH=. python bench/studies/what_does_a_worker_start_cost/worker_import.py --repeats 7

``--tree`` imports an older commit's package instead (written to ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from cupy_nwt import system
from cupy_nwt.reporting import tables as report

HERE = Path(__file__).resolve().parent
CHILD = """
import json, sys, time
if {torch}:
    import torch  # the user's script's import
from multiprocessing import process
if {as_worker}:
    process.current_process()._inheriting = True  # as multiprocessing sets it while a worker is unpickled
t = time.perf_counter()
import cupy_nwt.loader.workers.process_main
print(json.dumps({{"seconds": time.perf_counter() - t,
                  "modules": sum(m.startswith("cupy_nwt") for m in sys.modules)}}))
"""


def once(as_worker: bool, torch: bool, tree: str | None = None) -> dict[str, Any]:
    code = CHILD.format(torch=torch, as_worker=as_worker)
    env = {**os.environ, **({"PYTHONPATH": tree} if tree else {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                         env=env, cwd=tree)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-torch", action="store_true", help="import nothing before the worker's modules")
    p.add_argument("--tree", help="a folder holding another cupy_nwt/ to import instead (an older commit's)")
    p.add_argument("--output", help="where to write the JSON (default: beside this file, named for the host)")
    args = p.parse_args(argv)
    if args.repeats < 1 or (args.tree and not (Path(args.tree) / "cupy_nwt").is_dir()):
        print("worker_import: --repeats must be >= 1 and --tree must hold a cupy_nwt/", file=sys.stderr)
        return 2
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "as_worker": []}
    for r in range(args.repeats):
        for name in (("plain", "as_worker") if r % 2 == 0 else ("as_worker", "plain")):
            runs[name].append(once(name == "as_worker", not args.no_torch, args.tree))
    summary = {name: {"median_s": statistics.median(x["seconds"] for x in rs), "min_s": min(x["seconds"] for x in rs),
                      "max_s": max(x["seconds"] for x in rs), "modules": rs[0]["modules"], "n": len(rs)}
               for name, rs in runs.items()}
    for name, s in summary.items():
        print(f"{name:9s} {s['median_s']:.3f} s ({s['min_s']:.3f}-{s['max_s']:.3f}), {s['modules']} modules")
    doc = {"host": system.host_tag(), "tree": args.tree or str(HERE.parents[2]), "torch": not args.no_torch, "repeats": args.repeats, "summary": summary,
           "runs": runs}
    out = Path(args.output) if args.output else HERE / f"worker_import-{system.host_tag()}.json"
    report.write_json(doc, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
