"""The plugin loads in every pytest session of an environment with cupy-nwt installed: a project that never
uses it must run as it would without it (``-p no:cupy_nwt``), and pay next to nothing for it.

Each project here is a user's own, written as theirs are: fixtures of their own, pytest-benchmark used
plainly, strict markers, an older pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_projects import FAST_CONFTEST

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
OWN_FIXTURES = """
import time

import pytest


@pytest.fixture
def loader_benchmark(benchmark):  # the project's own, on pytest-benchmark
    return lambda loader: benchmark(lambda: [x for x in loader])


@pytest.fixture
def transfer_benchmark():  # the project's own, on nothing
    def run(data):
        t = time.perf_counter()
        bytes(data)
        return time.perf_counter() - t
    return run
"""
OWN_TESTS = """
def test_loader(loader_benchmark):
    loader_benchmark(range(1000))


def test_transfer(transfer_benchmark):
    assert transfer_benchmark(b"x" * 1000) < 60
"""


@pytest.mark.parametrize("plugins", [(), ("-p", "no:benchmark")], ids=["with-pytest-benchmark", "without"])
def test_a_projects_own_fixtures_named_like_the_plugins_run_as_without_it(pytester, plugins):
    pytester.makeconftest(OWN_FIXTURES if plugins else FAST_CONFTEST + OWN_FIXTURES)
    pytester.makepyfile(test_own=OWN_TESTS if not plugins else OWN_TESTS.split("\n\n\n")[1])
    args = ("-p", "no:cacheprovider", "--strict-markers", "-W", "error", *plugins)
    ours, theirs = pytester.runpytest_subprocess(*args), pytester.runpytest_subprocess(*args, "-p", "no:cupy_nwt")
    assert theirs.ret == 0, theirs.stdout.str()
    assert ours.ret == 0, ours.stdout.str()
    assert ours.parseoutcomes() == theirs.parseoutcomes()


def test_a_plain_benchmark_with_a_figure_past_floats_range_passes(pytester):
    pytester.makeconftest(FAST_CONFTEST)
    pytester.makepyfile(test_b="""
def test_b(benchmark):
    benchmark.extra_info["gbps"] = 10**400
    benchmark.extra_info["cpu_cores"] = 10**400
    benchmark(lambda: 1)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_pytest_run_without_benchmarks_imports_none_of_the_gates_machinery(pytester):
    """What a project that never uses the gate pays: the options' module, nothing under it."""
    pytester.makeconftest("""
import sys

def pytest_sessionfinish(session):
    loaded = sorted(m for m in sys.modules if m.startswith("cupy_nwt.pytest_plugin."))
    print("LOADED", loaded)
""")
    pytester.makepyfile(test_plain="def test_ok():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    assert result.ret == 0
    assert "LOADED ['cupy_nwt.pytest_plugin._options']" in result.stdout.str()


def test_a_save_over_a_baseline_with_one_bad_entry_keeps_the_good_ones_and_says_so(pytester):
    pytester.makeconftest(FAST_CONFTEST)
    pytester.makepyfile(test_s="""
def test_a(benchmark):
    benchmark.extra_info["samples_per_s"] = 90.0
    benchmark(lambda: 1)
""")
    base = pytester.path / "base.json"
    entries = [("test_s.py::test_a", 80.0), ("other_shard.py::test_b", 50.0), ("other_shard.py::test_c", 0)]
    base.write_text(json.dumps({"benchmarks": [{"fullname": n, "extra_info": {"samples_per_s": v}}
                                               for n, v in entries]}))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--nwt-save-baseline={base}")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*baseline saved*1 kept from the file*left out of the file as it was*"
                                 "other_shard.py::test_c: samples_per_s is 0, not a positive number*"])
    saved = {b["fullname"]: b["extra_info"] for b in json.loads(base.read_text())["benchmarks"]}
    assert sorted(saved) == ["other_shard.py::test_b", "test_s.py::test_a"]
    assert saved["other_shard.py::test_b"] == {"samples_per_s": 50.0}
    assert saved["test_s.py::test_a"]["samples_per_s"] == 90.0


