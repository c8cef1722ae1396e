"""Does the kernel give a session of briefly sleeping processes more than its share of a busy machine?

The tutorial's study found torch's loader taking more of the CPUs than its session's share beside other
sessions, and this loader its share. The suspected cause is the kernel's, not either loader's: a session's
group is weighed on each CPU by the load its tasks put there, and tasks that run briefly and sleep are
weighed above what they get. This measures it without any loader: beside ``--sessions`` spinning
processes, each in a session of its own, a group of ``--procs`` processes in one more session either spins
(``busy``) or runs ``--run-ms`` and sleeps ``--sleep-ms`` in turn (``sleepy``), for ``--seconds``; rounds
alternate the two. A group's share is its processes' CPU time over the window's CPU time (all CPUs); a
session's fair share is one over the sessions.

    python bench/studies/does_the_jax_tutorial_keep_pace/sleepers.py --rounds 4 --out sleepers.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cpu_waits import cpu_seconds, neighbours

KINDS = ("busy", "sleepy")
# The group: --procs children, each busy (sleep_s == 0) or alternating run_s of spinning with sleep_s asleep.
GROUP = """
import os, resource, sys, time
procs, seconds, run_s, sleep_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
end = start + seconds
for _ in range(procs):
    if os.fork() == 0:
        while time.monotonic() < end:
            burst = time.perf_counter() + run_s if sleep_s else end
            while time.perf_counter() < burst and time.monotonic() < end:
                pass
            if sleep_s:
                time.sleep(sleep_s)
        os._exit(0)
for _ in range(procs):
    os.wait()
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(use.ru_utime + use.ru_stime, time.monotonic() - start)
"""


def run_group(kind: str, procs: int, seconds: float, run_ms: float, sleep_ms: float,
              others: list[subprocess.Popen]) -> dict[str, float]:
    """One window: the group's share of the machine and each neighbour's, over the same seconds."""
    sleep_s = sleep_ms / 1000 if kind == "sleepy" else 0.0
    before = [cpu_seconds([p.pid]) for p in others]
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", GROUP, str(procs), str(seconds), str(run_ms / 1000), str(sleep_s)],
                         capture_output=True, text=True, check=True, start_new_session=True)
    wall = time.monotonic() - t0
    after = [cpu_seconds([p.pid]) for p in others]
    cpus = os.cpu_count() or 1
    each = [(a - b) / (wall * cpus) for a, b in zip(after, before)]
    used, window = (float(x) for x in out.stdout.split()[-2:])  # the group's own window: its start left out
    return {"group": used / (window * cpus),
            "each_neighbour": statistics.median(each) if each else 0.0}


def summarize(windows: dict[str, list[dict[str, float]]], sessions: int) -> dict[str, object]:
    """Median group and neighbour shares per kind, the groups' range, and the fair share they are judged by."""
    out: dict[str, object] = {"fair_share_per_session": 1 / (sessions + 1)}
    for kind, rows in windows.items():
        groups = [r["group"] for r in rows]
        out[kind] = {"group_median": statistics.median(groups), "group_range": [min(groups), max(groups)],
                     "each_neighbour_median": statistics.median(r["each_neighbour"] for r in rows)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=4, help="spinning neighbours, each in a session of its own")
    ap.add_argument("--procs", type=int, default=3, help="processes in the measured group")
    ap.add_argument("--seconds", type=float, default=5.0, help="one window")
    ap.add_argument("--run-ms", type=float, default=0.5, help="a sleepy process's turn of spinning")
    ap.add_argument("--sleep-ms", type=float, default=0.2, help="a sleepy process's sleep after each turn")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    for name in ("rounds", "sessions", "procs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    for name in ("seconds", "run_ms", "sleep_ms"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0")
    windows: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    with neighbours(args.sessions) as others:
        time.sleep(0.5)  # the neighbours reach their sessions and the run queues settle
        for r in range(args.rounds):
            for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
                w = run_group(kind, args.procs, args.seconds, args.run_ms, args.sleep_ms, others)
                windows[kind].append(w)
                print(f"round {r} {kind:6s} group {w['group']:.3f} each neighbour {w['each_neighbour']:.3f}",
                      flush=True)
    result = {
        "question": "does the kernel give a session of briefly sleeping processes more than its share?",
        "command": "python bench/studies/does_the_jax_tutorial_keep_pace/sleepers.py "
                   f"--rounds {args.rounds} --sessions {args.sessions} --procs {args.procs} --seconds {args.seconds:g} "
                   f"--run-ms {args.run_ms:g} --sleep-ms {args.sleep_ms:g}",
        "conditions": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                       "autogroup": _autogroup(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "windows": windows,
        "summary": summarize(windows, args.sessions),
    }
    text = json.dumps(result, indent=1)
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def _autogroup() -> str | None:
    """Whether the kernel groups tasks by session here (``sched_autogroup_enabled``), as read."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
