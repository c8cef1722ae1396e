"""The pytest plugin: fixtures on pytest-benchmark, device time as its timer, the throughput gate.

Throwaway projects run through pytester. Runs that only need this process's state run in-process
(fast); runs whose point is a fresh interpreter (the entry point, the real GPU probe, workers)
run in a subprocess.
"""

from __future__ import annotations

import glob
import json
import pickle
from importlib.metadata import entry_points

import pytest
from plugin_projects import TINY_DATA, loader_test, make_project

from cupy_nwt import BaselineError, CupyNwtError, cuda
from cupy_nwt.pytest_plugin import (
    DEVICE_CLOCK,
    Comparison,
    DeviceClock,
    _parts,
    compare_throughput,
    load_baseline,
)
from cupy_nwt.pytest_plugin._parts import batch_len as _batch_len
from cupy_nwt.pytest_plugin._parts import transfer_args as _transfer_args

pytest_plugins = ["pytester"]

@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester)


# ---------------------------------------------------------------- pure parts


def test_entry_point_registers_the_plugin():
    eps = entry_points(group="pytest11")
    assert any(ep.name == "cupy_nwt" and ep.value == "cupy_nwt.pytest_plugin" for ep in eps)


def test_device_clock_moves_only_by_device_time():
    clock = DeviceClock()
    assert clock() == 0.0
    clock.advance(0.25)
    clock.advance(0.5)
    assert clock() == pytest.approx(0.75)
    with pytest.raises(ValueError, match="device time must be >= 0"):
        clock.advance(-1e-3)
    with pytest.raises(ValueError):
        clock.advance(float("nan"))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("0", "h2d", True, 5, 1), "size must be positive"),
        (("lots", "h2d", True, 5, 1), "not a size"),
        ((4096, "sideways", True, 5, 1), "direction must be 'h2d' or 'd2h'"),
        ((4096, "h2d", "yes", 5, 1), "pinned must be True or False"),
        ((4096, "h2d", True, 0, 1), "repeats must be an int >= 1"),
        ((4096, "h2d", True, 5, -1), "warmup must be an int >= 0"),
    ],
)
def test_transfer_arguments_are_checked_with_clear_messages(args, match):
    with pytest.raises(ValueError, match=match):
        _transfer_args(*args)


def test_transfer_arguments_accept_sizes_with_units():
    assert _transfer_args("64MiB", "D2H", False, 3, 0) == (64 * 1024**2, "d2h")


def test_batch_len_reads_the_leading_dimension_of_the_first_array():
    np = pytest.importorskip("numpy")
    assert _batch_len((np.zeros((7, 3)), np.zeros(7))) == 7
    assert _batch_len({"image": np.zeros((5, 2)), "label": np.zeros(5)}) == 5
    assert _batch_len([[np.zeros((0,))], np.zeros((4, 1))]) == 0
    assert _batch_len(("text", 3)) is None


def _entry(fullname: str, **extra: float) -> dict:
    return {"fullname": fullname, "extra_info": extra}


def test_compare_pairs_throughput_keys_by_fullname():
    baseline = {"t.py::a": _entry("t.py::a", gbps=1000.0, other=5),
                "t.py::b": _entry("t.py::b", gbps=20.0),
                "t.py::gone": _entry("t.py::gone", gbps=1.0)}
    current = {"t.py::a": {"gbps": 400.0}, "t.py::b": {"gbps": 21.0}, "t.py::new": {"gbps": 3.0}}
    got = {(c.fullname, c.key): c for c in compare_throughput(current, baseline, "base.json")}
    assert set(got) == {("t.py::a", "gbps"), ("t.py::b", "gbps")}
    a, b = got["t.py::a", "gbps"], got["t.py::b", "gbps"]
    assert a.change_pct == pytest.approx(-60.0)
    assert a.regressed(50) and not a.regressed(60) and not a.regressed(None)
    assert not b.regressed(1)
    msg = a.message(50)
    assert "t.py::a" in msg and "GB/s fell 60.0% (more than 50%)" in msg
    assert "1,000.00 -> 400.00" in msg and "base.json" in msg
    assert "GB/s 20.00 -> 21.00 (+5.0%)" in b.message(50)


