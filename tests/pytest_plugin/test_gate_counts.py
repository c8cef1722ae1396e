"""The gate's two answers to a shared machine: exact instruction counts (callgrind) and the base revision
measured beside the run (``--nwt-against``).

Counting needs valgrind and is skipped with the reason where it is missing; a count under callgrind
costs ~20 s of CPU (the interpreter's start-up and imports, instrumented), so those tests are ``slow``.
Nothing here asserts a time: counts are exact, and the planted slowdown of the ``--nwt-against`` flow is
ten times the limit.
"""

from __future__ import annotations

import compileall
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from plugin_projects import FAST_CONFTEST, TINY_DATA, loader_test, make_project

from cupy_nwt.errors import CupyNwtError
from cupy_nwt.pytest_plugin._callgrind import CallgrindError, callgrind_unavailable_reason, count_instructions
from cupy_nwt.pytest_plugin._count import count_args, count_pipeline, plan

pytest_plugins = ["pytester"]
NO_VALGRIND = callgrind_unavailable_reason()
needs_valgrind = pytest.mark.skipif(NO_VALGRIND is not None, reason=f"needs valgrind: {NO_VALGRIND}")
EXACT = {"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin"}


class Loop:
    """A map-style dataset whose per-sample work is ``steps`` NumPy operations."""

    def __init__(self, steps: int, n: int = 40) -> None:
        self.steps, self.n = steps, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import numpy as np

        x = np.full(4, float(i))
        for _ in range(self.steps):
            x = np.sqrt(x + 1.0)
        return x


class Pixels:
    """A map-style dataset of small images: the cost of its samples is mostly memory traffic and page faults."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import numpy as np

        return np.full((32, 32, 3), i, np.uint8)


def test_without_valgrind_the_reason_is_one_line_and_counting_refuses(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = callgrind_unavailable_reason()
    assert reason is not None and "valgrind is not installed" in reason and "\n" not in reason
    with pytest.raises(CallgrindError, match="valgrind is not installed") as err:
        count_instructions([sys.executable, "-c", "pass"])
    assert isinstance(err.value, CupyNwtError)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


@needs_valgrind
def test_a_count_is_exact_and_grows_with_the_work():
    def count(n: int) -> int:
        return count_instructions([sys.executable, "-S", "-c", f"sum(range({n}))"], env=EXACT)

    with ThreadPoolExecutor(3) as pool:
        a, b, more = pool.map(count, (10_000, 10_000, 210_000))
    assert abs(a - b) <= a * 1e-3
    assert more - a > 200_000 * 10  # tens of instructions per loop step


@needs_valgrind
def test_a_failed_or_overlong_command_is_one_line(tmp_path):
    with pytest.raises(CallgrindError, match=r"^false under callgrind exited with 1$"):
        count_instructions(["false"])
    with pytest.raises(CallgrindError, match="ran past 0.5 s and was stopped"):
        count_instructions([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)
    with pytest.raises(CallgrindError, match="empty argv"):
        count_instructions([])
    assert not list(tmp_path.iterdir())


def test_the_counted_samples_are_the_same_every_run():
    a, b = plan(10, 4, 12), plan(10, 4, 12)
    assert [list(i) for i, _ in a] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert [s for _, s in a] == [s for _, s in b] and len({s for _, s in a}) == 3
    assert len(plan(10_000, 64, None)) == 16  # the default: 1,024 samples
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="count_samples must be an int >= 1"):
            count_args(bad)


@needs_valgrind
def test_an_unpicklable_pipeline_is_not_counted_and_says_why():
    with pytest.raises(CallgrindError, match="does not pickle"):
        count_pipeline(Loop(2), batch_size=4, collate_fn=lambda xs: xs, batch_transform=None, samples=8)


@needs_valgrind
@pytest.mark.slow
def test_a_pipelines_count_repeats_exactly_and_sees_two_percent_more_work():
    def count(steps: int) -> float:
        return count_pipeline(Loop(steps), batch_size=4, collate_fn=None, batch_transform=None, samples=16).per_sample

    with ThreadPoolExecutor(3) as pool:
        a, b, more = pool.map(count, (100, 100, 102))
    assert abs(a - b) <= a * 1e-3
    assert 1.01 < more / a < 1.03


@needs_valgrind
@pytest.mark.slow
def test_a_count_is_the_same_whatever_the_ci_service_set_for_this_run(monkeypatch):
    """A runner sets its own ids, refs and tokens anew each job; their lengths must not move the count."""
    def count():
        return count_pipeline(Pixels(), batch_size=16, collate_fn=None, batch_transform=None, samples=64)

    plain = count()
    monkeypatch.setenv("GITHUB_HEAD_REF", "feature/a-branch-name-much-longer-than-the-last-one")
    monkeypatch.setenv("RUNNER_NAME", "GitHub Actions 1000000")
    monkeypatch.setenv("CI_JOB_TOKEN", "x" * 300)
    monkeypatch.setenv("CUPY_NWT_AGAINST_KEY", "0" * 64)
    monkeypatch.setenv("_", "/usr/bin/some-command")
    other = count()
    assert other.cost is not None and plain.cost is not None
    # a simulated cache miss or two may come and go (1e-5 of the cost); a variable's length moved it by 1e-3 and more
    assert other.per_sample == pytest.approx(plain.per_sample, rel=1e-4)
    assert other.cost.total == pytest.approx(plain.cost.total, rel=1e-4)


class FillsACacheOnItsFirstRun:
    """A pipeline whose first run on a machine fills a cache on disk that later runs read (Numba's compiled
    kernels in a fresh clone). The fill, a compile's large allocation freed, raises the allocator's threshold
    for mapping memory of its own, so the samples' 256 KiB arrays come from reused heap pages after it: the
    batches' page faults differ in that one run."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import numpy as np

        if not self.cache.exists():
            np.ones(4 << 20, np.float32).sum()
            self.cache.write_text("compiled", encoding="utf-8")
        return np.full((256, 256, 4), i, np.uint8)


