"""``cupy-nwt stats`` reports the warm-up apart from the steady state.

A transform that compiles on its first call (Numba did, 0.566 s of a 0.58 s total) made "transform"
the stage that took longest in a run where, once warm, it costs nothing. The transform below
stands for it: its first call in each process sleeps, later calls are free.
"""

from __future__ import annotations

import textwrap

import pytest
from test_faults import clean  # noqa: F401 - the fixture used below

from cupy_nwt import cli

MODULE = '''
import os
import time

COMPILED = set()

class CompilesOnce:
    """A batch transform whose first call in a process pays a one-time cost, as a JIT compile does."""

    def __call__(self, batch, seed=None):
        if os.getpid() not in COMPILED:
            time.sleep(0.4)
            COMPILED.add(os.getpid())
        return batch
'''


@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize(("workers", "every"), [("0", "8"), ("2", "8"), ("3", "1")])
def test_a_one_time_compile_is_warm_up_not_the_steady_states_longest_stage(tmp_path, monkeypatch, capsys, workers,
                                                                           every):
    """With rows more often than the warm-up's batches (``--every 1``, 3 workers), its early rows are warm-up too."""
    (tmp_path / "jitted.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["stats", "--synthetic-n", "256", "--batch-size", "16", "--num-workers", workers,
                     "--device", "cpu", "--no-progress", "--batches", "24", "--every", every,
                     "--batch-transform", "jitted:CompilesOnce"]) == 0
    out = capsys.readouterr().out
    warm = next(line for line in out.splitlines() if line.startswith("* warm-up"))
    steady = next(line for line in out.splitlines() if line.startswith("steady state"))
    n = max(1, int(workers))
    marked = [line.split()[0] for line in out.splitlines()[1:] if line.split() and line.split()[0].rstrip("*").isdigit()]
    assert [m for m in marked if m.endswith("*")] == [m for m in marked if int(m.rstrip("*")) <= n]
    assert f"the first {n} batch" in warm and "its longest stage: transform" in warm
    assert f"after the warm-up (batches {n + 1}..24)" in steady
    assert "the stage that took longest: transform" not in steady
