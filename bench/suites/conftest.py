"""The suites time the shared workloads (``bench.workloads``) and the GPU feed study's loop: the repository
and that study's folder go on ``sys.path`` here, and the workloads are built once a session (``workloads``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "studies" / "does_the_gpu_wait_for_batches"))
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def workloads(tmp_path_factory):
    """The shared workloads by name, closed at the end: 4,096 PNGs in a tar shard and 8,192 images in memory."""
    from bench import workloads as lc  # noqa: PLC0415 - after the repository is on sys.path

    wls = {w.name: w for w in lc.make_workloads(tmp_path_factory.mktemp("loader-bench"), decode_images=4096,
                                                array_images=8192)}
    yield wls
    for w in wls.values():
        close = getattr(w.dataset, "close", None)
        if close:
            close()
