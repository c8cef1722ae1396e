"""pytest-benchmark: GPU idle time of a simulated training step, prefetcher on vs off, torch beside (GPU only).

One round is one step (batch fetch + a 5 ms kernel that reads it + host sync) in the steady state:
workers persist across epochs, and the start-up (the wait for the first batch, when the workers start)
is timed on its own and kept out of the rounds. The idle fraction over the rounds, the start-up and the
samples/s delivered to the GPU go into ``extra_info``. The design target is an idle fraction under 5%
with the prefetcher. Skips without a GPU; the torch modes skip without a CUDA build of torch.
"""

from __future__ import annotations

import time

import gpu_feed
import pytest

from bench import workloads as lc

STEP_S = 0.005
WORKERS = 4
WARMUP = 10
ROUNDS = 100

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    wls = lc.make_workloads(tmp_path_factory.mktemp("gpu-feed"), decode_images=512, array_images=8192)
    return next(w for w in wls if w.name == "numba-array")


@pytest.fixture(scope="module")
def step():
    from cupy_nwt.experiments.step_sim import SimulatedStep

    return SimulatedStep(STEP_S)


@pytest.mark.parametrize("mode", gpu_feed.MODES)
def test_gpu_idle_fraction(benchmark, workload, step, mode):
    if mode.startswith("torch") and (why := gpu_feed.torch_cuda_reason()) is not None:
        pytest.skip(why)
    loader, stream = gpu_feed.batches(mode, workload, WORKERS, 128, seed=0)
    kernel = []
    try:
        t0 = time.perf_counter()
        first = next(stream)  # the workers start here: start-up, not a step
        startup = time.perf_counter() - t0
        step(first)
        for _ in range(WARMUP):
            step(next(stream))
        benchmark.group = "gpu feed"
        t0 = time.perf_counter()
        benchmark.pedantic(lambda: kernel.append(step(next(stream))), rounds=ROUNDS, iterations=1)
        wall = time.perf_counter() - t0
        persistent = loader.persistent_workers  # epoch boundaries in the rounds restart no worker
    finally:
        gpu_feed.release(loader, stream)
        loader = stream = None  # torch's persistent workers stop when their loader is collected
    assert persistent
    benchmark.extra_info["idle_fraction"] = max(0.0, 1 - sum(kernel) / wall)
    benchmark.extra_info["startup_seconds"] = startup
    benchmark.extra_info["samples_per_s"] = 128 * len(kernel) / wall
