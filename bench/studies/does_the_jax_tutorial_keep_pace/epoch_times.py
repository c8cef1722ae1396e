"""Epoch times of JAX's tutorial (``jax_tutorial.py``) with cupy_nwt's DataLoader and with torch's, interleaved.

Each round runs the tutorial once per loader, in fresh interpreters, in alternating order; each run's
"Epoch e in s sec" lines are its epoch times (worker start included: the tutorial's loader has no
persistent workers). ``--base-rev REV`` adds ``cupy_nwt@REV``, the package as committed at REV (from
``git archive``, first on ``PYTHONPATH``); ``--busy`` puts a busy neighbour (a process spinning at
nice 0) beside every other round, in this session or (``--busy-session``) in a session of its own: where
the kernel groups tasks by session (autogroup), a neighbour in another session competes with the
whole run as one group, as another user's work would. ``--sessions N`` runs N such neighbours, each in a
session of its own, beside every round: the load other users put on a shared machine, made on purpose.
With neighbours, each run's share of the machine's CPU time is recorded, and each neighbour's
over the same seconds. ``--loading-only`` leaves the training step out (each epoch only iterates the
loader); ``--cpus 0`` confines the tutorial and its workers to CPU 0 (the neighbours stay free): what
each loader makes of one CPU's share, against what it makes of the machine's. Writes the per-run
times, each run's load average, and ``summarize``'s figures, overall and by round kind.

    python bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py --rounds 3 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_waits import SPIN, cpu_seconds, export_rev, neighbours, read_result, resolve, variant_env

HERE = Path(__file__).resolve().parent
LOADERS = ("cupy_nwt", "torch")


def run_once(loader: str, epochs: int, n_train: int, bases: dict[str, Path] | None = None,
             cpus: set[int] | None = None, step: bool = True) -> list[float]:
    """One run of the tutorial (and its workers) in a fresh interpreter, on ``cpus`` only if given; without
    ``step`` its epochs only iterate the loader."""
    env = {**variant_env(loader, bases or {}), "EPOCHS": str(epochs), "N_TRAIN": str(n_train), "N_TEST": "2000",
           **({} if step else {"STEP": "none"})}
    confine = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run([sys.executable, str(HERE / "jax_tutorial.py")], capture_output=True, text=True, env=env,
                          timeout=900, check=False, preexec_fn=confine)
    if proc.returncode != 0:
        raise SystemExit(f"the tutorial with {loader}'s loader failed: {proc.stderr[-2000:]}")
    return [float(s) for s in re.findall(r"^Epoch \d+ in ([\d.]+) sec$", proc.stdout, re.M)]


def summarize(runs: dict[str, list[list[float]]]) -> dict[str, object]:
    """Each loader's median over runs of a run's median epoch, epoch 0 left out where a run has more (it
    also compiles the tutorial's jitted step), the min-max of those run medians, and the ratio."""
    medians = {name: [statistics.median(t[1:] if len(t) > 1 else t) for t in times] for name, times in runs.items()}
    summary = {name: {"median_epoch_s": statistics.median(m), "interval_s": [min(m), max(m)],
                      "first_epoch_median_s": statistics.median(t[0] for t in runs[name])}
               for name, m in medians.items()}
    ratios = {f"ratio_{name}_over_torch": statistics.median(m) / statistics.median(medians["torch"])
              for name, m in medians.items() if name != "torch"}
    return {"summary": summary, **ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=60000)
    ap.add_argument("--out", type=Path, default=HERE / "epoch_times.json")
    ap.add_argument("--base-rev", help="also run cupy_nwt as committed at this revision")
    ap.add_argument("--busy", action="store_true", help="a spinning neighbour beside every other round")
    ap.add_argument("--busy-session", action="store_true", help="the neighbour in a session of its own")
    ap.add_argument("--sessions", type=int, default=0,
                    help="spinning neighbours beside every round, each in a session of its own")
    ap.add_argument("--cpus", help="run the tutorial on these CPUs only (as taskset -c takes them: 0 or 0,1); "
                    "the neighbours stay free")
    ap.add_argument("--loading-only", action="store_true",
                    help="epochs that only iterate the loader (no training step): the loader's part alone")
    ap.add_argument("--summarize", type=Path, help="recompute the summary of a result file written before")
    args = ap.parse_args(argv)
    if args.rounds < 3 or args.epochs < 1 or args.n_train < 128 or args.sessions < 0:
        ap.error("--rounds must be >= 3, --epochs >= 1, --n-train >= 128, --sessions >= 0")
    cpus = parse_cpus(ap, args.cpus)
    if args.summarize is not None:
        result = read_result(ap, args.summarize)
        try:
            result.update(summarize(result["epoch_s"]))
        except (KeyError, TypeError, ValueError, statistics.StatisticsError) as e:
            ap.error(f"--summarize {args.summarize}: not a result file of this script ({type(e).__name__}: {e})")
        args.out = args.summarize
    else:
        names = [LOADERS[0], *([f"cupy_nwt@{args.base_rev}"] if args.base_rev else []), LOADERS[1]]
        bases = ({names[1]: export_rev(args.base_rev, Path(f"/tmp/cupy_nwt-{args.base_rev}-{os.getpid()}"))}
                 if args.base_rev else {})
        runs: dict[str, list[list[float]]] = {name: [] for name in names}
        loads: dict[str, list[list[float]]] = {name: [] for name in names}
        shares: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        busy_rounds = [args.busy and r % 2 == 1 for r in range(args.rounds)]
        with neighbours(args.sessions) as others:
            rounds(args, names, bases, runs, loads, busy_rounds, cpus, others, shares)
        by_kind = {kind: summarize({n: [t for t, b in zip(times, busy_rounds) if b == want]
                                    for n, times in runs.items()})
                   for kind, want in (("quiet", False), ("busy", True)) if want in busy_rounds}
        result = {
            "question": "are the JAX tutorial's epochs with cupy_nwt's DataLoader no slower than with torch's?",
            "command": "python bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py "
                       f"--rounds {args.rounds} --epochs {args.epochs} --n-train {args.n_train}"
                       + (f" --base-rev {args.base_rev}" if args.base_rev else "") + (" --busy" if args.busy else "")
                       + (" --busy-session" if args.busy_session else "")
                       + (f" --sessions {args.sessions}" if args.sessions else "")
                       + (f" --cpus {args.cpus}" if args.cpus else "")
                       + (" --loading-only" if args.loading_only else ""),
            "conditions": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                           "batch_size": 128, "num_workers": 2, "n_train": args.n_train, "epochs": args.epochs,
                           "other_sessions_spinning": args.sessions,
                           "tutorial_cpus": sorted(cpus) if cpus else None, "training_step": not args.loading_only,
                           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "base_commit": resolve(args.base_rev) if args.base_rev else None,
            "epoch_s": runs,
            "load_avg_1min_before_after": loads,
            "busy_rounds": busy_rounds,
            **({"machine_share": summarize_shares(shares, args.sessions)} if args.sessions else {}),
            **summarize(runs),
            **({"by_round_kind": by_kind} if args.busy else {}),
        }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.startswith(("summary", "ratio", "by_round"))}, indent=1))
    if "machine_share" in result:
        print(json.dumps({n: {k: v for k, v in s.items() if k != "runs"} for n, s in result["machine_share"].items()}))
    return 0


