"""bench/studies/what_does_fixed_dispatch_cost/skewed_dispatch.py: one tiny measurement runs, bad input stops
with one line. The study itself (fresh interpreters, rounds of both trees) is run by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "what_does_fixed_dispatch_cost"))
import skewed_dispatch as sd  # noqa: E402


def test_one_measurement_times_an_epoch_of_the_skewed_dataset():
    data = sd.Skewed(40)
    assert len(data) == 40 and 0 < data.slow.sum() < 40 and data[3].tolist() == [3.0] * 16
    assert sd.one(2, 32) > 0 and sd.one(2, 32, in_order=False) > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--before", "/nonexistent"], "no cupy_nwt/ there"),
    (["--before", ".", "--rounds", "0"], "--rounds must be >= 1"),
    (["--before", ".", "--workers", "two"], "--workers takes counts like 2,4"),
])
def test_bad_arguments_stop_before_any_run(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(sd.ROOT)
    with pytest.raises(SystemExit) as exc:
        sd.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
