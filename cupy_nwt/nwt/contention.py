"""How many of the usable CPUs other work took during a trial: a busy neighbour, told apart from noise.

A trial's own error (the spread of its batch groups) cannot see a load that is steady within the
trial but differs between trials: a job started mid-search slows every count measured after it,
each trial still looks steady, and the search compares counts measured under different loads. So
each trial of the real loader also reads the kernel's CPU accounting over its window: the busy
time of the CPUs this process may run on (``system.busy_cpu_seconds``; steal time, a host taking
the CPU, counts as busy), less the CPU time of the trial's own processes (the main process, its workers, a
spinner standing for the training step). What is left is other work's, as CPUs kept busy on
average. Under a cgroup CPU quota smaller than those CPUs, only what other work took beyond the
CPUs the quota leaves idle anyway is counted. Linux only; elsewhere nothing is measured (None).

The kernel counts busy time in whole ticks (10 ms at the usual 100 Hz), so a window of a few ms
reads either nothing or a tick per CPU: divided by that window, one tick reads as many CPUs. A
window shorter than ``MIN_WINDOW_TICKS`` ticks is therefore not measured (None), and a figure is
never more than the CPUs watched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import psutil

from .. import system

MIN_WINDOW_TICKS = 5  # below this, a CPU's rounding to whole ticks is a fifth of the figure or more


def _cpu_seconds(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return t.user + t.system


class CpuWindow:
    """Other work's share of the CPUs between :meth:`begin` and :meth:`end`, in CPUs kept busy.

    ``begin(pids)`` reads the CPUs' busy time and those processes' CPU time; ``end(pids)`` reads
    them again, counting the whole CPU time of a process not seen at ``begin`` (a worker started in
    the window) as the trial's own. The kernel reports a process's CPU time in whole ticks, rounded
    down: a process started in the window is credited half a tick more, what it lost on average.
    """

    def __init__(self) -> None:
        self.cpus = system.affinity_cpus()
        self.idle_anyway = max(0, len(self.cpus) - system.usable_cpus())
        self._busy: float | None = None
        self._own: dict[int, float] = {}
        self._t0 = 0.0

    def begin(self, pids: Iterable[int]) -> None:
        self._busy = system.busy_cpu_seconds(self.cpus)
        self._own = {pid: s for pid in pids if (s := _cpu_seconds(pid)) is not None}
        self._t0 = time.monotonic()

    def end(self, pids: Iterable[int]) -> float | None:
        """Other work's CPUs since :meth:`begin`, at most the CPUs watched; None where the kernel's accounting
        could not be read or the window was too short for its ticks (``MIN_WINDOW_TICKS``)."""
        busy = system.busy_cpu_seconds(self.cpus)
        elapsed = time.monotonic() - self._t0
        tick = 1.0 / os.sysconf("SC_CLK_TCK")
        if busy is None or self._busy is None or elapsed < MIN_WINDOW_TICKS * tick:
            return None
        own, half_tick = 0.0, 0.5 * tick
        for pid in dict.fromkeys(pids):
            s = _cpu_seconds(pid)
            if s is not None:
                own += s - self._own[pid] if pid in self._own else s + half_tick
        others = min((busy - self._busy - own) / elapsed, float(len(self.cpus)))
        return max(0.0, others - self.idle_anyway)
