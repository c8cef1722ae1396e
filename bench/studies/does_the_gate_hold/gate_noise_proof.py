"""The gate on a shared machine: unchanged reruns and planted slowdowns, a busy neighbour beside half.

A scratch git project holds a map-style dataset whose per-sample work is a NumPy loop (``STEPS``
steps times ``WORK``) and a ``loader_benchmark`` test with 2 workers; its committed ``WORK = 1.00`` is
the base revision. One ``--nwt-save-baseline`` run first, then CI runs as the README's gate section
writes them, each with the working tree's ``WORK`` set for its group:

* ``--mode main``: ``--runs`` runs unchanged and ``--runs`` at +10% per-sample work, alternating,
  each ``--nwt-baseline ... --nwt-require-baseline --nwt-throughput-drop=LIMIT --nwt-against=HEAD``:
  exact instructions judged against the stored baseline, wall clock and CPU judged against HEAD
  measured round for round in the same job;
* ``--mode instructions``: ``--runs`` runs at +2% per-sample work, instruction mode alone (no
  ``--nwt-against``), in a project of its own;
* ``--mode cpu``: ``--runs`` runs unchanged and ``--runs`` at +40% per-sample work with instructions
  off (``--nwt-instructions=off``, as on a runner without valgrind) and no ``--nwt-against``: what is
  left is CPU time against the stored baseline. The gate shows it and judges nothing, so no run of
  either group may fail; the proof records how far each group's CPU per sample moved (``cpu_change``),
  which is why it is not judged. ``--baseline-neighbour`` makes the baseline beside the neighbour too,
  so that both ways of the machine's drift are tried.

A neighbour (one process spinning on the CPU) runs beside every other run of each group. A run is
*caught* when the gate exits 1. Each run's verdicts are re-judged from its ``--benchmark-json`` by the
plugin's own code, and the JSON is rewritten after every run, so a stopped proof keeps what it had.
The machine's drift is the spread of the unchanged runs' samples/s over the proof.

    python bench/studies/does_the_gate_hold/gate_noise_proof.py --mode main --out bench/results/vm-2cpu/gate_noise_proof.json
    python bench/studies/does_the_gate_hold/gate_noise_proof.py --mode instructions --out bench/results/vm-2cpu/gate_noise_proof_instructions.json
    python bench/studies/does_the_gate_hold/gate_noise_proof.py --mode cpu --out bench/results/vm-2cpu/gate_noise_proof_cpu.json
    python bench/studies/does_the_gate_hold/gate_noise_proof.py --mode main --runs 1 --max-seconds 1 --out /tmp/p.json   # a smoke test
    python bench/studies/does_the_gate_hold/gate_noise_proof.py --merge A.json B.json ... --out SUMMARY.json   # streams run side by side

Several streams may run at once (each its own project); ``--merge`` adds up their groups, with each
run's stream named, and takes the drift over all their unchanged runs.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
sys.path.insert(0, str(ROOT))
from bench.workloads import MODES, PIPELINE, PLANTED, PLANTED_TEST, PLANTS, TEST, pipeline_source  # noqa: E402, F401

#: "slower 40%" runs only in --mode cpu, where nothing is judged: it must not fail either
TARGETS = {"unchanged": ("at most", 0), "slower 10%": ("at least", 19), "slower 2%": ("at least", 20),
           "slower 40%": ("at most", 0), **{p: ("at least", 19) for p in PLANTS}}
CPU_STORED = "cpu_s_per_1k (stored)"


def project(where: Path, mode: str = "main", batches: int = 12, count: int = 64) -> Path:
    (where / "bench").mkdir(parents=True)
    (where / "pipeline.py").write_text(pipeline_source(mode, "none" if mode == "plants" else 1.0))
    (where / "bench" / "test_pipeline.py").write_text(
        PLANTED_TEST.format(batches=batches, count=count) if mode == "plants" else TEST)
    (where / "conftest.py").write_text("")
    git = ["git", "-C", str(where), "-c", "user.email=proof@cupy-nwt", "-c", "user.name=proof"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    return where


def pytest_run(where: Path, args: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    cmd = [sys.executable, "-m", "pytest", "bench/test_pipeline.py", "-p", "no:cacheprovider", "-q", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True)
    return proc.returncode, time.perf_counter() - t0, proc.stdout + proc.stderr


def figures(run_json: Path, baseline: Path, limit: float) -> dict[str, Any]:
    """Each figure's judgement, by the plugin's own rule, and the run's own figures."""
    from cupy_nwt.pytest_plugin import compare_throughput, load_baseline  # noqa: PLC0415
    from cupy_nwt.pytest_plugin._gate import compare_against  # noqa: PLC0415
    from cupy_nwt.pytest_plugin._options import DEFAULT_INSTRUCTIONS_DROP_PCT  # noqa: PLC0415

    bench = json.loads(run_json.read_text())["benchmarks"][0]
    info = bench["extra_info"]
    out: dict[str, Any] = {k: info.get(k) for k in ("samples_per_s", "cpu_s_per_1k", "instructions_per_sample",
                                                    "cost_per_sample", "cost_components", "native_cpu_s_per_1k",
                                                    "count_seconds", "rounds", "cpu_cores", "others_cores")}
    current = {bench["fullname"]: info}
    judged = [("same job", c) for c in compare_against(current, DEFAULT_INSTRUCTIONS_DROP_PCT)]
    judged += [("stored", c) for c in compare_throughput(current, load_baseline(baseline), str(baseline),
                                                         DEFAULT_INSTRUCTIONS_DROP_PCT)]
    for where, c in judged:
        j = c.judgement(limit)
        out[f"{c.key} ({where})"] = {"verdict": j.verdict, "change_pct": j.change_pct, "low_pct": j.low_pct,
                                     "high_pct": j.high_pct, "limit_pct": c.limit(limit)}
        if j.verdict == "regressed":
            out.setdefault("caught_by", []).append(f"{c.key} ({where})")
    return out


def spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def summary(doc: dict[str, Any]) -> None:
    for name, group in doc["groups"].items():
        runs = group["runs"]
        group["failed"] = sum(r["exit_code"] == 1 for r in runs)
        how, n = TARGETS[name]
        planned = doc["runs_per_group"] or len(runs)  # merged streams: the runs there are
        scaled = n * planned / 20
        group["target"] = f"{how} {scaled:g} of {planned} fail"
        group["met"] = (group["failed"] <= scaled if how == "at most" else group["failed"] >= scaled) and \
            len(runs) >= planned
        cpu = sorted(r["figures"][CPU_STORED]["change_pct"] for r in runs
                     if isinstance(r["figures"].get(CPU_STORED), dict))
        if cpu:
            group["cpu_change"] = {"what": "CPU per sample against the stored baseline, percent, each run's change",
                                   "min": cpu[0], "median": statistics.median(cpu), "max": cpu[-1]}
        caught: dict[str, int] = {}
        for r in runs:
            for key in r["figures"].get("caught_by", []):
                caught[key] = caught.get(key, 0) + 1
        group["caught_by"] = caught
        secs = sorted(r["seconds"] for r in runs if "seconds" in r)
        if secs:
            group["seconds_a_run"] = {"min": secs[0], "median": statistics.median(secs), "max": secs[-1]}
        for key in {k for r in runs for k, v in r["figures"].items() if isinstance(v, dict) and "verdict" in v}:
            group.setdefault("by_figure", {})[key] = {
                v: sum(r["figures"].get(key, {}).get("verdict") == v for r in runs)
                for v in ("regressed", "inconclusive", "ok", "reported")}
    unchanged = [r["figures"]["samples_per_s"] for r in doc["groups"].get("unchanged", {}).get("runs", [])
                 if r["figures"].get("samples_per_s")]
    if len(unchanged) >= 2:
        med = statistics.median(unchanged)
        doc["drift"] = {"what": "samples/s of the unchanged runs (median of each run's rounds) over the proof",
                        "min": min(unchanged), "median": med, "max": max(unchanged),
                        "spread_pct": 100.0 * (max(unchanged) - min(unchanged)) / med,
                        "baseline_samples_per_s": doc["baseline"].get("samples_per_s")}
    doc["hours"] = (time.time() - doc["started_unix"]) / 3600.0