@needs_valgrind
@pytest.mark.slow
def test_a_count_in_a_fresh_checkout_is_the_count_of_every_later_run(tmp_path):
    """The gate's cost took the page faults of the region's first native run: in a clean CI clone, whose
    Numba kernels were not yet compiled beside their source, unchanged code failed the gate (+1.1%)."""
    def count():
        return count_pipeline(FillsACacheOnItsFirstRun(tmp_path / "kernel.nbc"), batch_size=16, collate_fn=None,
                              batch_transform=None, samples=16)

    fresh, later = count(), count()
    assert fresh.cost is not None and later.cost is not None
    assert fresh.cost.total == pytest.approx(later.cost.total, rel=1e-4)


PIXELS_MODULE = """
import numpy as np


class Pixels:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full((3, 32, 32), float(i), np.float32) * 0.5
"""
COUNT_PIXELS = ("import json; from pixels import Pixels; from cupy_nwt.pytest_plugin._count import count_pipeline; "
                "c = count_pipeline(Pixels(), batch_size=16, collate_fn=None, batch_transform=None, samples=64); "
                "print(json.dumps(c.cost.total))")


SEARCH_ORDER = """
import json, sys
from pathlib import Path

appended, aliased = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.append(str(appended))  # after site-packages, as a .pth file or a conftest's sys.path.append puts it
import extra_mod  # noqa: F401  (a module the pipeline imports from there)

sys.path.append(str(aliased))
import realpkg.sub.mod
sys.modules["alias.mod"] = realpkg.sub.mod  # as pytest registers _pytest._py.error under "py.error"
from cupy_nwt.pytest_plugin._count_view import count_path, import_roots

print(json.dumps({"roots": [str(r) for r in import_roots()], **count_path(Path(sys.argv[3]), "/view")}))
"""


