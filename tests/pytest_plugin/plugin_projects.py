"""Throwaway pytest projects for the plugin's tests: a fast conftest, a tiny dataset, a loader benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

# cpuinfo (pytest-benchmark's machine info) spawns a process and takes ~1 s per run: not needed here.
FAST_CONFTEST = """
def pytest_benchmark_generate_machine_info(config):
    return {"node": "pytester"}
"""




PLANTED = Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gate_hold" / "planted.py"


def plant_slowdown(pytester: pytest.Pytester) -> None:
    """The gate study's planted CPU slowdown (``CUPY_NWT_PROOF_CPU_US``) in the project, as the study plants it:
    its ``loader_benchmark`` override, from the project's conftest (the plugin itself knows nothing of it)."""
    pytester.makepyfile(planted_slowdown=PLANTED.read_text(encoding="utf-8"))
    pytester.makeconftest(FAST_CONFTEST + "\nfrom planted_slowdown import loader_benchmark  # noqa: F401, E402\n")


def make_project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAST_CONFTEST)
    # In-process runs drop the modules they imported; hypothesis's plugin would re-import per run.
    # Counting instructions under callgrind costs seconds a run: the tests about it ask for it by name.
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider --nwt-instructions=off\n")
    return pytester


TINY_DATA = """
import os
import time

import numpy as np


class TinyImages:
    \"\"\"64 small images; __getitem__ sleeps SLOW_S seconds (from the environment) per sample.\"\"\"

    def __init__(self, n=64):
        self.n = n
        self.slow = float(os.environ.get("SLOW_S", "0"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.slow:
            time.sleep(self.slow)
        return np.full((4, 4, 3), i % 256, np.uint8), i % 10
"""

LOADER_TEST = """
from tinydata import TinyImages


def test_pipeline(loader_benchmark):
    r = loader_benchmark(TinyImages(), batches={batches}, rounds={rounds}, warmup=1, batch_size=8,
                         num_workers={workers}, device="cpu"{extra})
    assert r.batches == {batches} and r.samples == 8 * {batches}
"""


def loader_test(batches: int = 5, workers: int = 0, rounds: int = 5, extra: str = "") -> str:
    return LOADER_TEST.format(batches=batches, workers=workers, rounds=rounds, extra=extra)
