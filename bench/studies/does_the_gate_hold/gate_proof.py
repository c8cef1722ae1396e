"""How often the throughput gate catches a planted slowdown, and how often it fails an unchanged rerun.

Runs the gate example of docs/ci-gate.md (the README's too) as a CI job would, on this machine as it is:
its ``bench/test_pipeline.py`` (its ``test_loader``) in a scratch project, one ``--nwt-save-baseline`` run,
then ``--runs`` CI runs (``--nwt-baseline ... --nwt-require-baseline --nwt-throughput-drop=LIMIT``) in
each of three groups: unchanged, and with a per-sample CPU slowdown of 10% and of 50% planted. The
slowdown is ``CUPY_NWT_PROOF_CPU_US`` (see ``planted.py``, the project's conftest): microseconds of CPU
burnt per sample in the dataset, set to the fraction of the baseline's own CPU per sample; the
unchanged group and the baseline run with ``0``, so every run takes the same code path. The groups'
runs are interleaved (unchanged, 10%, 50%, rotated each time), so a change in the machine's load
falls on all three alike.

A run is *caught* when the gate fails it (exit 1); an ``inconclusive`` verdict passes and so counts as
a miss. The targets: 0 of 20 unchanged runs fail, the 10% slowdown fails >= 18 of 20, the
50% slowdown 20 of 20. Each run's seconds, exit code and per-figure verdicts (re-judged from its
``--benchmark-json`` by the plugin's own rule) go to the JSON, with a plot beside it.

    python bench/studies/does_the_gate_hold/gate_proof.py                                    # the full proof (~20 min on 2 vCPUs)
    python bench/studies/does_the_gate_hold/gate_proof.py --runs 2 --dataset-n 512 --max-seconds 3 --out /tmp/gp.json   # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[3]  # the repository: bench/studies/<study>/ is three below
GROUPS = {"unchanged": 0.0, "slower 10%": 0.10, "slower 50%": 0.50}
TARGETS = {"unchanged": ("at most", 0), "slower 10%": ("at least", 18), "slower 50%": ("at least", 20)}


def example_file(dataset_n: int | None) -> str:
    """The gate page's ``bench/test_pipeline.py`` block, verbatim (the dataset's size swapped only if asked)."""
    text = (ROOT / "docs" / "ci-gate.md").read_text(encoding="utf-8")
    m = re.search(r"```python\n(# bench/test_pipeline\.py\n.*?)```", text, re.S)
    if m is None:
        raise SystemExit("docs/ci-gate.md has no ```python block starting with '# bench/test_pipeline.py'")
    body = m.group(1)
    if dataset_n is not None:
        body, n = re.subn(r"SyntheticCIFAR10\(n=\d+\)", f"SyntheticCIFAR10(n={dataset_n})", body)
        if n != 1:
            raise SystemExit("cannot find SyntheticCIFAR10(n=...) in the docs' example to resize")
    return body


def pytest_run(project: Path, args: list[str], cpu_us: float, env: dict[str, str]) -> tuple[int, float, str]:
    cmd = [sys.executable, "-m", "pytest", "bench/test_pipeline.py", "-k", "test_loader", "-p", "no:cacheprovider",
           *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env={**env, "CUPY_NWT_PROOF_CPU_US": f"{cpu_us:.3f}"},
                          capture_output=True, text=True)
    return proc.returncode, time.perf_counter() - t0, proc.stdout + proc.stderr


def verdicts(run_json: Path, baseline: Path, limit: float) -> dict[str, Any]:
    """Each figure's judgement of one run, by the plugin's own rule (what the run's gate decided)."""
    from cupy_nwt.pytest_plugin import compare_throughput, load_baseline  # noqa: PLC0415

    bench = json.loads(run_json.read_text())["benchmarks"][0]
    info = bench["extra_info"]
    out: dict[str, Any] = {"rounds": info.get("rounds"), "stopped": info.get("stopped"), "noise_pct": info.get("noise_pct"),
                           "cpu_cores": info.get("cpu_cores"), "others_cores": info.get("others_cores")}
    for c in compare_throughput({bench["fullname"]: info}, load_baseline(baseline), str(baseline)):
        j = c.judgement(limit)
        out[c.key] = {"verdict": j.verdict, "change_pct": j.change_pct, "low_pct": j.low_pct, "high_pct": j.high_pct,
                      "old": j.old, "new": j.new, "reason": j.reason}
    return out


def plot(doc: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for x, (name, group) in enumerate(doc["groups"].items()):
        for run in group["runs"]:
            cpu = run["figures"].get("cpu_s_per_1k", {})
            if "change_pct" in cpu:
                color = "tab:red" if run["exit_code"] == 1 else "tab:green"
                ax1.errorbar(x, cpu["change_pct"], yerr=[[cpu["change_pct"] - cpu["low_pct"]],
                                                         [cpu["high_pct"] - cpu["change_pct"]]],
                             fmt="o", color=color, alpha=0.6, capsize=2)
        ax2.plot([x] * len(group["runs"]), [r["seconds"] for r in group["runs"]], "o", alpha=0.6)
    names = list(doc["groups"])
    ax1.axhline(doc["limit_pct"], color="k", ls="--", lw=1, label=f"limit {doc['limit_pct']:g}%")
    ax1.set_xticks(range(len(names)), names)
    ax1.set_ylabel("CPU per 1,000 samples vs baseline, % (95% interval)")
    ax1.set_title("red: the gate failed the run; green: it passed")
    ax1.legend()
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("seconds per CI run (pytest, end to end)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="CI runs per group (default 20)")
    ap.add_argument("--limit", type=float, default=5.0, help="--nwt-throughput-drop, percent (default 5)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="--nwt-max-seconds for every run (default: the plugin's default, as the README runs it)")
    ap.add_argument("--dataset-n", type=int, default=None, help="resize the README's dataset (smoke tests only)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "vm-2cpu" / "gate_proof.json")
    args = ap.parse_args(argv)
    if args.runs < 1 or not 0 < args.limit < 100:
        ap.error("--runs must be >= 1 and --limit between 0 and 100")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    extra = [f"--nwt-max-seconds={args.max_seconds:g}"] if args.max_seconds else []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gate_proof_") as tmp:
        project = Path(tmp)
        (project / "bench").mkdir()
        (project / "bench/test_pipeline.py").write_text(example_file(args.dataset_n), encoding="utf-8")
        shutil.copyfile(HERE / "planted.py", project / "conftest.py")  # the slowdown, beside the verbatim example
        env.setdefault("CUPY_NWT_CACHE_DIR", str(project / "cache"))
        base = project / "bench/baseline.json"
        rc, secs, out = pytest_run(project, [f"--nwt-save-baseline={base}", *extra], 0.0, env)
        if rc != 0 or not base.is_file():
            print(out[-4000:], file=sys.stderr)
            raise SystemExit(f"the baseline run failed (exit {rc})")
        base_info = json.loads(base.read_text())["benchmarks"][0]["extra_info"]
        us_per_sample = 1000.0 * base_info["cpu_s_per_1k"]  # s per 1,000 samples -> us per sample
        planted = {name: frac * us_per_sample for name, frac in GROUPS.items()}
        print(f"baseline: {base_info['samples_per_s']:,.0f} samples/s, {us_per_sample:.1f} us CPU per sample, "
              f"{base_info['rounds']} rounds ({base_info['stopped']}), {secs:.1f} s", flush=True)
        groups: dict[str, dict[str, Any]] = {name: {"planted_cpu_us": planted[name], "runs": []} for name in GROUPS}
        names = list(GROUPS)
        for i in range(args.runs):
            for name in names[i % 3:] + names[:i % 3]:
                run_json = project / "run.json"
                rc, secs, out = pytest_run(project, [f"--nwt-baseline={base}", "--nwt-require-baseline",
                                                     f"--nwt-throughput-drop={args.limit:g}",
                                                     f"--benchmark-json={run_json}", *extra], planted[name], env)
                if rc not in (0, 1) or not run_json.is_file():
                    print(out[-4000:], file=sys.stderr)
                    raise SystemExit(f"run {i + 1} of {name!r} ended with exit {rc}, not the gate's 0 or 1")
                figures = verdicts(run_json, base, args.limit)
                groups[name]["runs"].append({"exit_code": rc, "seconds": secs, "figures": figures})
                cpu = figures.get("cpu_s_per_1k", {})
                print(f"{name:>11} run {i + 1:2}: exit {rc}, {secs:5.1f} s, CPU/1k {cpu.get('change_pct', 0):+6.1f}% "
                      f"({cpu.get('verdict')}), samples/s {figures.get('samples_per_s', {}).get('change_pct', 0):+6.1f}% "
                      f"({figures.get('samples_per_s', {}).get('verdict')})", flush=True)
    met = True
    for name, group in groups.items():
        failed = sum(r["exit_code"] == 1 for r in group["runs"])
        group["failed"] = failed
        group["inconclusive"] = sum(any(f.get("verdict") == "inconclusive" for f in r["figures"].values()
                                        if isinstance(f, dict)) and r["exit_code"] == 0 for r in group["runs"])
        group["seconds_median"] = sorted(r["seconds"] for r in group["runs"])[len(group["runs"]) // 2]
        how, n = TARGETS[name]
        scaled = n * args.runs / 20
        group["target"] = f"{how} {scaled:g} of {args.runs} fail"
        group["met"] = failed <= scaled if how == "at most" else failed >= scaled
        met &= group["met"]
    from cupy_nwt.picks.fingerprint import machine_fingerprint  # noqa: PLC0415

    doc = {
        "what": "README gate example: CI runs against one saved baseline, per-sample CPU slowdowns planted",
        "command": "pytest bench/test_pipeline.py -k test_loader --nwt-baseline=bench/baseline.json "
                   f"--nwt-require-baseline --nwt-throughput-drop={args.limit:g} {' '.join(extra)}".strip(),
        "machine": machine_fingerprint().to_dict(), "limit_pct": args.limit, "runs_per_group": args.runs,
        "dataset_n": args.dataset_n, "max_seconds": args.max_seconds, "baseline": {
            k: base_info.get(k) for k in ("samples_per_s", "cpu_s_per_1k", "cpu_cores", "others_cores", "rounds",
                                          "stopped", "noise_pct", "instructions_note")},
        "groups": groups, "all_targets_met": met, "total_seconds": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    png = args.out.with_suffix(".png")
    drawn = plot(doc, png)
    for name, group in groups.items():
        print(f"{name}: {group['failed']} of {args.runs} failed ({group['inconclusive']} passed as inconclusive), "
              f"target {group['target']}: {'met' if group['met'] else 'NOT met'}; median {group['seconds_median']:.1f} s a run")
    print(f"wrote {args.out}{' and ' + str(png) if drawn else ''} in {doc['total_seconds'] / 60:.1f} min")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