def test_the_count_searches_folders_added_after_site_packages_after_it_and_reads_aliases_by_their_own_name(tmp_path):
    """A folder added after site-packages, searched first by the count, would have its copy of a package counted
    instead of the one the pipeline ran; an alias's key (pytest's "py.error") put pytest's own folder on the path,
    where its logging.py hid the standard library's and nothing could be counted."""
    appended, aliased = tmp_path / "appended", tmp_path / "aliased"
    appended.mkdir()
    (appended / "extra_mod.py").write_text("X = 1\n")
    (aliased / "realpkg" / "sub").mkdir(parents=True)
    for init in ("realpkg/__init__.py", "realpkg/sub/__init__.py", "realpkg/sub/mod.py"):
        (aliased / init).write_text("")
    (tmp_path / "checkout").mkdir()
    proc = subprocess.run([sys.executable, "-c", SEARCH_ORDER, str(appended), str(aliased), str(tmp_path / "checkout")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert str(appended) in got["after"] and str(appended) not in got["path"]
    assert str(aliased) in got["roots"] and str(aliased / "realpkg") not in got["roots"]
    # a module named otherwise than it was found (_collections_abc calls itself collections.abc) is not read up
    assert not any(Path(r) in Path(os.__file__).resolve().parents[1:] for r in got["roots"])


def copied_checkout(checkout: Path, module: str, text: str) -> Path:
    """A checkout of the package beside the pipeline's module, compiled as an import leaves it, without the
    ``__pycache__`` of this one's runs (what a fresh clone holds)."""
    import cupy_nwt

    shutil.copytree(os.path.dirname(cupy_nwt.__file__), checkout / "cupy_nwt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / module).write_text(text)
    assert compileall.compile_dir(str(checkout), quiet=1)
    return checkout


@needs_valgrind
@pytest.mark.slow
def test_a_count_is_the_same_wherever_the_checkout_lies_and_whatever_the_users_variables_hold(tmp_path):
    """Two checkouts of the same code (the package with the pipeline's module, compiled as an import leaves
    them), 24 characters apart in depth, and a user variable 500 characters long: one cost.

    The counting process saw the checkout's path in its sys.path, its modules' files and cached code,
    its working folder and the caller's variables: their lengths moved this cost by 0.1%."""
    costs = []
    for name, extra in (("a", {}), ("a" * 25, {}), ("a", {"MY_SETTING": "x" * 500})):
        checkout = tmp_path / name
        if not checkout.exists():
            copied_checkout(checkout, "pixels.py", PIXELS_MODULE)
        env = {**os.environ, "PYTHONPATH": str(checkout), **extra}
        done = subprocess.run([sys.executable, "-c", COUNT_PIXELS], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        costs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert max(costs) - min(costs) <= 1e-4 * min(costs), costs


IMAGES_MODULE = """
import numpy as np


class Images:
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return np.full((32, 32, 3), i % 251, np.uint8), i % 10
"""
COUNT_AUGMENTED = ("import json; from images import Images; from cupy_nwt.data import CifarTrainTransform; "
                   "from cupy_nwt.pytest_plugin._count import count_pipeline; "
                   "c = count_pipeline(Images(), batch_size=16, collate_fn=None, batch_transform=CifarTrainTransform(), "
                   "samples=64); print(json.dumps(c.cost.total))")
TRAIN_ONCE = ("import numpy as np; from images import Images; from cupy_nwt.data import CifarTrainTransform; "
              "images = np.stack([Images()[i][0] for i in range(16)]); CifarTrainTransform()((images, np.arange(16)), 0)")


@needs_valgrind
@pytest.mark.slow
def test_a_numba_pipeline_counts_the_same_whatever_the_checkouts_pycache_holds(tmp_path):
    """A user's run of the pipeline leaves Numba's compiled kernels in the checkout's ``__pycache__``; a CI
    clone holds none. The counts read them from there, and the same code counted 0.33% apart in the two
    checkouts (the gate failing unchanged code in a fresh clone); they keep their kernels apart."""
    checkout = copied_checkout(tmp_path / "checkout", "images.py", IMAGES_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"PYTHONPATH": str(checkout)}

    def python(code: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def count() -> float:
        return float(json.loads(python(COUNT_AUGMENTED).strip().splitlines()[-1]))

    fresh = count()
    python(TRAIN_ONCE)
    assert count() == pytest.approx(fresh, rel=1e-4)


@needs_valgrind
@pytest.mark.slow
def test_the_next_run_counts_what_the_first_did_whatever_the_first_left_beside_the_test(pytester):
    """The README's flow, as a user's CI runs it: one run saves the baseline beside the test, the next is
    judged against it. The first leaves the saved baseline, pytest's cache and ``__pycache__`` and a log in
    the checkout; the counting process listed the folders it imports from (its finders and
    ``importlib.metadata`` keep the names), so each new name there moved the same code's cost: the
    README's example counted 0.02% to 0.09% apart for one file more beside its test, 0.28% between its
    first run and its next."""
    pytester.makeconftest(FAST_CONFTEST)
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest\n")
    bench = pytester.mkdir("bench")
    (bench / "tinydata.py").write_text(TINY_DATA)
    (bench / "test_pipeline.py").write_text(loader_test(batches=4, rounds=2, extra=", count_samples=32"))

    def run(*args: str) -> dict:
        done = pytester.runpytest_subprocess("bench/test_pipeline.py", "--benchmark-json=out.json", *args)
        assert done.ret == 0, done.stdout.str()[-3000:]
        return json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]

    first = run("--nwt-save-baseline=bench/baseline.json")
    (bench / "first-run.log").write_text("what the first run printed\n")
    # the test's cached code, as pytest leaves it where bytecode is written (this process's environment,
    # the runs', may say not to: pytest would write into the interpreter's packages too)
    assert compileall.compile_dir(str(bench), quiet=1)
    again = run("--nwt-baseline=bench/baseline.json", "--nwt-require-baseline")
    assert (bench / "__pycache__").is_dir() and (pytester.path / ".pytest_cache").is_dir()
    assert first["instructions_counted_by"] == again["instructions_counted_by"] == "callgrind"
    # before, the second counted 0.15% more instructions and 0.18% to 0.22% more cost; now the instructions are
    # the same, and a few dozen simulated L1 misses of 46,000 came and went in one run of four (0.026% of the cost)
    assert again["cost_components"]["instructions"] == pytest.approx(first["cost_components"]["instructions"], rel=1e-5)
    assert again["cost_per_sample"] == pytest.approx(first["cost_per_sample"], rel=5e-4)


# ---------------------------------------------------------------- in a project


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester)


def test_instructions_off_leaves_the_count_out(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=6, rounds=2))
    project.syspathinsert()
    project.runpytest_inprocess("--nwt-instructions=off", "--benchmark-json=out.json").assert_outcomes(passed=1)
    info = json.loads((project.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["instructions_counted_by"] in ("", "perf") and info["instructions_samples"] is None
    if not info["instructions_counted_by"]:  # nothing counted: the option is the reason given first
        assert info["instructions_note"].startswith("counting is off (--nwt-instructions=off)"), info["instructions_note"]


def test_without_valgrind_the_table_says_so_in_one_line(project, monkeypatch, tmp_path):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=6, rounds=2))
    project.syspathinsert()
    monkeypatch.setenv("PATH", str(tmp_path))
    result = project.runpytest_inprocess("--nwt-instructions=auto", "--benchmark-json=out.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["instructions not counted: valgrind is not installed (apt-get install valgrind)*"])


@needs_valgrind
@pytest.mark.slow
def test_a_loader_benchmark_counts_its_samples_under_callgrind(project):
    project.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=6, rounds=2,
                                                                           extra=", count_samples=16"))
    project.syspathinsert()
    project.runpytest_inprocess("--nwt-instructions=auto", "--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    info = json.loads((project.path / "base.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["instructions_counted_by"] == "callgrind" and info["instructions_samples"] == 16
    assert info["instructions_per_sample"] > 1000 and info["instructions_per_sample_rounds"] == []
    again = project.runpytest_inprocess("--nwt-instructions=auto", "--nwt-baseline=base.json", "--nwt-throughput-drop=5")
    assert again.ret == 0
    again.stdout.fnmatch_lines(["*CPU s/1k samples *; exact counts decide*",
                                "*instructions/sample *; a component of cost/sample, which decides*"])
    again.stdout.no_fnmatch_line("*judged nothing*")
    assert info["cost_model"] and set(info["cost_components"]) == {"instructions", "l1_misses", "ll_misses",
                                                                  "page_faults", "syscalls"}
    # the same code on the same samples, at fixed addresses: within the gate's 1% limit
    (change,) = re.findall(r"cost/sample [\d,.]+ -> [\d,.]+ \(([-+]?[\d.]+)%\) \[baseline base\.json\]",
                           again.stdout.str())
    assert abs(float(change)) < 1.0
    # the count ran on this software, and one from other software is not judged exactly (a required one fails)
    assert info["count_software"]["numpy"] == np.__version__ and info["count_software"]["python"]
    base = json.loads((project.path / "base.json").read_text())
    base["benchmarks"][0]["extra_info"]["count_software"]["numpy"] = "1.26.4"
    (project.path / "other.json").write_text(json.dumps(base))
    other = project.runpytest_inprocess("--nwt-instructions=auto", "--nwt-baseline=other.json", "--nwt-require-baseline",
                                        "--nwt-throughput-drop=5")
    assert other.ret == pytest.ExitCode.TESTS_FAILED
    other.stdout.fnmatch_lines(["*counted by other software in the baseline (numpy '1.26.4' in the baseline, "
                                f"'{np.__version__}' here)*"])


# ---------------------------------------------------------------- --nwt-against


SLEEPY = """
import time

import numpy as np

PAUSE = {pause}


class Sleepy:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if PAUSE:
            time.sleep(PAUSE)
        return np.full(4, i, np.uint8)
"""
AB_TEST = """
from sleepy import Sleepy


def test_pipeline(loader_benchmark):
    loader_benchmark(Sleepy(), batch_size=8, device="cpu", max_seconds=0.5)
"""


def _git(path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


def _ab_project(pytester, name: str, base: str, working: str) -> None:
    """A git project whose HEAD has ``base`` as module ``name`` and whose working tree has ``working``."""
    pytester.makeconftest(FAST_CONFTEST + "\n")
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n")
    pytester.makepyfile(**{name: base, "test_ab": AB_TEST.replace("sleepy", name).replace("Sleepy", name.title())})
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-qm", "base")
    pytester.makepyfile(**{name: working})


def test_the_base_revision_is_measured_beside_the_working_tree(pytester):
    """HEAD sleeps nothing per sample, the working tree 5 ms: the pairs' ratio fails the run."""
    _ab_project(pytester, "sleepy", SLEEPY.format(pause=0.0), SLEEPY.format(pause=0.005))
    result = pytester.runpytest_subprocess("--nwt-against=HEAD", "--nwt-throughput-drop=20", "--nwt-instructions=off",
                                           "--benchmark-json=out.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*test_pipeline: samples/s fell *measured beside the base revision in this job, "
                                 "6 pairs of rounds [[]baseline HEAD (*), same job]"])
    info = json.loads((pytester.path / "out.json").read_text())["benchmarks"][0]["extra_info"]
    assert info["against"]["pairs"] == len(info["samples_per_s_rounds"]) == 6
    listed = subprocess.run(["git", "-C", str(pytester.path), "worktree", "list"], capture_output=True, text=True)
    assert len(listed.stdout.strip().splitlines()) == 1  # the base revision's checkout is gone


def test_the_base_revision_runs_its_own_package_found_through_an_absolute_path(pytester, monkeypatch):
    """The pipeline's module lives in src/, found through PYTHONPATH=$PWD/src (as an editable install finds
    it): REV's child must import REV's copy, not this checkout's, or the slowdown runs on both sides."""
    _ab_project(pytester, "sleepy", SLEEPY.format(pause=0.0), SLEEPY.format(pause=0.005))
    src = pytester.path / "src"
    src.mkdir()
    _git(pytester.path, "mv", "sleepy.py", "src/sleepy.py")
    _git(pytester.path, "commit", "-qm", "src layout")
    (src / "sleepy.py").write_text(SLEEPY.format(pause=0.005))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])))
    result = pytester.runpytest_subprocess("--nwt-against=HEAD", "--nwt-throughput-drop=20", "--nwt-instructions=off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*test_pipeline: samples/s fell *measured beside the base revision in this job*"])


