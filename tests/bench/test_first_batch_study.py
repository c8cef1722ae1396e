"""bench/studies/what_does_a_large_epoch_cost/first_batch.py: one tiny measurement runs, bad input stops
with one line. The study itself (fresh interpreters, rounds of both trees) is run by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "what_does_a_large_epoch_cost"))
import first_batch as fb  # noqa: E402


def test_one_measurement_times_the_first_batch():
    data = fb.Indexes(10)
    assert len(data) == 10 and data[7] == 7
    assert fb.one("cupy_nwt", 40, True, 2) > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--before", "/nonexistent"], "no cupy_nwt/ there"),
    (["--before", ".", "--rounds", "0"], "--rounds and --repeats must be >= 1"),
    (["--before", ".", "--sizes", "many"], "--sizes takes sample counts"),
    (["--before", ".", "--sizes", "2"], "each at least one batch"),
])
def test_bad_arguments_stop_before_any_run(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(fb.ROOT)
    with pytest.raises(SystemExit) as exc:
        fb.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
