"""The gate's flows in throwaway projects: rounds, CPU of the workers, self-sized runs, committed baselines,
CI mode, another machine, a planted CPU slowdown, I/O-bound pipelines, unchanged reruns.

Runs are in-process (fast); slowdowns are planted CPU (``CUPY_NWT_PROOF_CPU_US``, an exact amount
of CPU per sample, through the gate study's own conftest: ``plant_slowdown``) or sleep, far beyond the
limits used, and no assertion is about time.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from plugin_projects import TINY_DATA, loader_test, make_project, plant_slowdown

from cupy_nwt.pytest_plugin import load_baseline

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester)


def _info(project: pytest.Pytester, name: str = "out.json") -> dict:
    return json.loads((project.path / name).read_text())["benchmarks"][0]["extra_info"]


def test_loader_benchmark_records_rounds_of_samples_per_second_cpu_and_memory(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=12))
    project.syspathinsert()
    result = project.runpytest_inprocess("--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    bench = json.loads((project.path / "out.json").read_text())["benchmarks"][0]
    info = bench["extra_info"]
    assert len(bench["stats"]["data"]) == 5  # one figure per round: wall seconds per 1,000 samples
    assert bench["options"]["timer"] == "wall_s_per_1k_samples"
    assert bench["stats"]["data"] == pytest.approx([1000 / r for r in info["samples_per_s_rounds"]])
    assert info["batches"] == 12 and info["samples"] == 96 and info["stopped"] == "fixed"
    assert info["epochs"] == 2  # 8 batches per epoch: the benchmark ran on into the next epoch
    assert info["samples_per_s"] == pytest.approx(96 / info["seconds"])
    assert info["device"] == "cpu" and info["num_workers"] == 0 and info["pin_path"] == "none"
    assert info["peak_memory_bytes"] > 1024**2  # at least this Python process
    assert info["rounds"] == 5 and len(info["samples_per_s_rounds"]) == 5  # 12 batches: 3, 3, 2, 2, 2
    assert len(info["cpu_s_per_1k_rounds"]) == 5 and info["cpu_s_per_1k"] > 0 and info["cpu_cores"] > 0
    assert info["pipeline"]["batch_size"] == 8 and info["pipeline"]["dataset"] == "tinydata.TinyImages"
    assert info["machine"]["usable_cpus"] >= 1 and 1 <= info["cpus_watched"] <= os.cpu_count()
    assert info["others_cores"] >= 0
    # where the kernel refuses to count instructions, the figure is absent and the reason given, never faked
    assert (info["instructions_per_sample"] is None) == bool(info["instructions_note"])
    result.stdout.fnmatch_lines(["*cupy_nwt benchmarks*", "benchmark * samples/s * CPU s/1k samples * verdict",
                                 "test_input_pipeline.py::test_pipeline * no baseline"])


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_cpu_of_the_workers_is_counted(project, monkeypatch, worker_type):
    """2 ms of CPU planted per sample, burnt in the workers: about 2 CPU seconds per 1,000 samples.

    The main process alone burns almost nothing here; without the workers' CPU the figure would be ~0.
    A window misses or gains at most the batches in flight at its edges (prefetch: 2 per worker), so
    with 40 timed batches at least 3/4 of the burn is inside it. Above, a worker counted twice would
    read 4 or more; the loader's own work beside the burn reached 3.2 on a loaded CI machine.
    """
    project.makepyfile(tinydata=TINY_DATA,
                       test_input_pipeline=loader_test(batches=40, workers=2, rounds=4,
                                                       extra=f", worker_type={worker_type!r}, persistent_workers=True"))
    project.syspathinsert()
    plant_slowdown(project)
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "2000")
    project.runpytest_inprocess("--benchmark-json=out.json").assert_outcomes(passed=1)
    info = _info(project)
    assert 1.5 <= info["cpu_s_per_1k"] < 4.0


def test_a_benchmark_sizes_its_own_run_within_the_time_cap(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline="""
        from tinydata import TinyImages

        def test_pipeline(loader_benchmark):
            r = loader_benchmark(TinyImages(), batch_size=8, device="cpu", max_seconds=0.5, target_noise=0.01)
            assert r.stopped == "time cap" and r.rounds == 6 and r.batches_per_round >= 1
    """)
    project.syspathinsert()
    result = project.runpytest_inprocess("--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    info = _info(project)
    assert info["target_noise_pct"] == 0.01 and info["decided_by"] in ("cpu_s_per_1k", "samples_per_s")
    assert len(info["samples_per_s_rounds"]) == 6  # the pilot: the fewest rounds a decision is made from


def test_a_baseline_saved_to_a_path_is_what_ci_compares_with(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=12, rounds=6))
    project.syspathinsert()
    saved = project.runpytest_inprocess("--nwt-save-baseline=ci/baseline.json")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["baseline saved: ci/baseline.json (1 benchmark(s) measured); commit it and gate with "
                                "--nwt-baseline=ci/baseline.json --nwt-require-baseline"])
    doc = json.loads((project.path / "ci" / "baseline.json").read_text())
    assert doc["format"] == "cupy_nwt.baseline/1" and doc["machine"]["usable_cpus"] >= 1
    (entry,) = doc["benchmarks"]
    assert entry["fullname"] == "test_input_pipeline.py::test_pipeline"
    assert len(entry["extra_info"]["cpu_s_per_1k_rounds"]) == 6 and entry["extra_info"]["pipeline"]["num_workers"] == 0
    ci = project.runpytest_inprocess("--nwt-baseline=ci/baseline.json", "--nwt-require-baseline")
    assert ci.ret == 0
    ci.stdout.fnmatch_lines(["*test_pipeline: samples/s * -> * (medians of 6|6 rounds, 95% interval *)*",
                             "*test_pipeline: CPU s/1k samples * -> * [[]baseline ci/baseline.json]"])
    ci.stdout.fnmatch_lines(["benchmark * samples/s * baseline * change * CPU s/1k samples * baseline * change * verdict",
                             "test_input_pipeline.py::test_pipeline * compared"])


def test_a_baseline_that_cannot_be_written_is_refused_before_the_run(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test())
    project.syspathinsert()
    (project.path / "ci").mkdir()
    (project.path / "notes.txt").write_text("")
    for where, line in (("ci", "ERROR: --nwt-save-baseline ci is a directory, not a file"),
                        ("notes.txt/b.json", "ERROR: --nwt-save-baseline notes.txt/b.json: */notes.txt is a file, not a folder")):
        result = project.runpytest_inprocess(f"--nwt-save-baseline={where}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([line])
        result.stdout.no_fnmatch_line("*passed*")


def test_comparing_with_and_saving_over_the_same_baseline_is_refused_before_the_run(project):
    """Judged against a file and saved over it, a regression failed once and became the next run's baseline."""
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test())
    project.syspathinsert()
    (project.path / "ci").mkdir()
    (project.path / "ci" / "baseline.json").write_text('{"benchmarks": []}')
    result = project.runpytest_inprocess("--nwt-baseline=ci/baseline.json", "--nwt-save-baseline=ci/../ci/baseline.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --nwt-baseline and --nwt-save-baseline name the same file (ci/baseline.json)*"])
    result.stdout.no_fnmatch_line("*passed*")
    assert (project.path / "ci" / "baseline.json").read_text() == '{"benchmarks": []}'


