"""Where an epoch of JAX's tutorial waits: each process's time ready to run but not running, per batch.

Runs the tutorial's loader and jitted step (``jax_tutorial.py``, imported with no epochs of its own) with
each loader in fresh interpreters, rounds alternating the order, and around every ``next()`` reads the
kernel's per-thread scheduler counters (``/proc/<pid>/task/<tid>/schedstat``: time on a CPU, time
waiting in a run queue) and the CPU each thread last ran on (``stat``'s field 39) for the parent's main
thread and each worker's. Per loader it reports the run-queue wait per batch of the parent and of the
workers, their CPU time per batch, and the share of batches where the parent and every worker had last
run on one CPU: the signature of a wake-up that places the woken process beside its waker.
``--base-rev`` adds ``cupy_nwt@REV``, the package as committed at REV, run from ``git archive``.

    python bench/studies/does_the_jax_tutorial_keep_pace/cpu_waits.py --rounds 2 --out cpu_waits.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import runpy
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LOADERS = ("cupy_nwt", "torch")
SPIN = "while True: pass"


@contextlib.contextmanager
def neighbours(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` processes spinning, each in a session of its own, for the ``with`` block: other users' load on a
    shared machine (where the kernel groups tasks by session, each competes with a whole run as one group)."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user and system) the live processes ``pids`` have used so far."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
        except (OSError, ValueError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def variant_env(name: str, bases: dict[str, Path]) -> dict[str, str]:
    """The environment a run of loader ``name`` gets: ``cupy_nwt@REV`` imports the package from REV's tree."""
    env = {**os.environ, "LOADER": "torch" if name == "torch" else "cupy_nwt"}
    if name in bases:
        env["PYTHONPATH"] = os.pathsep.join([str(bases[name]), env.get("PYTHONPATH", "")])
    return env


