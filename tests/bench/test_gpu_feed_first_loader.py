"""bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py: the first loader's one-off start is taken apart.

On the H100 the first mode's start-up read 4.98 s against the next one's 0.28 s: it held the
forkserver server's start, which a process pays once.
"""

import importlib.util
import os
import types
from pathlib import Path

import numpy as np

from cupy_nwt.loader.ring.ring import live_segments

STUDY = Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gpu_wait_for_batches" / "gpu_feed.py"


def test_the_first_loader_is_timed_to_its_first_batch_and_closed():
    spec = importlib.util.spec_from_file_location("gpu_feed_study", STUDY)
    assert spec is not None and spec.loader is not None
    gpu_feed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_feed)
    before = live_segments(os.getpid())  # this process's: another run's, or an earlier test's being freed, come and go
    workload = types.SimpleNamespace(dataset=np.arange(64, dtype=np.float32).reshape(16, 4), batch_transform=None)
    seconds = gpu_feed.first_loader_seconds(workload, batch_size=4, device="cpu")
    assert 0 < seconds < 60
    assert live_segments(os.getpid()) - before == set()  # its worker and ring are gone