def test_a_baseline_whose_place_went_away_during_the_run_fails_it_in_one_line(project):
    """The test itself puts a file where the baseline's folder was to be made: the write at the end fails."""
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test() + "    open('ci', 'w').close()\n")
    project.syspathinsert()
    result = project.runpytest_inprocess("--nwt-save-baseline=ci/baseline.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["cupy_nwt could not write the baseline ci/baseline.json: *ci is a file, not a folder"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_ci_mode_fails_a_benchmark_missing_from_the_baseline(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test())
    project.syspathinsert()
    (project.path / "base.json").write_text(json.dumps({"format": "cupy_nwt.baseline/1", "benchmarks": [
        {"fullname": "test_other.py::test_gone", "extra_info": {"samples_per_s": 5.0}}]}))
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-require-baseline")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "test_input_pipeline.py::test_pipeline: no entry in the baseline base.json (--nwt-require-baseline); "
        "add it with: pytest*--nwt-save-baseline base.json",
        "*cupy_nwt throughput gate FAILED: 1 benchmark(s) have no baseline entry*",
    ])


def test_without_ci_mode_a_missing_baseline_is_a_note_that_says_how_to_make_it(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test())
    project.syspathinsert()
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=10")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["no baseline at base.json: throughput not gated this time; create it with: "
                                 "pytest*--nwt-save-baseline base.json"])


def test_a_baseline_from_another_machine_is_reported_not_failed(project, monkeypatch):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=12, rounds=6))
    project.syspathinsert()
    plant_slowdown(project)
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "0")
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    path = project.path / "base.json"
    doc = json.loads(path.read_text())
    doc["benchmarks"][0]["extra_info"]["machine"]["cpu_model"] = "Some Other CPU"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "3000")  # far slower: it would fail on the same machine
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20",
                                         "--nwt-require-baseline")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_pipeline: CPU s/1k samples * -> * baseline from another machine "
                                 "(cpu_model 'Some Other CPU' in the baseline, * here): not judged*",
                                 "cupy_nwt throughput gate judged nothing for 1 benchmark(s) "
                                 "(test_input_pipeline.py::test_pipeline): their baseline was made on another machine*"])
    result.stdout.no_fnmatch_line("*FAILED*")