@pytest.mark.parametrize("bad", [0, -3.0, float("nan"), float("inf"), None, True, "12"])
def test_compare_ignores_figures_that_are_not_positive_numbers(bad):
    baseline = {"t::x": _entry("t::x", gbps=bad)}
    assert compare_throughput({"t::x": {"gbps": 5.0}}, baseline, "b") == []
    assert compare_throughput({"t::x": {"gbps": bad}}, {"t::x": _entry("t::x", gbps=5.0)}, "b") == []


@pytest.mark.parametrize("text", ["[" * 100000 + "]" * 100000, '{"benchmarks": [], "n": ' + "9" * 5000 + "}"])
def test_load_baseline_refuses_json_past_the_parsers_limits_in_one_line(tmp_path, text):
    """Nesting past the parser's stack and an int past Python's digit limit were a bare RecursionError and
    ValueError, not the BaselineError naming the file."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(BaselineError, match=r"bad\.json is not readable JSON"):
        load_baseline(bad)


def test_comparison_to_dict_carries_the_change():
    d = Comparison("t::x", "gbps", 10.0, 12.5, "b").to_dict()
    assert d["change_pct"] == pytest.approx(25.0) and d["source"] == "b"


def test_load_baseline_explains_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_baseline(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BaselineError, match="not readable JSON") as err:
        load_baseline(bad)
    assert isinstance(err.value, CupyNwtError) and isinstance(err.value, ValueError)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"results": []}))
    with pytest.raises(BaselineError, match="is not a baseline"):
        load_baseline(other)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"benchmarks": [_entry("t::x", gbps=1.0)]}))
    assert load_baseline(good)["t::x"]["extra_info"] == {"gbps": 1.0}


@pytest.mark.parametrize(("info", "match"), [
    ({"samples_per_s": -3.0}, "t::x: samples_per_s is -3.0, not a positive number"),
    ({"samples_per_s": "fast"}, "t::x: samples_per_s is 'fast'"),
    ({"cpu_s_per_1k_rounds": [0.3, 0.0]}, "cpu_s_per_1k_rounds holds a figure that is not a positive number"),
    ({"cpu_s_per_1k_rounds": "0.3"}, "cpu_s_per_1k_rounds is not a list"),
    ({"others_cores": -1}, "others_cores is -1, not a number of cores"),
    ({"machine": {"usable_cpus": 2.5}}, "machine.usable_cpus is not a whole number"),
    ({"cpus_watched": 0}, "cpus_watched is 0, not a whole number of CPUs"),
    ({"machine": {"cpu_model": 7}}, "machine.cpu_model is not text"),
    ({"pipeline": {"batch_size": [1, 2]}}, "'pipeline' is not an object of plain values"),
    ({"instructions_counted_by": "guess"}, "instructions_counted_by is 'guess', not 'callgrind', 'perf' or ''"),
    ({"instructions_samples": 0.5}, "instructions_samples is 0.5, not a whole number of samples"),
])
def test_a_baseline_read_back_is_checked_before_it_is_believed(tmp_path, info, match):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": "cupy_nwt.baseline/1", "benchmarks": [{"fullname": "t::x", "extra_info": info}]}))
    with pytest.raises(BaselineError, match=match):
        load_baseline(path)


def test_a_baseline_cost_must_be_what_its_components_weigh_up_to(tmp_path):
    """A cost raised by hand (to let a regression through) no longer matches the counts it was weighed from."""
    from cupy_nwt.pytest_plugin._cost import MODEL, Cost

    parts = {"instructions": 600_000.0, "l1_misses": 15_000.0, "ll_misses": 450.0, "page_faults": 3.0, "syscalls": 2.0}
    path = tmp_path / "base.json"

    def write(cost: float, model: str = MODEL) -> None:
        info = {"cost_per_sample": cost, "cost_components": parts, "cost_model": model}
        path.write_text(json.dumps({"format": "cupy_nwt.baseline/1", "benchmarks": [{"fullname": "t::x", "extra_info": info}]}))

    write(Cost(**parts).total)
    assert load_baseline(path)["t::x"]["extra_info"]["cost_per_sample"] == Cost(**parts).total
    write(Cost(**parts).total * 1.2)
    with pytest.raises(BaselineError, match=r"t::x: cost_per_sample is 1[\d.]+, but its components weigh up to 9[\d.]+"):
        load_baseline(path)
    write(Cost(**parts).total * 1.2, model="cycles(older weights)")  # weighed otherwise: shown, never judged
    assert "t::x" in load_baseline(path)


@pytest.mark.parametrize("edit", [{}, None], ids=["emptied", "removed"])
def test_a_baseline_cost_without_its_components_is_refused(tmp_path, edit):
    """Raising the cost by hand and emptying or dropping its components left nothing to weigh it against: a
    7x instruction regression passed. Every cost the gate writes comes with its components."""
    from cupy_nwt.pytest_plugin._cost import MODEL

    info = {"cost_per_sample": 1_414_392.5, "cost_model": MODEL, **({} if edit is None else {"cost_components": edit})}
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": "cupy_nwt.baseline/1", "benchmarks": [{"fullname": "t::x", "extra_info": info}]}))
    with pytest.raises(BaselineError, match=r"t::x: cost_per_sample is 1414392.5 without the components"):
        load_baseline(path)


def test_a_baseline_of_another_format_is_refused(tmp_path):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": "cupy_nwt.baseline/9", "benchmarks": []}))
    with pytest.raises(BaselineError, match="this cupy_nwt reads 'cupy_nwt.baseline/1'"):
        load_baseline(path)


# ---------------------------------------------------------------- transfer_benchmark in throwaway projects


TRANSFER_TEST = """
import pytest

