"""For tests/ and bench/ alike: ``gpu`` tests skip with the probe's reason on machines without one."""

from __future__ import annotations

import pytest

from cupy_nwt import cuda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    status = cuda.gpu_status()
    if status.available:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {status.reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