BURNING = """
import time

import numpy as np

BURN_S = {burn}


class Burning:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        end = time.thread_time() + BURN_S
        while time.thread_time() < end:
            pass
        return np.full(4, i, np.uint8)
"""


def test_a_cpu_slowdown_is_caught_beside_the_base_revision(pytester):
    """The working tree burns 2 ms of CPU more per sample than HEAD: the pairs' CPU ratio fails the run.

    Against a stored baseline CPU time is only shown; measured beside the base revision, round for
    round, it is judged.
    """
    _ab_project(pytester, "burning", BURNING.format(burn=0.0), BURNING.format(burn=0.002))
    result = pytester.runpytest_subprocess("--nwt-against=HEAD", "--nwt-throughput-drop=50", "--nwt-instructions=off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*test_pipeline: CPU s/1k samples rose *% (more than 50%): * -> * measured beside "
                                 "the base revision in this job, * pairs of rounds [[]baseline HEAD (*), same job]"])
    result.stdout.no_fnmatch_line("*judged nothing*")


PLAIN_TEST = """
def test_pipeline(benchmark):
    benchmark.extra_info["samples_per_s"] = 1000.0
    benchmark.pedantic(lambda: None, rounds=3)
"""


def test_a_plain_benchmark_under_against_is_named_as_judged_on_nothing(pytester):
    """A suite timed with plain ``benchmark`` (the figure its own) is not run at REV: the gate said 'no throughput
    compared ... in the baseline ()' and closed green. It now names the benchmark, REV, and the remedy."""
    pytester.makepyfile(test_plain=PLAIN_TEST)
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-qm", "base")
    result = pytester.runpytest_subprocess("--nwt-against=HEAD", "--nwt-throughput-drop=5", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([
        "*no throughput compared: no benchmark of this run has a watched figure both now and in HEAD's run beside "
        "it (--nwt-against)",
        "*cupy_nwt throughput gate judged nothing for 1 benchmark(s) (test_plain.py::test_pipeline): HEAD did not "
        "run them: --nwt-against runs only loader_benchmark's pipelines at both revisions, a plain benchmark times "
        "the test's own code, which nothing counts: write the pipeline's test with loader_benchmark *"])
    result.stdout.no_fnmatch_line("*()*")


def test_a_base_revision_whose_module_does_not_import_is_told_at_once_with_its_error(pytester):
    """REV's copy of the pipeline's module has a syntax error (the bug the working tree fixes): its child
    pytest ends at collection, and the gate says so with the child's own last words, not after minutes."""
    _ab_project(pytester, "sleepy", SLEEPY.format(pause=0.0) + "\ndef broken(:\n", SLEEPY.format(pause=0.0))
    result = pytester.runpytest_subprocess("--nwt-against=HEAD", "--nwt-throughput-drop=20", "--nwt-instructions=off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*AgainstError: the base revision's test ended before it started its loader (*"
                                 "SyntaxError*"])
    result.stdout.no_fnmatch_line("*closed file*")


