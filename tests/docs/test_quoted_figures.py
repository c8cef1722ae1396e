"""Figures typed into the manual equal the committed result files they quote.

The headline block is generated (``bench/make_figures.py``, tested in ``tests/bench/``); these are the
figures written by hand in prose and tables, each read back here from the file the text names, so a
rerun that changes the file, or a slip in the text, fails instead of leaving a number nobody measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATE_PAGE = ROOT / "docs" / "ci-gate.md"
GATE_PROOF = ROOT / "bench" / "results" / "vm-2cpu" / "gate_noise_proof_plants" / "summary.json"
RESULTS_PAGE = ROOT / "bench" / "results" / "README.md"
H100 = ROOT / "bench" / "results" / "NVIDIA-H100-80GB-HBM3"

# the gate proof's table rows, as the page names them, and its groups in summary.json
GATE_ROWS = {
    "unchanged code": "unchanged",
    "+10% Python work a sample": "python +10%",
    "+2% instructions": "instructions +2%",
    "three NumPy passes over each batch": "numpy passes",
    "one `batch.copy()` a batch": "batch copy",
    "a fresh 1 MiB allocation written a sample": "alloc 1 MiB",
    "one `os.stat` of a file a sample": "os.stat",
}


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def pct_range(values: list[float]) -> str:
    """A percent change as the page writes it: ``+1.43%``, or ``+0.03% to +0.04%`` where the runs differ."""
    lo, hi = f"{min(values):+.2f}%", f"{max(values):+.2f}%"
    return lo if lo == hi else f"{lo} to {hi}"


def gate_table() -> dict[str, list[str]]:
    """The proof's table on docs/ci-gate.md: its run's name (up to a bracket) -> its cells."""
    rows = {}
    for line in GATE_PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].split(" (")[0]
        if name in GATE_ROWS:
            rows[name] = cells
    return rows


def test_the_gate_proofs_run_count_and_hours_are_its_files():
    proof = load(GATE_PROOF)
    runs = sum(len(group["runs"]) for group in proof["groups"].values())
    m = re.search(r"(\d+) gate runs over ([\d.]+) hours", GATE_PAGE.read_text(encoding="utf-8"))
    assert m, "docs/ci-gate.md no longer says how many gate runs the proof made"
    assert (int(m.group(1)), m.group(2)) == (runs, f"{proof['hours']:.2f}")


@pytest.mark.parametrize("row", GATE_ROWS)
def test_each_gate_proof_row_is_its_groups_runs(row):
    runs = load(GATE_PROOF)["groups"][GATE_ROWS[row]]["runs"]
    beside = [r for r in runs if r["neighbour"]]
    failed = f"{sum(r['exit_code'] != 0 for r in runs)} of {len(runs)} " \
             f"({sum(r['exit_code'] != 0 for r in beside)} of {len(beside)})"
    cost = pct_range([r["figures"]["cost_per_sample (stored)"]["change_pct"] for r in runs])
    instructions = pct_range([r["figures"]["instructions_per_sample (stored)"]["change_pct"] for r in runs])
    assert gate_table()[row][1:4] == [failed, cost, instructions]


def test_the_numpy_passes_instruction_change_quoted_below_the_table_is_the_tables():
    said = re.search(r"\(the NumPy passes: (\S+ to \S+) above\)", GATE_PAGE.read_text(encoding="utf-8"))
    assert said, "docs/ci-gate.md no longer quotes the NumPy passes' instruction change"
    assert said.group(1) == gate_table()["three NumPy passes over each batch"][3]


def test_the_h100s_two_ranks_are_quoted_with_the_rates_their_ratio_is_made_of():
    summary = {s["ranks"]: s for s in load(H100 / "scaleout" / "scaleout.json")["summary"]}
    one, two = summary[1], summary[2]
    want = (f"{two['speedup_vs_1_rank']:.2f}x one rank's samples/s ({two['median_sum_samples_per_second']:,.0f} "
            f"summed over the ranks, {two['median_wall_samples_per_second']:,.0f} by the wall clock, against "
            f"{one['median_sum_samples_per_second']:,.0f})")
    assert want in RESULTS_PAGE.read_text(encoding="utf-8")


def test_the_h100_recheck_of_two_ranks_is_within_the_spread_it_claims():
    runs = load(H100 / "recheck" / "scaleout.json")["runs"]
    m = re.search(r"`recheck/scaleout\.json`, (\d+) repeats\): \*\*([\d.]+)x\*\* \(([\d,]+) against ([\d,]+); "
                  r"each run within (\d+)% of the other\)", RESULTS_PAGE.read_text(encoding="utf-8"))
    assert m, "bench/results/README.md no longer quotes the H100's re-run of two ranks"
    summary = {s["ranks"]: s for s in load(H100 / "recheck" / "scaleout.json")["summary"]}
    assert int(m.group(1)) == len(runs) // 2
    assert m.group(2) == f"{summary[2]['speedup_vs_1_rank']:.2f}"
    assert (m.group(3), m.group(4)) == (f"{summary[2]['median_sum_samples_per_second']:,.0f}",
                                        f"{summary[1]['median_sum_samples_per_second']:,.0f}")
    for ranks in (1, 2):
        rates = [r["sum_samples_per_second"] for r in runs if r["ranks"] == ranks]
        assert 100 * (max(rates) / min(rates) - 1) <= int(m.group(5))


def test_the_h100s_kernel_and_launch_times_are_its_overlap_files():
    d = load(H100 / "transfers" / "overlap.json")
    page = (ROOT / "cupy_nwt" / "experiments" / "README.md").read_text(encoding="utf-8")
    m = re.search(r"a chunk's kernel ran ([\d.]+) us against ([\d.]+) us to launch it", page)
    assert m, "cupy_nwt/experiments/README.md no longer quotes the H100's kernel and launch times"
    assert (m.group(1), m.group(2)) == (f"{d['stages']['kernel']['median'] * 1e6:.1f}",
                                        f"{d['launch_seconds']['kernel']['median'] * 1e6:.1f}")