def merge(paths: list[Path], out: Path) -> int:
    """One summary of several streams' files: their runs by group, targets counted over all of them."""
    from cupy_nwt.reporting.tables import write_json  # noqa: PLC0415

    docs = {p.name: json.loads(p.read_text()) for p in paths}
    first = next(iter(docs.values()))
    total: dict[str, Any] = {
        "what": "several gate_noise_proof streams run side by side on the shared machine, added up",
        "streams": {name: {k: d.get(k) for k in ("command", "started", "hours", "baseline", "baseline_seconds")}
                    for name, d in docs.items()},
        "machine": first["machine"], "limit_pct": first["limit_pct"], "load_note": first["load_note"],
        "started_unix": min(d["started_unix"] for d in docs.values()), "baseline": first["baseline"], "groups": {},
    }
    for name, d in docs.items():
        for group, g in d["groups"].items():
            into = total["groups"].setdefault(group, {"work": g["work"], "runs": []})
            into["runs"] += [{**r, "stream": name} for r in g["runs"]]
    total["runs_per_group"] = None
    summary(total)
    ended = max(d["started_unix"] + 3600.0 * d.get("hours", 0.0) for d in docs.values())
    total["hours"] = (ended - total["started_unix"]) / 3600.0
    for group in total["groups"].values():
        group["runs_done"] = len(group["runs"])
    write_json(total, out)
    for name, group in total["groups"].items():
        print(f"{name}: {group['failed']} of {group['runs_done']} failed; target {group['target']}: "
              f"{'met' if group['met'] else 'NOT met'}")
        if "cpu_change" in group:
            c = group["cpu_change"]
            print(f"{name}: CPU per sample against the stored baseline {c['min']:+.1f}% .. {c['max']:+.1f}%")
    if "drift" in total:
        print(f"drift: unchanged runs' samples/s {total['drift']['min']:,.0f} .. {total['drift']['max']:,.0f} "
              f"({total['drift']['spread_pct']:.0f}% of the median) over {total['hours']:.2f} h")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=sorted(MODES), default="main")
    ap.add_argument("--runs", type=int, default=20, help="runs per group (default 20)")
    ap.add_argument("--limit", type=float, default=5.0, help="--nwt-throughput-drop, percent (default 5)")
    ap.add_argument("--max-seconds", type=float, default=5.0, help="--nwt-max-seconds (default 5)")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between runs, to spread the proof out")
    ap.add_argument("--offset", type=int, default=0,
                    help="start the rotation of groups (and of the neighbour) here: streams side by side given "
                         "different offsets run different groups first, and an odd one flips which runs have the neighbour")
    ap.add_argument("--baseline-neighbour", action="store_true", help="make the baseline beside the neighbour")
    ap.add_argument("--batches", type=int, default=12, help="--mode plants: timed batches a run (6 rounds)")
    ap.add_argument("--count-samples", type=int, default=128, help="--mode plants: samples counted a run")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON", help="add up streams' files")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.runs < 1 or not 0 < args.limit < 100:
        ap.error("--runs must be >= 1 and --limit between 0 and 100")
    from cupy_nwt.picks.fingerprint import machine_fingerprint  # noqa: PLC0415
    from cupy_nwt.reporting.tables import write_json  # noqa: PLC0415

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    groups = MODES[args.mode]
    gate = [f"--nwt-throughput-drop={args.limit:g}", f"--nwt-max-seconds={args.max_seconds:g}"]
    if args.mode == "main":
        gate.append("--nwt-against=HEAD")
    if args.mode == "cpu":
        gate.append("--nwt-instructions=off")
    with tempfile.TemporaryDirectory(prefix="gate_noise_proof_") as tmp:
        where = project(Path(tmp) / "project", args.mode, args.batches, args.count_samples)
        base = where / "bench" / "baseline.json"
        neighbour = spin() if args.baseline_neighbour else None
        try:
            rc, secs, out = pytest_run(where, [f"--nwt-save-baseline={base}", f"--nwt-max-seconds={args.max_seconds:g}",
                                               *(["--nwt-instructions=off"] if args.mode == "cpu" else [])], env)
        finally:
            if neighbour is not None:
                neighbour.kill()
                neighbour.wait()
        if rc != 0 or not base.is_file():
            print(out[-4000:], file=sys.stderr)
            raise SystemExit(f"the baseline run failed (exit {rc})")
        base_info = json.loads(base.read_text())["benchmarks"][0]["extra_info"]
        doc: dict[str, Any] = {
            "what": f"gate runs on a shared machine ({args.mode}): planted per-sample work, a neighbour beside half",
            "command": "python -m pytest bench/test_pipeline.py --nwt-baseline=bench/baseline.json "
                       f"--nwt-require-baseline {' '.join(gate)}",
            "machine": machine_fingerprint().to_dict(), "limit_pct": args.limit, "runs_per_group": args.runs,
            "max_seconds": args.max_seconds, "offset": args.offset, "started_unix": time.time(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_note": "the host is shared with other sessions' builds and tests: their load is the real noise",
            "baseline": {k: base_info.get(k) for k in ("samples_per_s", "cpu_s_per_1k", "instructions_per_sample",
                                                       "cost_per_sample", "cost_components", "native_cpu_s_per_1k",
                                                       "instructions_counted_by", "count_seconds", "rounds")},
            "baseline_seconds": secs, "baseline_neighbour": args.baseline_neighbour, "groups": {name: {"work": w, "runs": []} for name, w in groups.items()},
        }
        print(f"baseline: {base_info['samples_per_s']:,.0f} samples/s, {base_info.get('instructions_per_sample')} "
              f"instructions/sample, {secs:.0f} s", flush=True)
        names = list(groups)
        for i in range(args.offset, args.offset + args.runs):
            for g, name in enumerate(names[i % len(names):] + names[:i % len(names)]):
                (where / "pipeline.py").write_text(pipeline_source(args.mode, groups[name]))
                neighbour = spin() if (i + names.index(name)) % 2 == 0 else None
                try:
                    run_json = where / "run.json"
                    run_json.unlink(missing_ok=True)
                    load = os.getloadavg()[0]
                    rc, secs, out = pytest_run(where, [f"--nwt-baseline={base}", "--nwt-require-baseline", *gate,
                                                       f"--benchmark-json={run_json}"], env)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
                if rc not in (0, 1) or not run_json.is_file():
                    doc["groups"][name].setdefault("errors", []).append({"exit_code": rc, "tail": out[-1500:]})
                    print(f"{name} run {i + 1}: exit {rc}, not the gate's 0 or 1:\n{out[-1500:]}", flush=True)
                else:
                    figs = figures(run_json, base, args.limit)
                    doc["groups"][name]["runs"].append({
                        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "neighbour": neighbour is not None,
                        "load_1min": load, "exit_code": rc, "seconds": secs, "figures": figs})
                    short = {k: f"{v['change_pct']:+.1f}% {v['verdict']}"
                             for k, v in figs.items() if isinstance(v, dict) and "verdict" in v}
                    print(f"{name:>11} run {i + 1:2} ({'neighbour' if neighbour else 'alone'}): exit {rc}, {secs:.0f} s, "
                          f"{short}", flush=True)
                summary(doc)
                write_json(doc, args.out)
                if args.pause:
                    time.sleep(args.pause)
    summary(doc)
    write_json(doc, args.out)
    for name, group in doc["groups"].items():
        print(f"{name}: {group['failed']} of {len(group['runs'])} failed; target {group['target']}: "
              f"{'met' if group['met'] else 'NOT met'}")
        if "cpu_change" in group:
            c = group["cpu_change"]
            print(f"{name}: CPU per sample against the stored baseline {c['min']:+.1f}% .. {c['max']:+.1f}% "
                  f"(median {c['median']:+.1f}%)")
    if "drift" in doc:
        print(f"drift: unchanged runs' samples/s {doc['drift']['min']:,.0f} .. {doc['drift']['max']:,.0f} "
              f"({doc['drift']['spread_pct']:.0f}% of the median) over {doc['hours']:.2f} h")
    return 0 if all(g["met"] for g in doc["groups"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