OLD_PYTEST = "6.2.5"


@pytest.fixture(scope="module")
def old_pytest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest 6.2.5 installed into a folder of its own, put first on ``PYTHONPATH``."""
    where = tmp_path_factory.mktemp("old_pytest")
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(where),
                          f"pytest=={OLD_PYTEST}", "pytest-benchmark==4.0.0"], capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"pytest {OLD_PYTEST} not installable here: {got.stderr.strip().splitlines()[-1:]}")
    return where


def _run_old(old: Path, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(old), str(ROOT)]), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_benchmark.plugin",
                           *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)


def test_under_a_pytest_older_than_the_gate_needs_the_plugin_stays_out_of_the_way(old_pytest, tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_ok(benchmark):\n    benchmark(sum, range(100))\n")
    (tmp_path / "test_loader.py").write_text("def test_loader(loader_benchmark):\n    loader_benchmark(list(range(64)))\n")
    bare = _run_old(old_pytest, tmp_path, "test_ok.py")
    assert OLD_PYTEST in _run_old(old_pytest, tmp_path, "--version").stderr
    if bare.returncode != 0:
        pytest.skip(f"pytest {OLD_PYTEST} does not run on Python {sys.version.split()[0]}: "
                    f"{(bare.stdout + bare.stderr).strip().splitlines()[-1:]}")
    ours = ("-p", "cupy_nwt.pytest_plugin")
    saved = _run_old(old_pytest, tmp_path, *ours, "test_ok.py", "--benchmark-autosave")
    assert saved.returncode == 0 and "1 passed" in saved.stdout, saved.stdout + saved.stderr
    compared = _run_old(old_pytest, tmp_path, *ours, "test_ok.py", "--benchmark-compare")  # pytest-benchmark's own
    assert compared.returncode == 0 and "Comparing against benchmarks from" in compared.stdout + compared.stderr, \
        compared.stdout + compared.stderr
    gated = _run_old(old_pytest, tmp_path, *ours, "--nwt-baseline=base.json")
    assert gated.returncode == 4, gated.stdout + gated.stderr
    assert "Traceback" not in gated.stdout + gated.stderr
    assert (f"--nwt-baseline: cupy_nwt's gate needs pytest 7.4 or later; this is pytest {OLD_PYTEST}"
            in gated.stderr), gated.stderr
    fixture = _run_old(old_pytest, tmp_path, *ours, "test_loader.py")
    assert fixture.returncode == 1, fixture.stdout
    assert f"loader_benchmark needs pytest 7.4 or later; this is pytest {OLD_PYTEST}" in fixture.stdout, fixture.stdout


WRAPPERS = {
    "by-name": """
import pytest

@pytest.fixture
def loader_benchmark(request):  # the project's wrapper over the plugin's fixture, fetched by name
    run = request.getfixturevalue("loader_benchmark")
    return lambda ds: run(ds, batch_size=8, num_workers=0, max_seconds=0.5)
""",
    "through-a-helper": """
import pytest

@pytest.fixture
def plugin_bench(loader_benchmark):
    return loader_benchmark

@pytest.fixture
def loader_benchmark(plugin_bench):  # the project's wrapper, through a helper fixture
    return lambda ds: plugin_bench(ds, batch_size=8, num_workers=0, max_seconds=0.5)
""",
}


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_projects_wrapper_that_reaches_the_plugins_fixture_at_run_time_times_with_its_clock(pytester, wrapper):
    pytester.makeconftest(FAST_CONFTEST + WRAPPERS[wrapper])
    pytester.makepyfile(test_w="def test_loader(loader_benchmark):\n    assert loader_benchmark(list(range(64))).samples_per_s > 0\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--nwt-instructions=off", "--benchmark-json=out.json")
    assert result.ret == 0, result.stdout.str()
    (bench,) = json.loads((pytester.path / "out.json").read_text())["benchmarks"]
    assert bench["options"]["timer"] == "wall_s_per_1k_samples"  # the plugin's round clock, as a named fixture gets