def resolve(rev: str) -> str:
    """The commit ``rev`` names now (a branch moves: the result records what was measured)."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", rev], capture_output=True, text=True,
                          check=True).stdout.strip()


def export_rev(rev: str, into: Path) -> Path:
    """``cupy_nwt`` as committed at ``rev``, unpacked under ``into`` (for ``PYTHONPATH``)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cupy_nwt"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    for tid in _threads(pid):
        try:
            kids.update(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
        except OSError:
            pass
    return kids


def _sched(pid: int, tid: int) -> tuple[int, int, int] | None:
    """(ns on a CPU, ns waiting for one, the CPU it last ran on) of thread ``tid``, or None once it is gone."""
    try:
        run, wait, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return int(run), int(wait), int(stat[stat.rindex(")") + 2:].split()[36])


def _process(pid: int) -> tuple[int, int, int]:
    """(ns on a CPU, ns waiting for one, turns on a CPU) of all of process ``pid``'s threads."""
    total = [0, 0, 0]
    for tid in _threads(pid):
        try:
            for i, v in enumerate(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()):
                total[i] += int(v)
        except (OSError, ValueError):
            pass
    return total[0], total[1], total[2]


def child(loader: str, epochs: int) -> dict[str, object]:
    """One run: ``epochs`` epochs of the tutorial's loop, sampled around each ``next()``."""
    os.environ["EPOCHS"] = "0"
    tut = runpy.run_path(str(HERE / "jax_tutorial.py"), run_name="jax_tutorial")
    loader_obj, update, one_hot, params = tut["training_generator"], tut["update"], tut["one_hot"], tut["params"]
    me = os.getpid()
    rows: list[dict[str, float | int]] = []
    epoch_s, first_s = [], []
    for epoch in range(epochs):
        before = _children(me)
        start = time.perf_counter()
        it = iter(loader_obj)
        workers: list[int] = []
        last: dict[int, tuple[int, int, int]] = {}
        last_procs: dict[int, tuple[int, int, int]] = {}
        while True:
            try:
                x, y = next(it)
            except StopIteration:
                break
            if not workers:
                first_s.append(time.perf_counter() - start)
                workers = sorted(_children(me) - before)
            now = {p: s for p in (me, *workers) if (s := _sched(p, p)) is not None}
            procs = {p: _process(p) for p in (me, *workers)}
            if epoch > 0 and last and len(now) == len(workers) + 1 and now.keys() == last.keys():
                rows.append({"parent_wait_ms": (now[me][1] - last[me][1]) / 1e6,
                             "parent_cpu_ms": (now[me][0] - last[me][0]) / 1e6,
                             "worker_wait_ms": statistics.mean((now[p][1] - last[p][1]) / 1e6 for p in workers),
                             "worker_cpu_ms": statistics.mean((now[p][0] - last[p][0]) / 1e6 for p in workers),
                             "one_cpu": int(len({s[2] for s in now.values()}) == 1),
                             **{f"{who}_all_{what}": sum(procs[p][i] - last_procs[p][i] for p in pids) / scale
                                for who, pids in (("parent", [me]), ("workers", workers))
                                for i, what, scale in ((0, "cpu_ms", 1e6), (1, "wait_ms", 1e6), (2, "turns", 1))}})
            last, last_procs = now, procs
            params = update(params, x, one_hot(y, 10))
        epoch_s.append(time.perf_counter() - start)
    return {"epoch_s": epoch_s, "first_batch_s": first_s, "batches": rows}


def epoch_share(run: dict[str, object], cpus: int) -> float:
    """The share of the machine's CPU time a run's processes took over its measured epochs (the first left
    out): the CPU of its measured batches, parent and workers, over those epochs' seconds on ``cpus`` CPUs.
    The first batch of each epoch is not measured, so the share is a little low."""
    rows: Any = run["batches"]
    epochs: Any = run["epoch_s"]
    cpu_s = sum(r["parent_all_cpu_ms"] + r["workers_all_cpu_ms"] for r in rows) / 1000
    return cpu_s / (sum(epochs[1:]) * cpus)


def read_result(ap: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """A result file written before, as a dict, or one line on ``ap`` saying why it cannot be one."""
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        ap.error(f"--summarize {path}: no such result file")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        ap.error(f"--summarize {path}: not readable as JSON ({e})")
    if not isinstance(result, dict):
        ap.error(f"--summarize {path}: not a result file (a JSON object)")
    return result


def summarize(rows: list[dict[str, float | int]]) -> dict[str, float]:
    """Medians per batch and the share of batches on one CPU."""
    out = {key: statistics.median(r[key] for r in rows)
           for key in ("parent_wait_ms", "parent_cpu_ms", "worker_wait_ms", "worker_cpu_ms")}
    out.update({f"{key}_mean": statistics.mean(r[key] for r in rows)
                for key in rows[0] if "_all_" in str(key)})
    out["worker_wait_mean_ms"] = statistics.mean(r["worker_wait_ms"] for r in rows)
    out["one_cpu_share"] = statistics.mean(r["one_cpu"] for r in rows)
    out["batches"] = len(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="per run; the first is left out (it compiles)")
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--base-rev", help="also measure cupy_nwt as committed at this revision")
    ap.add_argument("--sessions", type=int, default=0,
                    help="spinning neighbours beside every round, each in a session of its own")
    ap.add_argument("--out", type=Path, default=HERE / "cpu_waits.json")
    ap.add_argument("--summarize", type=Path, help="add the epochs' machine shares to a result file written before")
    ap.add_argument("--child", choices=LOADERS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.summarize is not None:
        result = read_result(ap, args.summarize)
        try:
            cpus = int(result["conditions"]["cpus"])
            shares = {n: [epoch_share(run, cpus) for run in rs] for n, rs in result["runs"].items()}
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            ap.error(f"--summarize {args.summarize}: not a result file of this script ({type(e).__name__}: {e})")
        result["machine_share_in_epochs"] = shares
        args.summarize.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result["machine_share_in_epochs"]))
        return 0
    if args.child is not None:
        print(json.dumps(child(args.child, args.epochs)))
        return 0
    if args.epochs < 2:
        ap.error("--epochs must be >= 2")
    names = [*LOADERS[:1], *([f"cupy_nwt@{args.base_rev}"] if args.base_rev else []), *LOADERS[1:]]
    bases = ({names[1]: export_rev(args.base_rev, Path(f"/tmp/cupy_nwt-{args.base_rev}-{os.getpid()}"))}
             if args.base_rev else {})
    runs: dict[str, list[dict[str, object]]] = {n: [] for n in names}
    with neighbours(args.sessions):
        measure(args, names, bases, runs)
    result = {
        "question": "does an epoch of JAX's tutorial wait for CPUs longer with cupy_nwt's workers than with torch's?",
        "command": "python bench/studies/does_the_jax_tutorial_keep_pace/cpu_waits.py "
                   f"--rounds {args.rounds} --epochs {args.epochs} --n-train {args.n_train}"
                   + (f" --base-rev {args.base_rev}" if args.base_rev else "")
                   + (f" --sessions {args.sessions}" if args.sessions else ""),
        "base_commit": resolve(args.base_rev) if args.base_rev else None,
        "conditions": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                       "batch_size": 128, "num_workers": 2,
                       "other_sessions_spinning": args.sessions,
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "summary": {n: summarize([b for run in rs for b in run["batches"]]) for n, rs in runs.items()},
        "machine_share_in_epochs": {n: [epoch_share(run, os.cpu_count() or 1) for run in rs] for n, rs in runs.items()},
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


def measure(args: argparse.Namespace, names: list[str], bases: dict[str, Path],
            runs: dict[str, list[dict[str, object]]]) -> None:
    """Each round: a run of every loader in a fresh interpreter, the order alternating."""
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            env = {**variant_env(name, bases), "N_TRAIN": str(args.n_train), "N_TEST": "2000"}
            load = os.getloadavg()[0]
            proc = subprocess.run([sys.executable, __file__, "--child", env["LOADER"], "--epochs", str(args.epochs)],
                                  capture_output=True, text=True, env=env, timeout=900, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
            run = json.loads(proc.stdout.strip().splitlines()[-1])
            run["load_avg_1min"] = [load, os.getloadavg()[0]]
            runs[name].append(run)
            print(name, [round(e, 2) for e in run["epoch_s"]], [round(e, 2) for e in run["first_batch_s"]],
                  summarize(run["batches"]), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