@pytest.mark.parametrize("valgrind", ["installed", "missing", "counted here only", "plain benchmark"])
def test_clocks_against_a_stored_baseline_are_shown_and_the_gate_says_it_judged_nothing(project, monkeypatch, valgrind):
    """A pipeline's figures whose steady CPU rounds rose 10%: shown, not failed, and said so.

    The closing line names what would judge them: valgrind where it is missing; where it is installed and
    nothing was counted, why (installing valgrind again would not help); where this run was counted and
    the baseline was not, saving the baseline again. A plain ``benchmark`` carrying such figures (no
    ``loader_benchmark`` record) is told that nothing counts it, valgrind or not: write it with
    ``loader_benchmark``.
    """
    if valgrind == "installed" and shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed here")
    if valgrind == "missing":
        monkeypatch.setenv("PATH", str(project.mkdir("no-valgrind")))
    project.makepyfile(test_gate="""
        import json
        import os

        def test_pipeline(benchmark):
            benchmark.extra_info.update(json.loads(os.environ["FIGURES"]))
            benchmark.pedantic(lambda: None, rounds=3)
    """)
    wall = [4000.0, 1500.0, 7000.0, 2500.0, 5500.0, 2000.0, 6500.0, 3000.0]
    cpu = [0.300, 0.302, 0.298, 0.301, 0.299, 0.300, 0.303, 0.297]
    monkeypatch.setenv("FIGURES", json.dumps({"samples_per_s_rounds": wall, "cpu_s_per_1k_rounds": cpu,
                                              "cpu_cores": 1.5, "others_cores": 0.2}))
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    counted = {"instructions_counted_by": "callgrind", "instructions_samples": 16, "instructions_per_sample": 5e3}
    record = {"counted here only": counted, "plain benchmark": {}}.get(valgrind, {"instructions_counted_by": ""})
    monkeypatch.setenv("FIGURES", json.dumps({"samples_per_s_rounds": wall[::-1], "cpu_s_per_1k_rounds": [x * 1.1 for x in cpu],
                                              "cpu_cores": 1.5, "others_cores": 0.2, **record}))
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=5")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*test_pipeline: samples/s * (*%) (medians of 8|8 rounds, *); wall clock against a baseline from another "
        "time is information; --nwt-against REV judges it in the same job*",
        "*test_pipeline: CPU s/1k samples 0.3 -> 0.33 (+10.0%) (medians of 8|8 rounds, 95% interval +*); CPU time "
        "against a baseline from another time is information*",
        "*cupy_nwt throughput gate judged nothing for 1 benchmark(s) (test_gate.py::test_pipeline): their clocks "
        "against a baseline from another time are shown, not judged; "
        + {"missing": "install valgrind*",
           "installed": "nothing was counted exactly here: only loader_benchmark's pipelines are counted*",
           "counted here only": "the baseline was not counted as this run was *: save it again here with "
                                "--nwt-save-baseline*",
           "plain benchmark": "a plain benchmark times the test's own code, which nothing counts: write the "
                              "pipeline's test with loader_benchmark *"}[valgrind],
    ])
    result.stdout.no_fnmatch_line("*FAILED*")


def test_an_io_bound_pipeline_is_not_failed_on_a_stored_baselines_wall_clock(project, monkeypatch):
    """Four times slower on the wall clock, asleep: shown, never failed against a baseline from another time."""
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=8, rounds=4))
    project.syspathinsert()
    monkeypatch.setenv("SLOW_S", "0.005")  # 40 ms asleep per batch of 8: almost no CPU
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    monkeypatch.setenv("SLOW_S", "0.02")
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20",
                                          "--nwt-save-baseline=new.json")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_pipeline: samples/s * -> * (-*%) *; wall clock against a baseline from "
                                 "another time is information*"])
    # I/O-bound needs idle CPU beside the pipeline in both runs (docs/ci-gate.md): on a host busy enough to take
    # it (a CI runner whose neighbours steal 1.3 of its 2 cores) the pipeline may be waiting for a core instead
    runs = [load_baseline(project.path / name)["test_input_pipeline.py::test_pipeline"]["extra_info"]
            for name in ("base.json", "new.json")]
    if all(r["cpu_cores"] < 0.25 and r["cpus_watched"] - r["cpu_cores"] - r["others_cores"] >= 0.5 for r in runs):
        result.stdout.fnmatch_lines(["*judged nothing for 1 benchmark(s) (*): * they wait rather than compute, so "
                                     "no count of their work decides, or add --nwt-against REV*"])
    else:
        result.stdout.fnmatch_lines(["*judged nothing for 1 benchmark(s) (*): their clocks against a baseline from "
                                     "another time are shown, not judged*"])
        result.stdout.no_fnmatch_line("*they wait rather than compute*")


def test_an_unchanged_rerun_never_fails_the_gate_in_20_tries(project, monkeypatch):
    """A/A: the pipeline, unchanged, saved and compared 20 times at a 50% limit.

    On this shared machine a rerun may come out inconclusive; it must never fail.
    """
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=24, rounds=6))
    project.syspathinsert()
    for _ in range(20):
        project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
        rerun = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=50")
        lines = [x for x in rerun.outlines if x.startswith("test_input_pipeline.py::test_pipeline: ")]
        assert rerun.ret == pytest.ExitCode.OK, lines
        assert len(lines) == 2 and not any(" fell " in x or " rose " in x for x in lines)
        assert all("(medians of 6|6 rounds, 95% interval " in x for x in lines)
        rerun.stdout.fnmatch_lines(["*cupy_nwt throughput gate judged nothing for 1 benchmark(s)*"])
