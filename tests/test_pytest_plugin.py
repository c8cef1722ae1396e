"""The pytest plugin: fixtures on pytest-benchmark, device time as its timer, the throughput gate.

Throwaway projects run through pytester. Runs that only need this process's state run in-process
(fast); runs whose point is a fresh interpreter (the entry point, the real GPU probe, workers)
run in a subprocess.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest

from cupy_nwt import cuda, pytest_plugin
from cupy_nwt.pytest_plugin import (
    DEVICE_CLOCK,
    Comparison,
    DeviceClock,
    _transfer_args,
    compare_throughput,
    load_baseline,
)
from cupy_nwt.pytest_plugin._parts import batch_len as _batch_len

pytest_plugins = ["pytester"]

# cpuinfo (pytest-benchmark's machine info) spawns a process and takes ~1 s per run: not needed here.
FAST_CONFTEST = """
def pytest_benchmark_generate_machine_info(config):
    return {"node": "pytester"}
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(FAST_CONFTEST)
    # In-process runs drop the modules they imported; hypothesis's plugin would re-import per run.
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n")
    return pytester


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
    baseline = {"t.py::a": _entry("t.py::a", samples_per_s=1000.0, other=5),
                "t.py::b": _entry("t.py::b", gbps=20.0),
                "t.py::gone": _entry("t.py::gone", gbps=1.0)}
    current = {"t.py::a": {"samples_per_s": 400.0}, "t.py::b": {"gbps": 21.0}, "t.py::new": {"gbps": 3.0}}
    got = {(c.fullname, c.key): c for c in compare_throughput(current, baseline, "base.json")}
    assert set(got) == {("t.py::a", "samples_per_s"), ("t.py::b", "gbps")}
    a, b = got["t.py::a", "samples_per_s"], got["t.py::b", "gbps"]
    assert a.change_pct == pytest.approx(-60.0)
    assert a.regressed(50) and not a.regressed(60) and not a.regressed(None)
    assert not b.regressed(1)
    msg = a.message(50)
    assert "t.py::a" in msg and "samples/s fell 60.0% (more than 50%)" in msg
    assert "1,000.00 -> 400.00" in msg and "base.json" in msg
    assert "GB/s 20.00 -> 21.00 (+5.0%)" in b.message(50)


@pytest.mark.parametrize("bad", [0, -3.0, float("nan"), float("inf"), None, True, "12"])
def test_compare_ignores_figures_that_are_not_positive_numbers(bad):
    baseline = {"t::x": _entry("t::x", gbps=bad)}
    assert compare_throughput({"t::x": {"gbps": 5.0}}, baseline, "b") == []
    assert compare_throughput({"t::x": {"gbps": bad}}, {"t::x": _entry("t::x", gbps=5.0)}, "b") == []


def test_comparison_to_dict_carries_the_change():
    d = Comparison("t::x", "gbps", 10.0, 12.5, "b").to_dict()
    assert d["change_pct"] == pytest.approx(25.0) and d["source"] == "b"


def test_load_baseline_explains_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_baseline(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(pytest.UsageError, match="not readable JSON"):
        load_baseline(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"results": []}))
    with pytest.raises(pytest.UsageError, match="is not a baseline"):
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
    ({"machine": {"cpu_model": 7}}, "machine.cpu_model is not text"),
    ({"pipeline": {"batch_size": [1, 2]}}, "'pipeline' is not an object of plain values"),
])
def test_a_baseline_read_back_is_checked_before_it_is_believed(tmp_path, info, match):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": "cupy_nwt.baseline/1", "benchmarks": [{"fullname": "t::x", "extra_info": info}]}))
    with pytest.raises(pytest.UsageError, match=match):
        load_baseline(path)


