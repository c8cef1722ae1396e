"""bench/studies/does_the_jax_tutorial_keep_pace/epoch_times.py: the summary of recorded runs, and bad input
stopping with one line. The tutorial itself runs in tests/loader/test_clients.py; the study is run by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_jax_tutorial_keep_pace"))
import epoch_times as et  # noqa: E402


def test_the_summary_leaves_out_the_compiling_epoch_and_takes_medians_of_runs(tmp_path):
    runs = {"cupy_nwt": [[9.0, 2.0, 4.0], [9.0, 3.0, 3.0], [9.0, 5.0, 5.0]],
            "torch": [[8.0, 2.0, 2.0], [8.0, 2.0, 4.0], [8.0, 1.0, 1.0]]}
    s = et.summarize(runs)
    assert s["summary"]["cupy_nwt"] == {"median_epoch_s": 3.0, "interval_s": [3.0, 5.0], "first_epoch_median_s": 9.0}
    assert s["summary"]["torch"]["median_epoch_s"] == 2.0 and s["ratio_cupy_nwt_over_torch"] == 1.5
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps({"epoch_s": runs}))
    assert et.main(["--summarize", str(saved)]) == 0
    assert json.loads(saved.read_text())["ratio_cupy_nwt_over_torch"] == 1.5


@pytest.mark.parametrize("argv", [["--rounds", "2"], ["--epochs", "0"], ["--n-train", "10"]])
def test_bad_arguments_stop_before_any_run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        et.main(argv)
    assert exc.value.code == 2 and "--rounds must be >= 3" in capsys.readouterr().err
