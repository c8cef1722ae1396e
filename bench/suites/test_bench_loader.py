"""pytest-benchmark: loader samples/s against num_workers, cupy_nwt's DataLoader beside torch's.

Workloads and loaders come from ``bench.workloads`` (same dataset object, batch size, workers, fork
start, and per-batch ``CifarTrainTransform`` for both). One round is one batch, after ``WARMUP``
untimed batches that include worker start-up; ``samples_per_s`` goes into ``extra_info``, shown by the
cupy_nwt plugin's throughput gate but never judged: a plain ``benchmark`` times the test's own code, which
nothing counts or runs at a base revision (the gate judges ``test_bench_gate.py``). torch benchmarks skip
without torch.
Worker counts: 0, 1, 2, 4, ... up to the usable CPUs, or $CUPY_NWT_BENCH_WORKERS="0,2,4".
"""

from __future__ import annotations

import pytest

from bench import workloads as lc

BATCH_SIZE = 128
BATCHES = 25
WARMUP = 3
WORKERS = lc.default_workers()


def _bench(benchmark, kind: str, workload: lc.Workload, num_workers: int) -> None:
    loader = lc.make_loader(kind, workload, num_workers, BATCH_SIZE, "cpu", seed=0)
    stream = lc.batch_stream(loader, kind, "cpu")
    sizes: list[int] = []
    try:
        for _ in range(WARMUP):
            next(stream)
        benchmark.group = f"loader {workload.name}"
        benchmark.extra_info.update(loader=kind, workload=workload.name, num_workers=num_workers,
                                    batch_size=BATCH_SIZE)
        benchmark.pedantic(lambda: sizes.append(next(stream)), rounds=BATCHES, warmup_rounds=0, iterations=1)
    finally:
        stream.close()
        lc.close_loader(loader)
    assert sizes and all(s == BATCH_SIZE for s in sizes)
    if benchmark.stats:  # absent under --benchmark-disable
        benchmark.extra_info["samples_per_s"] = BATCH_SIZE / benchmark.stats["mean"]


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("workload", ["decode-png", "numba-array"])
def test_cupy_nwt_loader(benchmark, workloads, workload, num_workers):
    _bench(benchmark, "cupy_nwt", workloads[workload], num_workers)


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("workload", ["decode-png", "numba-array"])
def test_torch_loader(benchmark, workloads, workload, num_workers):
    pytest.importorskip("torch")
    _bench(benchmark, "torch", workloads[workload], num_workers)
