"""The memory sampler against real child processes that allocate (and touch) known amounts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from cupy_nwt.nwt.footprint import MemoryPeak, MemorySampler, sample

MiB = 1024 * 1024

# Allocate N MiB of touched (non-zero) pages, say so, then hold them until stdin closes.
_CHILD = """
import sys
block = b"\\x01" * ({mib} * 1024 * 1024)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.read()
"""


class _Child:
    def __init__(self, mib: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(mib=mib)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def children():
    made: list[_Child] = []

    def make(mib: int) -> _Child:
        c = _Child(mib)
        made.append(c)
        return c

    yield make
    for c in made:
        c.end()


def _baseline_child_bytes() -> int:
    """USS of an idle interpreter: subtracted so the test sees just the allocation."""
    c = _Child(0)
    try:
        return sample([c.pid]).uss_bytes or 0
    finally:
        c.end()


def test_one_sample_sums_children(children):
    base = _baseline_child_bytes()
    a, b = children(48), children(96)
    s = sample([a.pid, b.pid])
    assert s.processes == 2
    extra = s.uss_bytes - 2 * base
    assert 0.9 * 144 * MiB < extra < 1.2 * 144 * MiB
    # the blocks are private: PSS and USS agree on them, RSS is at least as large
    assert s.pss_bytes >= s.uss_bytes
    assert s.rss_bytes >= s.pss_bytes


def test_sampler_peak_follows_a_process_that_grows_and_exits(children):
    base = _baseline_child_bytes()
    live: list[int] = []
    with MemorySampler(lambda: list(live), interval=0.02, include_self=False) as sampler:
        live.append(children(32).pid)
        big = children(128)
        live.append(big.pid)
        deadline = time.monotonic() + 5
        while sampler.peak.max_processes < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        big.end()  # vanishes while its PID is still listed: must be skipped, not raise
        time.sleep(0.1)
    peak = sampler.peak
    assert isinstance(peak, MemoryPeak)
    assert peak.max_processes == 2
    assert peak.samples >= 3
    assert 0.9 * 160 * MiB < peak.uss_bytes - 2 * base < 1.2 * 160 * MiB
    assert peak.bytes == peak.pss_bytes
    # after the big one exited, a fresh sample sees only the small one
    assert sample(live).processes == 1


def test_sampler_includes_this_process_by_default():
    me = psutil.Process().memory_full_info()
    with MemorySampler() as sampler:
        pass
    peak = sampler.peak
    assert peak.max_processes == 1
    assert peak.samples >= 2  # one at start, one at stop, however short the window
    assert peak.uss_bytes >= 0.5 * me.uss


def test_gone_pids_and_duplicates_are_skipped():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    s = sample([gone.pid, os.getpid(), os.getpid()])
    assert s.processes == 1


def test_empty_set_reports_nothing_measured():
    with MemorySampler(lambda: [], include_self=False) as sampler:
        pass
    peak = sampler.peak
    assert peak.samples == 0 and peak.pss_bytes is None and peak.rss_bytes == 0


def test_bad_interval_and_double_start():
    with pytest.raises(ValueError, match="interval"):
        MemorySampler(interval=0)
    s = MemorySampler().start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            s.start()
    finally:
        s.stop()


def test_peak_to_dict_has_the_compared_figure():
    d = MemoryPeak(pss_bytes=None, uss_bytes=7, rss_bytes=9, max_processes=1, samples=1).to_dict()
    assert d["bytes"] == 7
