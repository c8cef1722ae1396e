"""bench/studies/does_the_gate_hold/gate_noise_proof.py: its groups' targets, the CPU drift it records, bad input. The proof itself
(tens of CI runs) is run by hand; these are its cheap parts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "studies" / "does_the_gate_hold"))
import gate_noise_proof as gnp  # noqa: E402


def _run(exit_code: int, cpu_change: float, rate: float) -> dict:
    return {"exit_code": exit_code, "figures": {
        "samples_per_s": rate,
        gnp.CPU_STORED: {"verdict": "reported", "change_pct": cpu_change, "low_pct": None, "high_pct": None}}}


def test_in_cpu_mode_no_run_may_fail_and_the_cpu_drift_of_each_group_is_recorded():
    """The cpu mode shows CPU against a stored baseline: a failed run, slowed or not, misses the target."""
    assert set(gnp.MODES["cpu"]) == {"unchanged", "slower 40%"} and gnp.TARGETS["slower 40%"] == ("at most", 0)
    doc = {"runs_per_group": 2, "started_unix": 0.0, "baseline": {"samples_per_s": 100.0}, "groups": {
        "unchanged": {"work": 1.0, "runs": [_run(0, -30.0, 90.0), _run(0, 25.0, 120.0)]},
        "slower 40%": {"work": 1.4, "runs": [_run(0, -9.0, 80.0), _run(1, 70.0, 60.0)]}}}
    gnp.summary(doc)
    unchanged, slower = doc["groups"]["unchanged"], doc["groups"]["slower 40%"]
    assert unchanged["met"] and not slower["met"] and slower["failed"] == 1
    assert (unchanged["cpu_change"]["min"], unchanged["cpu_change"]["max"]) == (-30.0, 25.0)
    assert slower["cpu_change"]["median"] == pytest.approx(30.5)
    assert doc["drift"]["spread_pct"] == pytest.approx(100.0 * 30.0 / 105.0)


@pytest.mark.parametrize("argv", [["--runs", "0", "--out", "x.json"], ["--limit", "100", "--out", "x.json"]])
def test_bad_arguments_stop_before_any_run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gnp.main(argv)
    assert exc.value.code == 2
    assert "--runs must be >= 1 and --limit between 0 and 100" in capsys.readouterr().err


def test_the_plants_mode_runs_the_docs_pipeline_with_each_regression_users_make():
    groups = gnp.MODES["plants"]
    assert set(groups) == {"unchanged", *gnp.PLANTS} and len(gnp.PLANTS) == 6
    assert all(gnp.TARGETS[p] == ("at least", 19) for p in gnp.PLANTS) and gnp.TARGETS["unchanged"] == ("at most", 0)
    sources = {name: gnp.pipeline_source("plants", plant) for name, plant in groups.items()}
    for text in sources.values():
        compile(text, "pipeline.py", "exec")
    assert "PLANT = 'none'" in sources["unchanged"] and "PLANT = 'numpy passes'" in sources["numpy passes"]
    assert "np.ascontiguousarray(images * 1.0)" in sources["numpy passes"]
    test = gnp.PLANTED_TEST.format(batches=12, count=128)
    assert "batch_size=128, num_workers=2, persistent_workers=True" in test and "count_samples=128" in test


def test_the_summary_names_the_figure_that_caught_each_run():
    def run(code: int, caught: list[str]) -> dict:
        return {"exit_code": code, "seconds": 60.0, "figures": {"caught_by": caught}}

    doc = {"runs_per_group": 2, "started_unix": 0.0, "baseline": {}, "groups": {
        "numpy passes": {"work": "numpy passes", "runs": [run(1, ["cost_per_sample (stored)"]),
                                                          run(1, ["cost_per_sample (stored)"])]},
        "unchanged": {"work": "none", "runs": [run(0, []), run(0, [])]}}}
    gnp.summary(doc)
    passes = doc["groups"]["numpy passes"]
    assert passes["met"] and passes["caught_by"] == {"cost_per_sample (stored)": 2}
    assert passes["target"] == "at least 1.9 of 2 fail" and passes["seconds_a_run"]["median"] == 60.0
    assert doc["groups"]["unchanged"]["met"]
