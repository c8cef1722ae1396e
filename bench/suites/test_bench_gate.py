"""The loader pipelines the cupy_nwt plugin's throughput gate judges: both shared workloads through cupy_nwt's
DataLoader, timed by ``loader_benchmark`` (rounds sized by their noise) and, where valgrind is installed,
each pipeline's work per sample counted exactly under callgrind. Gate a change with::

    pytest bench/suites/test_bench_gate.py --nwt-against=origin/main --nwt-throughput-drop=5

or save a baseline here (``--nwt-save-baseline=FILE``) and judge later runs against it (``--nwt-baseline``).
``test_bench_loader.py`` times the same workloads beside torch's loader with plain ``benchmark``: shown, not
judged.
"""

from __future__ import annotations

import pytest

BATCH_SIZE = 128
NUM_WORKERS = 2
#: samples counted under callgrind: enough for the per-sample work to swamp the batch's own, a few
#: tens of seconds each on one core
COUNT_SAMPLES = 512


@pytest.mark.parametrize("workload", ["decode-png", "numba-array"])
def test_loader_pipeline(loader_benchmark, workloads, workload):
    w = workloads[workload]
    result = loader_benchmark(w.dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS, persistent_workers=True,
                              shuffle=True, seed=0, batch_transform=w.batch_transform, count_samples=COUNT_SAMPLES)
    assert result.samples >= BATCH_SIZE