def test_a_bad_revision_is_one_line(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    _git(pytester.path, "init", "-q")
    result = pytester.runpytest_subprocess("--nwt-against=no-such-rev", "--nwt-throughput-drop=5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nwt-against: 'no-such-rev' is not a revision of *"])


def test_a_revision_a_shallow_clone_lacks_is_told_to_be_fetched(pytester, tmp_path, monkeypatch):
    """A CI checkout of depth 1 (actions/checkout's default) holds no HEAD~1: say that the clone is shallow."""
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "test_x.py").write_text("def test_x():\n    pass\n")
    _git(origin, "init", "-q")
    for message in ("one", "two"):
        _git(origin, "add", "-A")
        _git(origin, "commit", "-q", "--allow-empty", "-m", message)
    clone = pytester.path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{origin}", str(clone)], check=True,
                   capture_output=True)
    monkeypatch.chdir(clone)
    result = pytester.runpytest_subprocess("--nwt-against=HEAD~1", "--nwt-throughput-drop=5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--nwt-against: 'HEAD~1' is not a revision of *: this clone is shallow*"
                                 "git fetch --deepen=1*"])


def burnt_child(seconds: float) -> subprocess.Popen:
    """A child that has burnt ``seconds`` of CPU and then waits, until its stdin is closed.

    The child says when it is done: polling its CPU time from the kernel's clock ticks can stay short
    of ``seconds`` for ever (user 0.11 s + system 0.29 s is 0.39999999999999997 in floating point).
    """
    burn = f"import sys, time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end:\n    pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "burnt\n"
    child.stdout.close()
    return child