def test_a_baseline_of_another_format_is_refused(tmp_path):
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"format": "cupy_nwt.baseline/9", "benchmarks": []}))
    with pytest.raises(pytest.UsageError, match="this cupy_nwt reads 'cupy_nwt.baseline/1'"):
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
    monkeypatch.setattr(pytest_plugin, "_CopyTimer", _SteadyCopyTimer)
    project.runpytest_inprocess("--benchmark-json=base.json").assert_outcomes(passed=1)
    info = json.loads((project.path / "base.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["gbps_rounds"] == pytest.approx([1024**2 / t / 1e9 for t in _SteadyCopyTimer.TIMES[2:]])
    monkeypatch.setattr(pytest_plugin, "_CopyTimer", _SlowCopyTimer)
    bad = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*test_h2d: GB/s fell 50.0% (more than 20%): * (medians of 4|4 rounds, 95% interval *)*"])


def test_pytest_benchmark_records_the_device_time_not_the_wall_time(project, monkeypatch):
    """Pins the timer route: the saved stats are exactly the CUDA-event times the copies reported."""
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    monkeypatch.setattr(pytest_plugin, "_CopyTimer", _FakeCopyTimer)
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


def test_transfer_benchmark_fetched_dynamically_fails_with_advice(project, monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    project.makepyfile("""
        def test_dyn(request, benchmark):
            request.getfixturevalue("transfer_benchmark")
    """)
    result = project.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*must be named as a test argument or fixture dependency*"])


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
    benchmark.extra_info["samples_per_s"] = float(os.environ["RATE"])
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
    ok.stdout.fnmatch_lines(["*cupy_nwt throughput*", "*test_gate.py::test_pipeline: samples/s 1,000.00 -> 850.00 (-15.0%)*"])

    bad = _run(project, monkeypatch, 700, "--benchmark-compare", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines([
        "*test_gate.py::test_pipeline: samples/s fell 30.0% (more than 20%): 1,000.00 -> 700.00*0001_*",
        "*cupy_nwt throughput gate FAILED: 1 figure(s) fell or rose by more than 20%*",
    ])


def test_gate_against_an_explicit_baseline_file(project, monkeypatch):
    project.makepyfile(test_gate=GATED_TEST)
    _run(project, monkeypatch, 50, "--benchmark-json=base.json").assert_outcomes(passed=1)
    bad = _run(project, monkeypatch, 10, "--nwt-baseline=base.json", "--nwt-throughput-drop=50")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*samples/s fell 80.0% (more than 50%): 50.00 -> 10.00 [[]baseline base.json]*"])
    # A baseline without a drop limit reports the change and never fails.
    info = _run(project, monkeypatch, 10, "--nwt-baseline=base.json")
    assert info.ret == 0
    info.stdout.fnmatch_lines(["*samples/s 50.00 -> 10.00 (-80.0%)*"])


ROUNDS_TEST = """
import json
import os

def test_pipeline(benchmark):
    rounds = json.loads(os.environ["ROUNDS"])
    benchmark.extra_info["samples_per_s"] = sum(rounds) / len(rounds)
    benchmark.extra_info["samples_per_s_rounds"] = rounds
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
        ("*test_gate.py::test_pipeline: samples/s inconclusive, the noise reaches past the 20% limit: "
         "1,000.00 -> 700.00 (-30.0%) (medians of 5|5 rounds, 95% interval *) [[]baseline base.json]"),
        "*cupy_nwt throughput gate INCONCLUSIVE for 1 figure(s)*not a failure*",
    ])
    unsure.stdout.no_fnmatch_line("*FAILED*")
    monkeypatch.setenv("ROUNDS", json.dumps([0.05 * x for x in noisy]))  # a drop far beyond the noise
    bad = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert bad.ret == pytest.ExitCode.TESTS_FAILED
    bad.stdout.fnmatch_lines(["*samples/s fell 95.0% (more than 20%): 1,000.00 -> 50.00*",
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
        (["--nwt-throughput-drop=20"], "*--nwt-throughput-drop needs a baseline*"),
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


@pytest.mark.parametrize("value", ["abc", "0", "100", "-5"])
def test_gate_rejects_a_drop_that_is_not_a_percentage(project, value):
    project.makepyfile(test_gate=GATED_TEST)
    result = project.runpytest_inprocess(f"--nwt-throughput-drop={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --nwt-throughput-drop*"])


# ---------------------------------------------------------------- loader_benchmark and the planted slowdown


TINY_DATA = """
import os
import time

import numpy as np


class TinyImages:
    \"\"\"64 small images; __getitem__ sleeps SLOW_S seconds (from the environment) per sample.\"\"\"

    def __init__(self, n=64):
        self.n = n
        self.slow = float(os.environ.get("SLOW_S", "0"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.slow:
            time.sleep(self.slow)
        return np.full((4, 4, 3), i % 256, np.uint8), i % 10
"""

LOADER_TEST = """
from tinydata import TinyImages


def test_pipeline(loader_benchmark):
    r = loader_benchmark(TinyImages(), batches={batches}, rounds={rounds}, warmup=1, batch_size=8,
                         num_workers={workers}, device="cpu"{extra})
    assert r.batches == {batches} and r.samples == 8 * {batches}
"""


def loader_test(batches: int = 5, workers: int = 0, rounds: int = 5, extra: str = "") -> str:
    return LOADER_TEST.format(batches=batches, workers=workers, rounds=rounds, extra=extra)


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
    assert info["machine"]["usable_cpus"] >= 1
    # where the kernel refuses to count instructions, the figure is absent and the reason given, never faked
    assert (info["instructions_per_sample"] is None) == bool(info["instructions_note"])
    result.stdout.fnmatch_lines(["*cupy_nwt benchmarks*", "benchmark * samples/s * CPU s/1k samples * verdict",
                                 "test_input_pipeline.py::test_pipeline * no baseline"])


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_cpu_of_the_workers_is_counted(project, monkeypatch, worker_type):
    """2 ms of CPU planted per sample, burnt in the workers: about 2 CPU seconds per 1,000 samples.

    The main process alone burns almost nothing here; without the workers' CPU the figure would be ~0.
    A window misses or gains at most the batches in flight at its edges (prefetch: 2 per worker), so
    with 40 timed batches at least 3/4 of the burn is inside it.
    """
    project.makepyfile(tinydata=TINY_DATA,
                       test_input_pipeline=loader_test(batches=40, workers=2, rounds=4,
                                                       extra=f", worker_type={worker_type!r}, persistent_workers=True"))
    project.syspathinsert()
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "2000")
    project.runpytest_inprocess("--benchmark-json=out.json").assert_outcomes(passed=1)
    info = _info(project)
    assert 1.5 <= info["cpu_s_per_1k"] <= 3.0


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
    saved.stdout.fnmatch_lines(["baseline saved: ci/baseline.json (1 benchmark(s)); commit it and gate with "
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
                                 "(cpu_model 'Some Other CPU' in the baseline, * here): not judged*"])
    result.stdout.no_fnmatch_line("*FAILED*")


def test_a_cpu_slowdown_is_caught_while_the_wall_clock_is_too_noisy_to_tell(project, monkeypatch):
    """A benchmark of the user's own with steady CPU rounds and wild wall-clock rounds."""
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
    monkeypatch.setenv("FIGURES", json.dumps({"samples_per_s_rounds": wall[::-1], "cpu_s_per_1k_rounds": [x * 1.1 for x in cpu],
                                              "cpu_cores": 1.5, "others_cores": 0.2}))
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=5")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*test_pipeline: samples/s inconclusive, the noise reaches past the 5% limit*",
        "*test_pipeline: CPU s/1k samples rose 10.0% (more than 5%): 0.3 -> 0.33 (medians of 8|8 rounds, 95% interval +*",
        "*cupy_nwt throughput gate FAILED: 1 figure(s)*",
        "*cupy_nwt throughput gate INCONCLUSIVE for 1 figure(s)*",
    ])


def test_a_planted_cpu_slowdown_of_the_users_loader_is_caught(project, monkeypatch):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=16, rounds=8))
    project.syspathinsert()
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "0")
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    monkeypatch.setenv("CUPY_NWT_PROOF_CPU_US", "3000")  # 24 ms more CPU per batch of 8: many times the baseline
    second = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=50")
    second.assert_outcomes(passed=1)
    assert second.ret == pytest.ExitCode.TESTS_FAILED
    second.stdout.fnmatch_lines([
        "*test_input_pipeline.py::test_pipeline: CPU s/1k samples rose *% (more than 50%): * -> * [[]baseline base.json]",
        "*cupy_nwt throughput gate FAILED*",
    ])


def test_an_io_bound_pipeline_is_judged_by_wall_clock(project, monkeypatch):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=8, rounds=4))
    project.syspathinsert()
    monkeypatch.setenv("SLOW_S", "0.005")  # 40 ms asleep per batch of 8: almost no CPU
    project.runpytest_inprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    assert _info(project, "base.json")["cpu_cores"] < 0.25
    monkeypatch.setenv("SLOW_S", "0.02")
    result = project.runpytest_inprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*test_pipeline: samples/s fell *% (more than 20%)*; I/O-bound (0.* cores): "
                                 "judged by wall clock*"])


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
        result.stdout.fnmatch_lines([f"*SKIPPED*test_transfer.py*needs a GPU: {status.reason}*"])


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
    assert pytest_plugin._CopyTimer.link_gbps(None) == pytest.approx(63.0, rel=5e-3)
    assert asked == [1]  # the timer's buffers live on the current GPU, not necessarily GPU 0
