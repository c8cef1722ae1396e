"""pytest-benchmark: GPU idle time of a simulated training step, prefetcher on vs off (GPU only).

One round is one step (batch fetch + a 5 ms kernel that reads it + host sync) after warm-up; the
idle fraction over the rounds and the samples/s delivered to the GPU go into ``extra_info``. The
design target is an idle fraction under 5% with the prefetcher. Skips without a GPU.
"""

from __future__ import annotations

import time

import gpu_feed
import loader_compare as lc
import pytest

STEP_S = 0.005
WORKERS = 4
WARMUP = 10

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    wls = lc.make_workloads(tmp_path_factory.mktemp("gpu-feed"), decode_images=512, array_images=8192)
    return next(w for w in wls if w.name == "numba-array")


@pytest.fixture(scope="module")
def step():
    from cupy_nwt.experiments.step_sim import SimulatedStep

    return SimulatedStep(STEP_S)


@pytest.mark.parametrize("mode", ["cupy_nwt", "cupy_nwt-noprefetch"])
def test_gpu_idle_fraction(benchmark, workload, step, mode):
    loader, stream = gpu_feed.batches(mode, workload, WORKERS, 128, seed=0)
    kernel = []
    try:
        for _ in range(WARMUP):
            step(next(stream))
        benchmark.group = "gpu feed"
        t0 = time.perf_counter()
        benchmark.pedantic(lambda: kernel.append(step(next(stream))), rounds=100, iterations=1)
        wall = time.perf_counter() - t0
    finally:
        stream.close()
        loader.close()
    benchmark.extra_info["idle_fraction"] = max(0.0, 1 - sum(kernel) / wall)
    benchmark.extra_info["samples_per_s"] = 128 * len(kernel) / wall