def test_the_base_revisions_child_is_not_counted_as_the_pipelines_cpu():
    """A child that burnt 0.3 s of CPU: in the pipeline's CPU, unless it is excluded (with its own children)."""
    from cupy_nwt.pytest_plugin._cpu import PipelineClock

    child = burnt_child(0.3)
    try:
        assert PipelineClock().cpu_s() - PipelineClock(exclude=[child.pid]).cpu_s() >= 0.25
    finally:
        child.stdin.close()
        child.wait()


def test_an_excluded_child_reaped_inside_a_window_brings_in_at_most_what_it_spent_since_the_last_reading():
    """An earlier loader's worker, reaped while the benchmark runs: its whole CPU lands in RUSAGE_CHILDREN."""
    from cupy_nwt.pytest_plugin._cpu import PipelineClock

    child = burnt_child(0.4)
    clock = PipelineClock(exclude=[child.pid])
    start = clock.cpu_s()  # the child's 0.4 s are read here, before it ends
    child.stdin.close()
    child.wait()  # reaped by this process: RUSAGE_CHILDREN now holds its 0.4 s
    assert clock.cpu_s() - start < 0.2


BUSY_FIXTURE = """
import subprocess, sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def server():
    \"\"\"A user's session fixture: a process beside the tests that keeps a CPU busy while they run.\"\"\"
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield proc
    proc.kill()
    proc.wait()
"""


