"""A gate that passes must have judged what its baseline can judge (``--nwt-require-baseline``): a baseline
entry that gave no figure this run, an entry with no figure to compare, a pipeline counted exactly in the
baseline but not now (it stopped pickling, a count ran past its time) or counted by other software all fail
it, each in one line naming why; an entry the session did not run (removed, deselected by ``-k`` or a shard) is listed. The
exact cost ignores what of a machine callgrind's fixed simulated one does not see (memory, GPU, link).
Saving keeps the file's entries not run here, and a failed run saves nothing.

The judgement's cases run on figures made up as the counting writes them; the flows in throwaway projects
written as a CI team writes them, with a plain ``benchmark`` (fast) whose figures the test records.
"""

from __future__ import annotations

import json

import pytest
from plugin_projects import make_project
from test_gate_cost import PASSES, PLAIN, _counted, _judged

from cupy_nwt.pytest_plugin._coverage import coverage
from cupy_nwt.pytest_plugin._gate import compare_throughput

pytest_plugins = ["pytester"]

SOFTWARE = {"python": "3.11.7", "numpy": "2.2.0", "cupy_nwt": "0.1.0", "valgrind": "valgrind-3.22.0"}


def _with(info: dict, **machine_or_software: object) -> dict:
    out = {**info, "machine": {**info["machine"]}, "count_software": dict(SOFTWARE)}
    for k, v in machine_or_software.items():
        (out["count_software"] if k in SOFTWARE else out["machine"])[k] = v
    return out


def test_the_exact_cost_is_judged_across_machines_that_differ_only_in_what_a_count_does_not_see():
    old = _with(_counted(PLAIN), memory_gib=24, gpu_name="")
    cost = _judged(old, _with(_counted(PASSES), memory_gib=32, gpu_name="NVIDIA H100"))["cost_per_sample"]
    assert cost.regressed(5)
    other_cpu = _judged(old, _with(_counted(PASSES), cpu_model="Y"))["cost_per_sample"].judgement(5)
    assert other_cpu.verdict == "other-machine" and "cpu_model 'X' in the baseline, 'Y' here" in other_cpu.reason


def test_a_count_by_other_software_is_not_judged_and_says_what_changed():
    j = _judged(_with(_counted(PLAIN)), _with(_counted(PASSES), numpy="2.3.0"))["cost_per_sample"].judgement(5)
    assert j.verdict == "reported" and j.reason == ("counted by other software in the baseline "
                                                   "(numpy '2.2.0' in the baseline, '2.3.0' here)")


def _coverage(old: dict, new: dict, *, require: bool = True, collected=("t::a",)):
    baseline = {"t::a": {"fullname": "t::a", "extra_info": old}}
    current = {"t::a": new} if new else {}
    comparisons = compare_throughput(current, baseline, "b.json", instructions_limit_pct=1.0)
    return coverage(current, baseline, set(collected), comparisons, 5.0, require, "b.json")


@pytest.mark.parametrize(("new", "why"), [
    ({**_counted(None), "instructions_counted_by": "", "instructions_per_sample": None,
      "instructions_note": "the pipeline's batch_transform does not pickle", "cpu_s_per_1k": 0.2},
     "not judged exactly here (instructions not counted: the pipeline's batch_transform does not pickle)"),
    (_with(_counted(PASSES), numpy="2.3.0"), "not judged exactly here (counted by other software in the baseline"),
    (_with(_counted(PASSES), cpu_model="Y"), "not judged exactly here (baseline from another machine"),
])
def test_an_exact_baseline_not_judged_exactly_now_fails_under_require(new, why):
    lines, failing = _coverage({**_with(_counted(PLAIN)), "cpu_s_per_1k": 0.2}, new)
    assert failing == ["t::a"] and len(lines) == 1
    text, verdict = lines[0]
    assert verdict == "regressed" and text.startswith("t::a: counted exactly in the baseline b.json, ") and why in text
    assert _coverage({**_with(_counted(PLAIN)), "cpu_s_per_1k": 0.2}, new, require=False)[1] == []  # without require: a line, no failure


def test_an_entry_with_no_figure_to_compare_fails_under_require():
    lines, failing = _coverage({"machine": {"cpu_model": "X"}}, _counted(PLAIN))
    assert failing == ["t::a"] and "holds no figure this run measured: not judged" in lines[0][0]


def test_an_entry_not_run_in_this_session_is_listed_not_failed():
    lines, failing = _coverage(_counted(PLAIN), None, collected=())
    assert failing == [] and lines == [("1 baseline entry of b.json not run in this session (removed, renamed, "
                                        "or not selected): t::a", "note")]


# ------------------------------------------------------------------ flows, as a CI job runs them

CHEAP = """
import os

import pytest


@pytest.mark.parametrize("name", ["a", "b"])
def test_figure(benchmark, name):
    if os.environ.get("SKIP_" + name.upper()):
        pytest.skip("as a CI job skips a test it cannot run here")
    if os.environ.get("FAIL_" + name.upper()):
        raise AssertionError("a test that fails")
    benchmark.extra_info["gbps"] = 10.0
    benchmark(lambda: None)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    make_project(pytester).makepyfile(test_cheap=CHEAP)
    return pytester


def test_a_baseline_entry_skipped_this_run_fails_the_gate_and_one_left_out_by_k_is_listed(project, monkeypatch):
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=2)
    monkeypatch.setenv("SKIP_B", "1")
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-require-baseline",
                                         "--nwt-throughput-drop=5")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["test_cheap.py::test_figure[[]b[]]: in the baseline base.json, but it gave no "
                                 "figures in this run (skipped, failed, or its benchmark fixture was not called): "
                                 "not judged (--nwt-require-baseline)",
                                 "*cupy_nwt throughput gate FAILED: 1 benchmark(s) of the baseline were not judged*"])
    monkeypatch.delenv("SKIP_B")
    shard = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-require-baseline",
                                        "--nwt-throughput-drop=5", "--deselect", "test_cheap.py::test_figure[b]")
    assert shard.ret == 0
    shard.stdout.fnmatch_lines(["1 baseline entry of base.json not run in this session (removed, renamed, or not "
                                "selected): test_cheap.py::test_figure[[]b[]]"])


def test_a_failed_run_saves_no_baseline_and_a_partial_run_keeps_the_other_entries(project, monkeypatch):
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=2)
    first = json.loads((project.path / "base.json").read_text())
    monkeypatch.setenv("FAIL_B", "1")
    failed = project.runpytest_inprocess("--nwt-save-baseline=base.json")
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    failed.stdout.fnmatch_lines(["baseline base.json not written: this run failed (exit status 1), and a baseline "
                                 "must come from a run that passed"])
    assert json.loads((project.path / "base.json").read_text()) == first
    monkeypatch.delenv("FAIL_B")
    part = project.runpytest_inprocess("--nwt-save-baseline=base.json", "--deselect", "test_cheap.py::test_figure[b]")
    part.stdout.fnmatch_lines(["baseline saved: base.json (1 benchmark(s) measured; 1 kept from the file as they "
                               "were, not run here)*"])
    names = [b["fullname"] for b in json.loads((project.path / "base.json").read_text())["benchmarks"]]
    assert names == ["test_cheap.py::test_figure[a]", "test_cheap.py::test_figure[b]"]
