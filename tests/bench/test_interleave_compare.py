"""bench/interleave_compare.py: per cell, both revisions' rounds, the ratio of their medians, and a verdict
against the rounds' own spread; arguments it cannot honour get one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import interleave_compare as ic  # noqa: E402


def result(**cells: float) -> dict:
    return {"points": [{"workload": k.split("_")[0], "loader": "cupy_nwt", "num_workers": int(k.split("_")[1]),
                        "samples_per_s": {"median": v}} for k, v in cells.items()]}


def test_a_ratio_within_the_rounds_spread_is_noise_and_one_beyond_it_is_not():
    before = [ic.medians(result(png_0=100.0, png_2=200.0)), ic.medians(result(png_0=110.0, png_2=200.0))]
    after = [ic.medians(result(png_0=104.0, png_2=150.0)), ic.medians(result(png_0=106.0, png_2=152.0))]
    rows = {(r["workload"], r["num_workers"]): r for r in ic.summarize({"before": before, "after": after})}
    same, slower = rows[("png", 0)], rows[("png", 2)]
    assert same["ratio"] == pytest.approx(105 / 105) and same["within_noise"]
    assert same["noise"] == pytest.approx(10 / 105)
    assert slower["ratio"] == pytest.approx(151 / 200) and not slower["within_noise"]
    assert slower["before"] == [200.0, 200.0] and slower["after"] == [150.0, 152.0]


def test_cells_missing_from_a_run_are_left_out_and_one_round_gives_no_verdict():
    rows = ic.summarize({"before": [ic.medians(result(png_0=1.0, png_1=1.0))], "after": [ic.medians(result(png_0=1.0))]})
    assert [(r["workload"], r["num_workers"]) for r in rows] == [("png", 0)]
    assert rows[0]["within_noise"] is None


@pytest.mark.parametrize(("argv", "words"), [
    (["--before", "no-such-revision-xyz"], "is not a revision"),
    (["--before", "HEAD", "--rounds", "0"], "--rounds must be >= 1"),
    (["--before", "HEAD", "--", "--out-dir", "x"], "--out-dir is this script's to choose"),
    (["--before", "HEAD", "--", "--workers", "0", "--out-dir=x"], "--out-dir is this script's to choose"),
    (["--before", "HEAD", "--", "--out", "x"], "--out-dir is this script's to choose"),  # argparse's abbreviation
])
def test_bad_arguments_get_one_line(argv, words, capsys):
    try:
        code = ic.main(argv)
    except SystemExit as exc:
        code, err = 2, str(exc)
    else:
        err = capsys.readouterr().err
    assert code == 2 and words in err and "\n" not in err.strip()
