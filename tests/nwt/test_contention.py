"""Other work's CPUs during a trial (``contention.CpuWindow``) never reads as more CPUs than the trial ran on.

The kernel's busy time comes in whole ticks: the fakes below stand for it, so the figures are fixed.
"""

from __future__ import annotations

import os
import time

import pytest

from cupy_nwt import system
from cupy_nwt.nwt.contention import CpuWindow

pytestmark = pytest.mark.skipif(not hasattr(os, "sysconf"), reason="the kernel's ticks are a POSIX notion")


def _busy_steps(monkeypatch, *readings: float) -> None:
    """``system.busy_cpu_seconds`` gives ``readings`` one after the other."""
    it = iter(readings)
    monkeypatch.setattr(system, "busy_cpu_seconds", lambda cpus: next(it))


def test_a_window_too_short_for_the_kernels_ticks_is_unmeasured_not_a_crowd(monkeypatch):
    """One tick on each CPU inside a window of a few ms read as 18 CPUs of 2 before, and warned of a busy
    neighbour: such a window is unmeasured."""
    window = CpuWindow()
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    _busy_steps(monkeypatch, 100.0, 100.0 + tick * len(window.cpus))
    window.begin([])
    assert window.end([]) is None


def test_other_work_never_counts_more_cpus_than_the_trial_watched(monkeypatch):
    window = CpuWindow()
    _busy_steps(monkeypatch, 100.0, 100.0 + 1000.0 * len(window.cpus))
    window.begin([])
    time.sleep(12 / os.sysconf("SC_CLK_TCK"))  # a dozen ticks: long enough to measure
    others = window.end([])
    assert others is not None and others == len(window.cpus) - window.idle_anyway
