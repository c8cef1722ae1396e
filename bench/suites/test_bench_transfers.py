"""pytest-benchmark timings of 64 MiB host <-> device copies, pageable vs pinned.

Wall time of a copy plus a stream synchronize, so each round covers the whole copy; GB/s of the
median round goes into ``extra_info``. Run with ``pytest bench/`` (skipped without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt import cuda
from cupy_nwt.experiments import timing

SIZE = 64 * 1024**2

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _release_pools():
    yield
    cuda.release_memory_pools()


def _host(memory: str) -> np.ndarray:
    buf = cuda.pinned_empty(SIZE, np.uint8) if memory == "pinned" else np.empty(SIZE, np.uint8)
    buf[:] = np.frombuffer(np.random.default_rng(0).bytes(SIZE), dtype=np.uint8)
    return buf


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_copy_64mib(benchmark, memory, direction):
    host = _host(memory)
    expected = host.copy()
    dev = cuda.device_empty(SIZE, np.uint8)
    s = cuda.stream()
    if direction == "d2h":
        cuda.memcpy_h2d(dev, host, s)
        s.synchronize()
        host.fill(0)

    burst = cuda.CopyBurst(direction, [(dev, host) if direction == "h2d" else (host, dev)], s)  # checks done here

    def copy() -> None:
        burst()
        s.synchronize()

    benchmark.group = f"{direction} 64 MiB"
    benchmark.pedantic(copy, rounds=30, warmup_rounds=3, iterations=1)
    benchmark.extra_info.update(direction=direction, memory=memory, nbytes=SIZE)
    if benchmark.stats:  # absent under --benchmark-disable
        benchmark.extra_info["gbps_median"] = timing.gbps(SIZE, benchmark.stats["median"])
    back = cuda.as_numpy(dev) if direction == "h2d" else host
    assert np.array_equal(back, expected)
