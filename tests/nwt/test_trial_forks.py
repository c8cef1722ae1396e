"""A tuner trial forks its loader's workers beside no thread of its own.

A worker forked while another thread runs may inherit a lock that thread held, locked forever, and
Python 3.12 warns of every such fork (a DeprecationWarning naming the process as multi-threaded).
The trial's memory sampler is a thread: it must start once the workers are forked, not before.
Python's warning counts every thread of the process, an earlier test's too (torch's queue feeders and
its native pool): it is read from a trial run in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np

from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.nwt.measure import LoaderMeasure

_forks: list[set[str]] = []
_watching = threading.Event()


def _note_threads() -> None:
    if _watching.is_set():
        _forks.append({t.name for t in threading.enumerate() if t is not threading.current_thread()})


os.register_at_fork(before=_note_threads)


def test_a_trial_forks_its_workers_beside_no_thread_it_started():
    rng = np.random.default_rng(0)
    data = ArrayDataset(rng.integers(0, 255, (64, 8, 8, 3), dtype=np.uint8), np.arange(64) % 10)
    trial = LoaderMeasure(data, batch_size=8, device="cpu", multiprocessing_context="fork")
    trial.preflight()
    before = {t.name for t in threading.enumerate()}  # an earlier test's threads are not the trial's
    _forks.clear()
    _watching.set()
    try:
        got = trial(2, 8, 2)
    finally:
        _watching.clear()
    assert len(_forks) == 2  # the two workers
    assert [names - before for names in _forks] == [set(), set()]
    assert got.peak_memory_bytes is not None and got.peak_memory_bytes > 0


TRIAL = """
import numpy as np
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.nwt.measure import LoaderMeasure

data = ArrayDataset(np.zeros((64, 8, 8, 3), np.uint8), np.arange(64) % 10)
trial = LoaderMeasure(data, batch_size=8, device="cpu", multiprocessing_context="fork")
trial.preflight()
assert trial(2, 8, 2).peak_memory_bytes
"""


def test_a_trial_in_a_fresh_process_forks_with_no_warning():
    """On Python 3.12+ a fork beside a thread warns ('This process is multi-threaded'); before, nothing does."""
    got = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", TRIAL], capture_output=True,
                         text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "multi-threaded" not in got.stderr