def parse_cpus(ap: argparse.ArgumentParser, text: str | None) -> set[int] | None:
    """``--cpus``: a comma-separated list of CPUs this process may use, or None."""
    if text is None:
        return None
    try:
        cpus = {int(c) for c in text.split(",")}
    except ValueError:
        ap.error(f"--cpus takes CPU numbers separated by commas, not {text!r}")
    if not cpus <= os.sched_getaffinity(0):
        ap.error(f"--cpus {text}: this process may use CPUs {sorted(os.sched_getaffinity(0))} only")
    return cpus


def summarize_shares(shares: dict[str, list[dict[str, float]]], sessions: int) -> dict[str, dict[str, object]]:
    """Each loader's median share of the machine over its runs, and each neighbour's beside it; a session's
    fair share is 1 / (sessions + 1) where every session has work for every CPU."""
    return {name: {"run_median": statistics.median(s["run"] for s in runs),
                   "each_neighbour_median": statistics.median(s["each_neighbour"] for s in runs),
                   "fair_share_per_session": 1 / (sessions + 1), "runs": runs}
            for name, runs in shares.items() if runs}


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (a run and the workers it waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rounds(args: argparse.Namespace, names: list[str], bases: dict[str, Path], runs: dict[str, list[list[float]]],
           loads: dict[str, list[list[float]]], busy_rounds: list[bool], cpus: set[int] | None = None,
           others: list[subprocess.Popen] | None = None, shares: dict[str, list[dict[str, float]]] | None = None) -> None:
    """Each round: every loader's run, the order alternating, a neighbour beside the busy rounds. With
    ``others`` (the neighbours in sessions of their own), ``shares`` gets each run's share of the machine's
    CPU time and each neighbour's over the same seconds."""
    machine = len(os.sched_getaffinity(0))
    for r in range(args.rounds):
        spinner = (subprocess.Popen(["nice", "-n", "0", sys.executable, "-c", SPIN],
                                    start_new_session=args.busy_session) if busy_rounds[r] else None)
        try:
            for name in (names if (r // 2 if args.busy else r) % 2 == 0 else names[::-1]):
                before = os.getloadavg()[0]
                t0, own0, near0 = time.perf_counter(), _children_cpu(), cpu_seconds(p.pid for p in others or ())
                runs[name].append(run_once(name, args.epochs, args.n_train, bases, cpus, not args.loading_only))
                wall = time.perf_counter() - t0
                if others and shares is not None:
                    near = cpu_seconds(p.pid for p in others) - near0
                    shares[name].append({"run": (_children_cpu() - own0) / (wall * machine),
                                         "each_neighbour": near / len(others) / (wall * machine)})
                loads[name].append([before, os.getloadavg()[0]])
                print(name, "busy" if busy_rounds[r] else "", runs[name][-1], loads[name][-1], flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()


if __name__ == "__main__":
    raise SystemExit(main())