@pytest.mark.benchmark(group="copies")
def test_h2d(transfer_benchmark):
    r = transfer_benchmark("1MiB", direction="h2d", pinned=True, repeats=4, warmup=2)
    assert r.gbps > 0
"""


def test_without_gpu_transfer_benchmarks_skip_with_the_probes_reason(project, monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: planted reason"))
    project.makepyfile(TRANSFER_TEST)
    result = project.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs a GPU: no usable GPU: planted reason*"])
    result.stdout.no_fnmatch_line("*was not used at all*")


class _FakeCopyTimer:
    """Stands in for the CUDA buffers: hands out known device times, so we can see where they land."""

    TIMES = [0.004, 0.003, 0.002, 0.001, 0.005, 0.002]  # 2 warm-up, then 4 timed

    def __init__(self, nbytes: int, direction: str, pinned: bool) -> None:
        self.times = iter(self.TIMES)

    def once(self) -> float:
        return next(self.times)

    def verified(self) -> bool:
        return True

    def link_gbps(self) -> float:
        return 31.5

    def close(self) -> None:
        pass


class _SteadyCopyTimer(_FakeCopyTimer):
    TIMES = (0.004, 0.003, 0.00200, 0.00201, 0.00199, 0.00202)


class _SlowCopyTimer(_FakeCopyTimer):
    TIMES = tuple(2 * t for t in _SteadyCopyTimer.TIMES)


def test_copy_benchmarks_are_gated_on_their_repeats(project, monkeypatch):
    """The GPU fixture's gate path without a GPU: known device times, halved GB/s, caught."""
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    project.makepyfile(TRANSFER_TEST)
    monkeypatch.setattr(_parts, "CopyTimer", _SteadyCopyTimer)
    project.runpytest_inprocess("--benchmark-json=base.json").assert_outcomes(passed=1)
    info = json.loads((project.path / "base.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["gbps_rounds"] == pytest.approx([1024**2 / t / 1e9 for t in _SteadyCopyTimer.TIMES[2:]])
    monkeypatch.setattr(_parts, "CopyTimer", _SlowCopyTimer)
    bad = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*test_h2d: GB/s fell 50.0% (more than 20%): * (medians of 4|4 rounds, 95% interval *)*"])


def test_pytest_benchmark_records_the_device_time_not_the_wall_time(project, monkeypatch):
    """Pins the timer route: the saved stats are exactly the CUDA-event times the copies reported."""
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    monkeypatch.setattr(_parts, "CopyTimer", _FakeCopyTimer)
    project.makepyfile(TRANSFER_TEST)
    result = project.runpytest_inprocess("--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    bench = json.loads((project.path / "out.json").read_text())["benchmarks"][0]
    timed = _FakeCopyTimer.TIMES[2:]
    assert bench["stats"]["data"] == pytest.approx(timed, abs=1e-12)
    assert bench["options"]["timer"] == "device_clock"
    assert bench["group"] == "copies"  # the user's own mark survives
    info = bench["extra_info"]
    assert info["timing"] == "cuda-events" and info["repeats"] == 4
    assert info["median_s"] == pytest.approx(0.002) and info["min_s"] == pytest.approx(0.001)
    assert info["gbps"] == pytest.approx(1024**2 / 0.002 / 1e9)
    assert info["link_fraction"] == pytest.approx(info["gbps"] / 31.5)
    assert DEVICE_CLOCK() >= sum(_FakeCopyTimer.TIMES) - 1e-12


def test_a_transfer_benchmark_fetched_by_name_times_device_time_too(project, monkeypatch):
    """Reached at run time, after pytest-benchmark made the test's ``benchmark``: the timer is set on it
    directly (its ``_timer``, which this pins), so the stats are still the copies' device times."""
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    monkeypatch.setattr(_parts, "CopyTimer", _FakeCopyTimer)
    project.makepyfile("""
        def test_dyn(request):
            r = request.getfixturevalue("transfer_benchmark")("1MiB", repeats=4, warmup=2)
            assert r.gbps > 0
    """)
    result = project.runpytest_inprocess("--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    bench = json.loads((project.path / "out.json").read_text())["benchmarks"][0]
    assert bench["stats"]["data"] == pytest.approx(_FakeCopyTimer.TIMES[2:], abs=1e-12)
    assert bench["options"]["timer"] == "device_clock"


@pytest.mark.gpu
def test_transfer_benchmark_on_a_real_gpu(project):
    project.makepyfile("""
        import pytest

        @pytest.mark.parametrize("direction", ["h2d", "d2h"])
        @pytest.mark.parametrize("pinned", [True, False])
        def test_copy(transfer_benchmark, direction, pinned):
            r = transfer_benchmark("8MiB", direction=direction, pinned=pinned, repeats=5, warmup=2)
            assert r.gbps > 0 and r.median_s > 0
    """)
    result = project.runpytest_subprocess("--benchmark-json=out.json")
    result.assert_outcomes(passed=4)
    for bench in json.loads((project.path / "out.json").read_text())["benchmarks"]:
        assert bench["options"]["timer"] == "device_clock"
        assert len(bench["stats"]["data"]) == 5
        assert bench["extra_info"]["gbps"] == pytest.approx(8 * 1024**2 / bench["extra_info"]["median_s"] / 1e9)


# ---------------------------------------------------------------- the gate on any benchmark's extra_info


GATED_TEST = """
import os

def test_pipeline(benchmark):
    benchmark.extra_info["gbps"] = float(os.environ["RATE"])
    benchmark.pedantic(lambda: None, rounds=3)
"""


def _run(project, monkeypatch, rate: float, *args: str):
    monkeypatch.setenv("RATE", str(rate))
    return project.runpytest_inprocess(*args)


def test_gate_passes_within_the_allowed_drop_and_fails_beyond_it(project, monkeypatch):
    project.makepyfile(test_gate=GATED_TEST)
    _run(project, monkeypatch, 1000, "--benchmark-autosave").assert_outcomes(passed=1)

    ok = _run(project, monkeypatch, 850, "--benchmark-compare", "--nwt-throughput-drop=20")
    assert ok.ret == 0
    ok.stdout.fnmatch_lines(["*cupy_nwt throughput*", "*test_gate.py::test_pipeline: GB/s 1,000.00 -> 850.00 (-15.0%)*"])

    bad = _run(project, monkeypatch, 700, "--benchmark-compare", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines([
        "*test_gate.py::test_pipeline: GB/s fell 30.0% (more than 20%): 1,000.00 -> 700.00*0001_*",
        "*cupy_nwt throughput gate FAILED: 1 figure(s) fell or rose by more than their limit*",
    ])


@pytest.mark.parametrize(("edit", "why"), [
    ({"gbps": "fast"}, "gbps is 'fast', not a positive number"),
    ({"gbps_rounds": [1000.0, -1.0]}, "gbps_rounds holds a figure that is not a positive number"),
    ({"machine": [1, 2]}, "'machine' is not an object"),
])
def test_a_run_benchmark_compare_reads_back_is_checked_before_it_is_believed(project, monkeypatch, edit, why):
    project.makepyfile(test_gate=GATED_TEST)
    _run(project, monkeypatch, 1000, "--benchmark-autosave").assert_outcomes(passed=1)
    (saved,) = (project.path / ".benchmarks").glob("*/0001_*.json")
    doc = json.loads(saved.read_text())
    doc["benchmarks"][0]["extra_info"].update(edit)
    saved.write_text(json.dumps(doc))
    result = _run(project, monkeypatch, 100, "--benchmark-compare", "--nwt-throughput-drop=20")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --benchmark-compare: *0001_*.json: test_gate.py::test_pipeline: {why} "
                                 "(save a new run with --benchmark-autosave)"])
    result.stdout.no_fnmatch_line("*passed*")


def test_gate_against_an_explicit_baseline_file(project, monkeypatch):
    project.makepyfile(test_gate=GATED_TEST)
    _run(project, monkeypatch, 50, "--benchmark-json=base.json").assert_outcomes(passed=1)
    bad = _run(project, monkeypatch, 10, "--nwt-baseline=base.json", "--nwt-throughput-drop=50")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*GB/s fell 80.0% (more than 50%): 50.00 -> 10.00 [[]baseline base.json]*"])
    # A baseline without a drop limit reports the change and never fails.
    info = _run(project, monkeypatch, 10, "--nwt-baseline=base.json")
    assert info.ret == 0
    info.stdout.fnmatch_lines(["*GB/s 50.00 -> 10.00 (-80.0%)*"])


ROUNDS_TEST = """
import json
import os

def test_pipeline(benchmark):
    rounds = json.loads(os.environ["ROUNDS"])
    benchmark.extra_info["gbps"] = sum(rounds) / len(rounds)
    benchmark.extra_info["gbps_rounds"] = rounds
    benchmark.pedantic(lambda: None, rounds=3)
"""


def test_gate_says_inconclusive_when_the_rounds_are_noisier_than_the_limit(project, monkeypatch):
    project.makepyfile(test_gate=ROUNDS_TEST)
    noisy = [1000.0, 600.0, 1400.0, 800.0, 1200.0]
    monkeypatch.setenv("ROUNDS", json.dumps(noisy))
    project.runpytest_inprocess("--benchmark-json=base.json").assert_outcomes(passed=1)
    monkeypatch.setenv("ROUNDS", json.dumps([0.7 * x for x in noisy]))
    unsure = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert unsure.ret == 0
    unsure.stdout.fnmatch_lines([
        ("*test_gate.py::test_pipeline: GB/s inconclusive, the noise reaches past the 20% limit: "
         "1,000.00 -> 700.00 (-30.0%) (medians of 5|5 rounds, 95% interval *) [[]baseline base.json]"),
        "*cupy_nwt throughput gate INCONCLUSIVE for 1 figure(s)*not a failure*",
    ])
    unsure.stdout.no_fnmatch_line("*FAILED*")
    monkeypatch.setenv("ROUNDS", json.dumps([0.05 * x for x in noisy]))  # a drop far beyond the noise
    bad = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*GB/s fell 95.0% (more than 20%): 1,000.00 -> 50.00*",
                              "*cupy_nwt throughput gate FAILED: 1 figure(s)*"])


@pytest.mark.filterwarnings("ignore:Can't compare. No benchmark files")
def test_gate_with_no_saved_run_yet_says_so_and_passes(project, monkeypatch):
    project.makepyfile(test_gate=GATED_TEST)
    result = _run(project, monkeypatch, 5, "--benchmark-compare", "--nwt-throughput-drop=10")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--benchmark-compare found no saved run: throughput not gated this time*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nwt-throughput-drop=20"], "*--nwt-throughput-drop needs something to compare with*"),
        (["--nwt-require-baseline"], "*--nwt-require-baseline needs --nwt-baseline FILE*"),
        (["--nwt-baseline=nope.json", "--nwt-require-baseline"],
         "no baseline at nope.json (--nwt-require-baseline): create it on this machine with: pytest *"
         "--nwt-save-baseline nope.json and commit it"),
    ],
)
def test_gate_usage_errors_are_one_readable_line(project, args, message):
    project.makepyfile(test_gate=GATED_TEST)
    result = project.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_the_command_that_makes_a_missing_baseline_drops_the_comparisons_values_too(project):
    project.makepyfile(test_gate=GATED_TEST)
    result = project.runpytest_inprocess("--benchmark-compare", "0001", "--benchmark-compare-fail", "min:5%",
                                         "--nwt-baseline", "nope.json", "--nwt-require-baseline", "test_gate.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [x for x in result.stderr.lines if x.startswith("ERROR: ")]
    command = line.split("create it on this machine with: ", 1)[1].removesuffix(" and commit it")
    assert command.split()[0] == "pytest" and command.endswith(" test_gate.py --nwt-save-baseline nope.json"), command
    assert "0001" not in command and "min:5%" not in command and "compare" not in command


@pytest.mark.parametrize(("off", "why"), [
    ("--benchmark-disable", "pytest-benchmark records nothing here (--benchmark-disable, or pytest-xdist's -n, *"),
    ("--benchmark-skip", "--benchmark-skip skips every benchmark"),
])
def test_a_gate_whose_benchmarks_record_nothing_refuses_to_start(project, monkeypatch, off, why):
    """A project's addopts often hold --benchmark-disable: the gate must not then pass on nothing."""
    project.makepyfile(test_gate=GATED_TEST)
    _run(project, monkeypatch, 1000, "--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    for args, options in ((["--nwt-baseline=base.json", "--nwt-require-baseline", "--nwt-throughput-drop=5"],
                           "--nwt-throughput-drop and --nwt-require-baseline need"),
                          (["--nwt-save-baseline=new.json"], "--nwt-save-baseline needs")):
        result = _run(project, monkeypatch, 10, off, *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: {options} the benchmarks' figures, but {why}"])
    assert _run(project, monkeypatch, 10, off).ret == pytest.ExitCode.OK  # without the gate: as pytest-benchmark does


@pytest.mark.parametrize("value", ["abc", "0", "100", "-5"])
def test_gate_rejects_a_drop_that_is_not_a_percentage(project, value):
    project.makepyfile(test_gate=GATED_TEST)
    result = project.runpytest_inprocess(f"--nwt-throughput-drop={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --nwt-throughput-drop*"])


