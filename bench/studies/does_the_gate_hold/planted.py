"""A planted per-sample CPU slowdown, for proving the gate (``gate_proof.py`` beside it): the proof's conftest.

``gate_proof.py`` copies this file into its throwaway project as ``conftest.py``; the package itself knows
nothing of it. There, ``CUPY_NWT_PROOF_CPU_US=N`` makes the ``loader_benchmark`` fixture (overridden
below, the plugin's own underneath) wrap its dataset so that every sample costs N more microseconds of CPU (a busy loop on the thread's own CPU clock, so the amount is exact however
loaded the machine is) wherever the loader fetches it: a worker process, a worker thread or the main
process. ``0`` wraps without burning, so a proof's unchanged runs take the same code path as its slowed
ones. Unset (the normal case), the dataset is passed through untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import pytest

from cupy_nwt.errors import ArgumentError

ENV = "CUPY_NWT_PROOF_CPU_US"


def planted_cpu_us() -> float | None:
    """The planted microseconds per sample, or None when unset; a bad value is a clear error."""
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ArgumentError(f"{ENV} must be microseconds of CPU per sample (a number >= 0), got {raw!r}") from None
    if not 0 <= value < 1e7:
        raise ArgumentError(f"{ENV} must be between 0 and 1e7 microseconds, got {raw!r}")
    return value


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SlowedDataset:
    """A map-style dataset whose samples each cost ``cpu_us`` more microseconds of CPU."""

    def __init__(self, dataset: Any, cpu_us: float) -> None:
        self.dataset = dataset
        self.cpu_s = cpu_us / 1e6

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        if self.cpu_s:
            _burn(self.cpu_s)
        return self.dataset[index]


class SlowedBatchDataset(SlowedDataset):
    """The same for a dataset with ``__getitems__`` (kept, so the loader's batch fetch path is unchanged)."""

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        if self.cpu_s:
            _burn(self.cpu_s * len(indices))
        return self.dataset.__getitems__(indices)


def planted(dataset: Any) -> Any:
    """``dataset`` slowed as the environment says, or itself when the variable is unset."""
    cpu_us = planted_cpu_us()
    if cpu_us is None:
        return dataset
    if not hasattr(dataset, "__getitem__"):
        raise ArgumentError(f"{ENV} slows map-style datasets only (with __getitem__)")
    cls = SlowedBatchDataset if hasattr(dataset, "__getitems__") else SlowedDataset
    return cls(dataset, cpu_us)


@pytest.fixture
def loader_benchmark(loader_benchmark: Any) -> Any:
    """The plugin's ``loader_benchmark``, its dataset slowed as the environment says."""

    def run(dataset: Any, *args: Any, **kwargs: Any) -> Any:
        return loader_benchmark(planted(dataset), *args, **kwargs)

    return run