def test_a_fixtures_busy_process_is_not_the_pipelines_cpu(pytester, monkeypatch):
    """Unchanged but slower on the wall clock (asleep), beside a fixture's busy server: not failed.

    Counting the server's CPU made the CPU per sample grow with the wall clock, and failed this.
    """
    make_project(pytester)
    pytester.makeconftest(FAST_CONFTEST + BUSY_FIXTURE)
    pytester.makepyfile(tinydata=TINY_DATA, test_input_pipeline=loader_test(batches=8, rounds=4))
    pytester.syspathinsert()
    monkeypatch.setenv("SLOW_S", "0.005")
    pytester.runpytest_subprocess("--nwt-save-baseline=base.json").assert_outcomes(passed=1)
    monkeypatch.setenv("SLOW_S", "0.02")
    result = pytester.runpytest_subprocess("--nwt-baseline=base.json", "--nwt-throughput-drop=20")
    assert result.ret == pytest.ExitCode.OK, "\n".join(result.outlines[-12:])


class Draws:
    """Work that random draws decide: a seeded per-sample flip (half the samples copy 64 KiB) and a count of
    NumPy steps from NumPy's global generator, as a dataset's own augmentation draws them."""

    def __init__(self) -> None:
        from cupy_nwt.data import RandomHorizontalFlip

        self.flip = RandomHorizontalFlip(0.5, seed=3)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import numpy as np

        x = self.flip(np.full((128, 128, 4), i, np.uint8))
        for _ in range(int(np.random.randint(0, 20))):
            x = x + 1
        return x


@needs_valgrind
@pytest.mark.slow
def test_a_pipeline_that_draws_at_random_counts_the_same_in_every_counting_process():
    """Each count runs in a new process: its draws were seeded by its process id (the flip) or not at all
    (NumPy's generator), and the same pipeline counted up to 6% apart (914,244 to 1,000,267 instructions a
    sample in four counts). The counting process is worker 0 of a
    loader seeded 0, as the loader's own first worker would be."""

    def count(_: int) -> float:
        return count_pipeline(Draws(), batch_size=4, collate_fn=None, batch_transform=None, samples=32,
                              cost=False).per_sample

    count(0)  # this module's first import in a counting process writes its __pycache__, which the rest then read
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(count, range(2))
    assert abs(a - b) <= a * 1e-4