# ---------------------------------------------------------------- fresh interpreters


def test_a_project_using_both_fixtures_passes_in_a_fresh_interpreter(project):
    """The entry point alone loads the plugin; the transfer test skips with the real probe's reason."""
    project.makepyfile(
        tinydata=TINY_DATA,
        test_input_pipeline=loader_test(workers=1),
        test_transfer=TRANSFER_TEST,
    )
    result = project.runpytest_subprocess("-rs")
    status = cuda.gpu_status()
    if status.available:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines([f"*SKIPPED*test_transfer.py*needs a GPU: {glob.escape(status.reason)}*"])


def test_fixtures_are_listed_from_a_fresh_install(project):
    result = project.runpytest_subprocess("--fixtures")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "*fixtures defined from cupy_nwt.pytest_plugin*",
        "transfer_benchmark -- *pytest_plugin/__init__.py:*",
        "*Factory: ``transfer_benchmark(nbytes, direction=\"h2d\"*",
        "loader_benchmark -- *pytest_plugin/__init__.py:*",
        "*Factory: ``loader_benchmark(dataset, batches=None, warmup=2, rounds=None*",
    ])


def test_fresh_run_without_gpu_skips_transfers_with_the_probes_reason(project, monkeypatch):
    """CUPY_NWT_DISABLE_GPU makes the no-GPU path reachable on a GPU machine too."""
    project.makepyfile(test_transfer=TRANSFER_TEST)
    monkeypatch.setenv("CUPY_NWT_DISABLE_GPU", "1")
    result = project.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*needs a GPU: the GPU is disabled by CUPY_NWT_DISABLE_GPU*"])
    result.stdout.no_fnmatch_line("*was not used at all*")


def test_copy_timer_reads_the_link_of_the_gpu_it_copied_on(monkeypatch):
    asked = []
    monkeypatch.setattr(cuda, "current_device", lambda: 1)
    monkeypatch.setattr(cuda, "pcie_link", lambda device=0: asked.append(device) or cuda.PcieLink(4, 16, 5, 16, "nvml"))
    assert _parts.CopyTimer.link_gbps(None) == pytest.approx(63.0, rel=5e-3)
    assert asked == [1]  # the timer's buffers live on the current GPU, not necessarily GPU 0
