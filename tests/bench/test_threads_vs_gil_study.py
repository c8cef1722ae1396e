"""bench/studies/why_are_threads_slower_on_png/threads_vs_gil.py: both arms measure on a tiny dataset, and bad
input stops with one line. The study itself (a 12,000-PNG shard, rounds) is run by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "why_are_threads_slower_on_png"))
import threads_vs_gil as tvg  # noqa: E402


class Pixels:
    def __len__(self) -> int:
        return 4 * tvg.BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((3, 4, 4), i % 256, np.uint8), i % 10


@pytest.mark.parametrize("threads", [0, 1])
def test_both_arms_give_a_rate(threads):
    assert tvg.loader_rate(Pixels(), None, threads, batches=1) > 0
    assert tvg.pool_rate(Pixels(), threads, samples=2 * tvg.BATCH) > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--threads", "two"], "--threads takes counts"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--rounds", "0"], "--rounds and --batches >= 1"),
    (["--images", "100"], "need"),
])
def test_bad_arguments_stop_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        tvg.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
