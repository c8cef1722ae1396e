"""bench/gpu_session.sh without a GPU: its step list, its refusals, and where a step's files go.

Where a step's files go is checked with a stand-in interpreter (the script's ``PYTHON``): it names a
GPU when probed and leaves a file in the step's folder for every command, so the script's own
routing, packing, cut-off and unpacking run for real while nothing needs CUDA.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
STEPS = ["info", "transfers", "gpu-tests", "nwt", "gpu-feed", "gpu-decode", "loader-compare", "decode-placement",
         "scaleout"]  # by importance
FIRST = STEPS[:6]  # the first command's steps
IN_15_MINUTES = STEPS[:8]  # the steps of the two commands that fill the 15 minutes; the rest run where time is left
DEVICE = "Fake-GPU-80GB"

STUB = f"""#!/usr/bin/env bash
# Stands in for python3: names a GPU when probed; every other command leaves a file in its step folder.
if [ "$1" = -c ]; then
    case "$2" in
        *gpu_status*) sleep "${{STUB_PROBE_SLEEP:-0}}"; echo {DEVICE} ;;
        *pytest_timeout*) exit "${{STUB_NO_TIMEOUT:-0}}" ;;
    esac
    exit 0
fi
echo "$*" >>"$GPU_SESSION_STEP_DIR/stub-calls.txt"
echo "stub ran: $*"
if [ -n "${{STUB_PIP_REFUSE:-}}" ] && [ "$1 $2 $3" = "-m pip install" ] && [[ "$*" != *--break-system-packages* ]]; then
    echo "error: externally-managed-environment" >&2
    exit 1
fi
if [ -n "${{STUB_SLEEP:-}}" ]; then sleep "$STUB_SLEEP"; fi
exit "${{STUB_EXIT:-0}}"
"""


BUDGET, RESERVE = 540, 30  # the script's default seconds a command, less the kill grace and packing
FIRST_MAX, BOTH_MAX = 480, 660  # 15 minutes of a GPU machine less its start (2-3 min), the transfers and the end
SECOND = 215  # the second command's steps: its 255-s budget less the reserve and 10 s for the probe


def run(args: list[str], script: Path = SCRIPT, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SESSION_", "STUB_")) and k != "OUT"}
    full.update({"PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **env})
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=full, timeout=120,
                          cwd=cwd)


@pytest.fixture
def tree(tmp_path):
    """A copy of the script in a tree of its own, and a stand-in interpreter: the real repo stays untouched."""
    (tmp_path / "repo" / "bench").mkdir(parents=True)
    script = tmp_path / "repo" / "bench" / "gpu_session.sh"
    shutil.copy(SCRIPT, script)
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return script, str(stub)


def estimates() -> dict[str, int]:
    proc = run(["--list"])
    assert proc.returncode == 0, proc.stderr
    rows = [re.match(r"^(\S+)\s+(\d+) s  \S", line) for line in proc.stdout.splitlines()]
    assert all(rows), proc.stdout
    return {m.group(1): int(m.group(2)) for m in rows}


def test_list_names_every_step_with_an_estimate_that_fits_one_command():
    est = estimates()
    assert list(est) == STEPS
    assert all(0 < s <= BUDGET - RESERVE for s in est.values()), est


def readme_commands() -> list[tuple[int, list[str], int]]:
    """The docs' GPU commands: (GPU_SESSION_SECONDS, steps, the ~seconds it names)."""
    section = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    lines = re.findall(r"^(?:GPU_SESSION_SECONDS=(\d+) )?bash bench/gpu_session\.sh ([a-z -]+?)\s+"
                       r"# ~(\d+) s$", section, re.M)
    return [(int(budget or BUDGET), names.split(), int(secs)) for budget, names, secs in lines]


def test_readme_gpu_commands_cover_every_step_within_15_minutes():
    commands = readme_commands()
    est = estimates()
    assert len(commands) == 3  # the mission in the first, the rest in the second, a third past the 15 minutes
    assert sorted(s for _, names, _ in commands for s in names) == sorted(STEPS)  # each step exactly once
    assert commands[0][1] == STEPS[:len(commands[0][1])]  # the first runs the most important steps, in order
    assert commands[0][1] + commands[1][1] == IN_15_MINUTES and commands[2][1] == STEPS[len(IN_15_MINUTES):]
    for budget, names, secs in commands:
        assert secs == sum(est[n] for n in names)  # the comment is the sum of the estimates
        assert secs + RESERVE < budget <= 600  # every step of the command starts, by the script's own rule
    (_, _, first), (_, _, second), _ = commands
    assert first <= FIRST_MAX and first + second <= BOTH_MAX


def test_the_estimates_fit_15_minutes_whatever_the_readme_says():
    est = estimates()
    assert sum(est[s] for s in FIRST) <= FIRST_MAX
    assert sum(est[s] for s in IN_15_MINUTES) <= BOTH_MAX
    assert sum(est[s] for s in IN_15_MINUTES if s not in FIRST) <= SECOND
    assert est["gpu-tests"] >= 97  # the H100's 49 s while two blocks failed in 5 ms, and the 48 s they took passing


def test_unknown_step_is_exit_2_in_one_line():
    proc = run(["info", "bandwith"], CUPY_NWT_DISABLE_GPU="1")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown step 'bandwith'" in proc.stderr and proc.stdout == ""


def test_no_arguments_is_usage_and_exit_2():
    proc = run([])
    assert proc.returncode == 2 and "--list" in proc.stderr


@pytest.mark.parametrize("step", [*STEPS, "all"])
def test_every_step_without_a_gpu_is_exit_3_in_one_line(step, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run([step], CUPY_NWT_DISABLE_GPU="1", OUT=str(out))
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert list(out.iterdir()) == []


def test_a_failing_probe_is_still_one_line(tree, tmp_path):
    broken = tmp_path / "broken"
    (broken / "cupy_nwt").mkdir(parents=True)
    (broken / "cupy_nwt" / "__init__.py").write_text("raise OSError('libcuda exploded\\nsecond line')\n")
    proc = run(["info"], tree[0], PYTHONPATH=str(broken))  # the copied tree has no cupy_nwt of its own
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1
    assert "the probe failed (OSError: libcuda exploded)" in proc.stderr


def _returned(out: Path) -> list[Path]:
    files = [p for p in out.rglob("*") if p.is_file()]
    for f in files:  # what $OUT holds: plain names, at most two folders down
        rel = f.relative_to(out)
        assert len(rel.parts) <= 3 and all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts), rel
    return files


def test_with_out_each_step_comes_back_as_one_packed_file(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    proc = run(["all"], script, PYTHON=stub, OUT=str(out))
    assert proc.returncode == 0, proc.stderr
    files = _returned(out)
    assert sorted(f.name for f in files) == sorted(f"{s}.tgz" for s in STEPS)
    assert len(files) == len(STEPS) and {f.parent for f in files} == {out / DEVICE}
    with tarfile.open(out / DEVICE / "nwt.tgz") as tar:
        names = tar.getnames()
        assert "nwt/log.txt" in names and "nwt/stub-calls.txt" in names and "nwt/step.json" in names
        calls = tar.extractfile("nwt/stub-calls.txt").read().decode()
    assert "-m cupy_nwt reproduce --no-gpu --no-progress --max-workers 16 --iterations 100" in calls
    assert not (script.parent / "results").exists()  # nothing written into the tree when $OUT is set


def test_without_out_steps_write_into_bench_results(tree):
    script, stub = tree
    proc = run(["gpu-feed", "scaleout"], script, PYTHON=stub)
    assert proc.returncode == 0, proc.stderr
    results = script.parent / "results" / DEVICE
    assert sorted(p.name for p in results.iterdir()) == ["gpu-feed", "scaleout"]
    calls = (results / "scaleout" / "stub-calls.txt").read_text()
    assert f"--output {results.relative_to(script.parent.parent)}/scaleout/scaleout.json" in calls
    assert "stub ran: bench/studies/does_the_gpu_wait_for_batches/gpu_feed.py" in (results / "gpu-feed" / "log.txt").read_text()


def test_a_failing_step_is_reported_and_the_next_one_still_runs(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    proc = run(["transfers", "nwt"], script, PYTHON=stub, OUT=str(out), STUB_EXIT="1")
    assert proc.returncode == 1
    assert "FAILED: transfers (exit 1)" in proc.stderr and "FAILED: nwt (exit 1)" in proc.stderr
    assert sorted(f.name for f in _returned(out)) == ["nwt.tgz", "transfers.tgz"]


def test_a_step_past_its_time_is_cut_off_packed_and_the_rest_not_started(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    # gpu-tests is taken to need 1 s, so it may run 2 s (twice that), and the stub sleeps 60
    proc = run(["gpu-tests", "transfers"], script, PYTHON=stub, OUT=str(out), STUB_SLEEP="60",
               GPU_SESSION_SECONDS="15", GPU_SESSION_KILL_GRACE="1", GPU_SESSION_ESTIMATES="gpu-tests=1")
    assert proc.returncode == 1
    assert "CUT OFF: gpu-tests" in proc.stderr and "NOT STARTED: transfers (estimate 65 s" in proc.stderr
    assert [f.name for f in _returned(out)] == ["gpu-tests.tgz"]
    with tarfile.open(out / DEVICE / "gpu-tests.tgz") as tar:
        calls = tar.extractfile("gpu-tests/stub-calls.txt").read().decode()
    assert "-m pytest -m gpu" in calls


def test_a_step_whose_estimate_does_not_fit_is_not_started_and_later_ones_that_fit_still_run(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    proc = run(["nwt", "info"], script, PYTHON=stub, OUT=str(out), GPU_SESSION_SECONDS="60")  # 30 s to start steps
    assert proc.returncode == 1
    assert "NOT STARTED: nwt (estimate 51 s" in proc.stderr and "done: info" in proc.stderr
    assert [f.name for f in _returned(out)] == ["info.tgz"]


def test_the_deadline_counts_from_the_scripts_start_the_probe_included(tree, tmp_path):
    """A slow probe (CuPy's import, the driver's start) eats into the command's time like any step."""
    script, stub = tree
    # 47 s less 30 s reserve leaves 17 s for a 15-s estimate of info, but not after a 3-s probe
    proc = run(["info"], script, PYTHON=stub, GPU_SESSION_SECONDS="47", STUB_PROBE_SLEEP="3",
               GPU_SESSION_ESTIMATES="info=15")
    assert proc.returncode == 1
    assert re.search(r"NOT STARTED: info \(estimate 15 s, 1[0-4] s left", proc.stderr), proc.stderr


def test_gpu_tests_get_a_per_test_timeout_where_pytest_timeout_is_installed(tree, tmp_path):
    script, stub = tree
    assert run(["gpu-tests"], script, PYTHON=stub).returncode == 0
    results = script.parent / "results" / DEVICE
    calls = (results / "gpu-tests" / "stub-calls.txt").read_text()
    assert "-m pytest -m gpu" in calls and " tests bench " in calls and "--timeout=60" in calls
    assert f"--benchmark-json={results.relative_to(script.parent.parent)}/gpu-tests/benchmark.json" in calls
    proc = run(["gpu-tests"], script, PYTHON=stub, STUB_NO_TIMEOUT="1")
    assert proc.returncode == 0 and "pytest-timeout is not installed" in proc.stdout  # in the step's log.txt
    assert "--timeout" not in (results / "gpu-tests" / "stub-calls.txt").read_text()


NATIVE = """#!/usr/bin/env bash
echo "native $*" >>"$GPU_SESSION_STEP_DIR/stub-calls.txt"
echo '{"experiment": "'"$1"'", "source": "native"}'
"""


def test_transfers_alternates_cupy_nwt_and_native_over_three_rounds_and_reports_the_shares(tree):
    script, stub = tree
    native = script.parent / "native" / "build" / "nwt_native"  # built beforehand and copied to the GPU machine
    native.parent.mkdir(parents=True)
    native.write_text(NATIVE)
    native.chmod(0o755)
    assert run(["transfers"], script, PYTHON=stub).returncode == 0
    step = script.parent / "results" / DEVICE / "transfers"
    calls = (step / "stub-calls.txt").read_text().splitlines()
    rel = str(step.relative_to(script.parent.parent))
    one_round = [["-m", "cupy_nwt", "bandwidth"], ["native", "bandwidth"], ["-m", "cupy_nwt", "overlap"],
                 ["native", "overlap"]]
    assert [c.split()[:3] for c in calls] == [["native", "bandwidth", "--dry-run"],  # does it start here?
                                              *one_round * 3, ["bench/studies/are_transfers_as_fast_as_cuda_c/native_report.py", rel],
                                              ["bench/studies/are_transfers_as_fast_as_cuda_c/overlap_sweep.py", "--streams", "2,4,8"]]
    assert "--sizes 16MiB,64MiB --rounds 3" in calls[-1] and f"--output {rel}/overlap_sweep.json" in calls[-1]
    for sfx in ("", "-r2", "-r3"):  # the rounds' files, as native_report.py reads them
        assert json.loads((step / f"native-overlap{sfx}.json").read_text())["source"] == "native"
        assert f"--output {rel}/bandwidth{sfx}.json" in "\n".join(calls)


def test_transfers_without_nvcc_or_a_prebuilt_native_says_so_and_still_passes(tree):
    script, stub = tree  # the copied tree has no bench/native/
    proc = run(["transfers"], script, PYTHON=stub)
    assert proc.returncode == 0 and "the native reference is skipped" in proc.stdout
    calls = (script.parent / "results" / DEVICE / "transfers" / "stub-calls.txt").read_text().splitlines()
    assert len(calls) == 7 and calls[-1].startswith("bench/studies/are_transfers_as_fast_as_cuda_c/overlap_sweep.py")  # 3 rounds of cupy_nwt, the sweep


def test_unpack_takes_a_folder_relative_to_where_it_is_called(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "returned"
    out.mkdir()
    assert run(["info"], script, PYTHON=stub, OUT=str(out)).returncode == 0
    proc = run(["--unpack", "returned"], script, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (script.parent / "results" / DEVICE / "info" / "stub-calls.txt").is_file()


def test_unpack_brings_packed_and_cut_off_steps_into_bench_results(tree, tmp_path):
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    assert run(["info", "gpu-tests"], script, PYTHON=stub, OUT=str(out)).returncode == 0
    hard = out / DEVICE / "nwt"  # a command killed before it could pack: the step's folder came back
    hard.mkdir()
    (hard / "log.txt").write_text("partial\n")
    proc = run(["--unpack", str(out)], script)
    assert proc.returncode == 0, proc.stderr
    results = script.parent / "results" / DEVICE
    assert sorted(p.name for p in results.iterdir()) == ["gpu-tests", "info", "nwt"]
    assert (results / "info" / "stub-calls.txt").is_file() and (results / "nwt" / "log.txt").read_text() == "partial\n"
    assert run(["--unpack", str(tmp_path / "empty")], script).returncode == 2


def test_the_docs_first_command_runs_dry_and_packs_one_file_a_step(tree, tmp_path):
    """The first command as docs/gpu.md names it, with a stand-in interpreter that names a GPU and
    returns at once: every step runs, and what lands under $OUT is one packed file a step."""
    script, stub = tree
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    scratch.mkdir()
    budget, names, _ = readme_commands()[0]
    proc = run(names, script, PYTHON=stub, OUT=str(out), TMPDIR=str(scratch), GPU_SESSION_SECONDS=str(budget))
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[2] for ln in proc.stderr.splitlines() if ln.startswith("gpu_session: done:")] == names
    files = _returned(out)  # plain names, at most two folders down
    assert len(files) <= 8 and sorted(f.name for f in files) == sorted(f"{n}.tgz" for n in names)
    assert list(scratch.iterdir()) == []  # the steps' working folders are gone once packed
    for name in names:
        with tarfile.open(out / DEVICE / f"{name}.tgz") as tar:
            step = json.loads(tar.extractfile(f"{name}/step.json").read())
            assert step["outcome"] == "done" and step["estimate_s"] == estimates()[name] and step["seconds"] >= 0
            assert f"{name}/log.txt" in tar.getnames()
    with tarfile.open(out / DEVICE / "nwt.tgz") as tar:
        scale = json.loads(tar.extractfile("nwt/scale.json").read())
    assert scale["scale"] == 1 and scale["arguments"].startswith("--iterations 100 --compare-iterations 50")


def test_a_step_that_no_longer_fits_after_the_earlier_ones_is_not_started(tree, tmp_path):
    """The deadline counts from the script's start: time the earlier steps took is gone for the later ones."""
    script, stub = tree
    out = tmp_path / "out"
    out.mkdir()
    # 45 s less the 11-s reserve (1-s grace + packing): 34 s, room for transfers' 30 before info's ~6
    proc = run(["info", "transfers"], script, PYTHON=stub, OUT=str(out), STUB_SLEEP="2",
               GPU_SESSION_SECONDS="45", GPU_SESSION_KILL_GRACE="1", GPU_SESSION_ESTIMATES="info=8,transfers=30")
    assert proc.returncode == 1
    assert "done: info" in proc.stderr
    m = re.search(r"NOT STARTED: transfers \(estimate 30 s, (\d+) s left", proc.stderr)
    assert m and int(m.group(1)) < 30, proc.stderr
    assert [f.name for f in _returned(out)] == ["info.tgz"]


def test_the_nwt_scale_scales_its_batches_and_estimate_and_is_written_beside_its_results(tree):
    script, stub = tree
    listed = run(["--list"], GPU_SESSION_NWT_SCALE="0.5").stdout
    assert re.search(r"^nwt\s+40 s ", listed, re.M)  # 28 s whatever the scale + 23 s of batches at half
    assert run(["nwt"], script, PYTHON=stub, GPU_SESSION_NWT_SCALE="0.5").returncode == 0
    step = script.parent / "results" / DEVICE / "nwt"
    assert "--iterations 50 --compare-iterations 25 --compare-repeats 3" in (step / "stub-calls.txt").read_text()
    scale = json.loads((step / "scale.json").read_text())
    assert scale["scale"] == 0.5 and scale["estimate_s"] == 40
    assert json.loads((step / "step.json").read_text())["estimate_s"] == 40


@pytest.mark.parametrize("env", [{"GPU_SESSION_NWT_SCALE": "2"}, {"GPU_SESSION_NWT_SCALE": "0.05"},
                                 {"GPU_SESSION_NWT_SCALE": "half"}, {"GPU_SESSION_SECONDS": "9m"},
                                 {"GPU_SESSION_ESTIMATES": "nwt=abc"}, {"GPU_SESSION_ESTIMATES": "nope=30"},
                                 {"GPU_SESSION_ESTIMATES": "info=4,nwt"}])
@pytest.mark.parametrize("args", [["info"], ["--list"]])
def test_bad_settings_are_exit_2_in_one_line(tree, env, args):
    """--list as well: it shows the estimates a bad setting would have changed (an estimate it could not
    read was once ignored without a word)."""
    script, stub = tree
    proc = run(args, script, PYTHON=stub, **env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_a_prebuilt_native_reference_that_does_not_start_is_built_again(tree):
    script, stub = tree
    native = script.parent / "native" / "build" / "nwt_native"
    native.parent.mkdir(parents=True)
    native.write_text("#!/bin/sh\nexit 127\n")  # as a binary whose libraries the machine lacks
    native.chmod(0o755)
    proc = run(["transfers"], script, PYTHON=stub)  # the copied tree has no bench/native/ to build it from
    assert proc.returncode == 0
    assert "does not start here (exit 127)" in proc.stdout and "the native reference is skipped" in proc.stdout


def test_loader_compare_runs_the_tiny_arrays_against_a_prepared_before_tree(tree):
    script, stub = tree
    (script.parent.parent / ".gpu-run" / "before" / "cupy_nwt").mkdir(parents=True)  # as --prepare-before leaves it
    proc = run(["loader-compare"], script, PYTHON=stub)
    assert proc.returncode == 0, proc.stderr
    step = script.parent / "results" / DEVICE / "loader-compare"
    calls = (step / "stub-calls.txt").read_text().splitlines()
    assert calls[0].startswith("bench/studies/is_the_loader_faster_than_torch/loader_compare.py --device cuda")
    assert calls[1].startswith("bench/studies/what_does_the_loader_itself_cost/tiny_arrays.py --before .gpu-run/before --after . --workers 0,8,15 --rounds 5")
    assert f"--out {step.relative_to(script.parent.parent)}/tiny_arrays.json" in calls[1]
    assert "skipped" not in (step / "log.txt").read_text()


def test_loader_compare_without_the_before_tree_skips_the_tiny_arrays_in_one_line(tree):
    script, stub = tree
    proc = run(["loader-compare"], script, PYTHON=stub)
    assert proc.returncode == 0 and "done: loader-compare" in proc.stderr
    step = script.parent / "results" / DEVICE / "loader-compare"
    assert len((step / "stub-calls.txt").read_text().splitlines()) == 1  # loader_compare.py alone
    skipped = [ln for ln in (step / "log.txt").read_text().splitlines() if "tiny" in ln]
    assert len(skipped) == 1 and "no .gpu-run/before/cupy_nwt" in skipped[0] and "skipped" in skipped[0]


@pytest.fixture
def clone(tmp_path):
    """A scratch clone of the project holding this gpu_session.sh: --prepare-before writes into its .git."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout of the project to clone")
    repo = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(repo)], check=True, capture_output=True)
    (repo / "bench").mkdir()
    shutil.copy(SCRIPT, repo / "bench" / "gpu_session.sh")
    return repo


def test_prepare_before_archives_the_loader_into_an_ignored_folder(clone):
    script = clone / "bench" / "gpu_session.sh"
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for _ in range(2):  # a second run replaces the tree and adds no second exclude line
        proc = run(["--prepare-before", "HEAD"], script)
        assert proc.returncode == 0, proc.stderr
    before = clone / ".gpu-run" / "before"
    assert (before / "cupy_nwt" / "loader" / "__init__.py").is_file()
    assert (before / "REVISION").read_text().strip() == head
    assert sorted(p.name for p in before.iterdir()) == ["REVISION", "cupy_nwt"]  # the package and its stamp alone
    assert (clone / ".git" / "info" / "exclude").read_text().splitlines().count("/.gpu-run/") == 1
    ignored = subprocess.run(["git", "-C", str(clone), "check-ignore", ".gpu-run/before/REVISION"], capture_output=True)
    assert ignored.returncode == 0
    assert "copy .gpu-run along with the tree" in proc.stdout


def test_prepare_before_refuses_what_is_no_revision_in_one_line(clone):
    proc = run(["--prepare-before", "no-such-revision-xyz"], clone / "bench" / "gpu_session.sh")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a revision" in proc.stderr
    assert not (clone / ".gpu-run").exists()
    assert run(["--prepare-before", "HEAD", "extra"], clone / "bench" / "gpu_session.sh").returncode == 2


def test_gpu_feed_runs_five_second_loops_three_times(tree):
    script, stub = tree
    assert run(["gpu-feed"], script, PYTHON=stub).returncode == 0
    calls = (script.parent / "results" / DEVICE / "gpu-feed" / "stub-calls.txt").read_text()
    assert "--workers 4,15 --modes cupy_nwt,torch --loops queued --seconds 5 --repeats 3" in calls


def test_loader_compare_times_300_batches_three_times_with_the_first_batch_at_15_and_16(tree):
    script, stub = tree
    assert run(["loader-compare"], script, PYTHON=stub).returncode == 0
    calls = (script.parent / "results" / DEVICE / "loader-compare" / "stub-calls.txt").read_text()
    assert "--workers 4,15,16 --loaders cupy_nwt,torch --batches 300 --repeats 3" in calls


def test_scaleout_also_measures_two_processes_copies(tree):
    script, stub = tree
    assert run(["scaleout"], script, PYTHON=stub).returncode == 0
    calls = (script.parent / "results" / DEVICE / "scaleout" / "stub-calls.txt").read_text().splitlines()
    assert calls[0].startswith("bench/studies/does_it_scale_over_ranks/scaleout.py --ranks 1,2 --repeats 3")
    assert calls[1].startswith("bench/studies/does_it_scale_over_ranks/copy_engines.py --mib 256")


def test_gpu_decode_without_wheels_says_so_in_one_line_and_still_runs_the_study(tree):
    script, stub = tree
    assert run(["gpu-decode"], script, PYTHON=stub).returncode == 0
    step = script.parent / "results" / DEVICE / "gpu-decode"
    calls = (step / "stub-calls.txt").read_text().splitlines()
    assert calls == [f"bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py --out-dir {step.relative_to(script.parent.parent)}"]
    said = [ln for ln in (step / "log.txt").read_text().splitlines() if "wheels" in ln]
    assert len(said) == 1 and "no wheels in .whl/" in said[0] and "--prepare-wheels" in said[0]


def test_decode_placement_runs_the_tuners_placement_search_into_its_folder(tree):
    script, stub = tree
    assert run(["decode-placement"], script, PYTHON=stub).returncode == 0
    step = script.parent / "results" / DEVICE / "decode-placement"
    calls = (step / "stub-calls.txt").read_text().splitlines()
    assert calls == [f"bench/studies/does_the_gpu_decode_jpegs/decode_placement.py --out-dir "
                     f"{step.relative_to(script.parent.parent)}"]
    assert "no wheels in .whl/" in (step / "log.txt").read_text()


@pytest.mark.parametrize("refuse", ["", "1"])
def test_gpu_decode_installs_the_wheels_brought_along_offline_first(tree, refuse):
    script, stub = tree
    wheels = script.parent.parent / ".whl"
    wheels.mkdir()
    (wheels / "nvidia_nvimgcodec_cu13-0.6.1.37-py3-none-manylinux2014_x86_64.whl").write_text("")
    proc = run(["gpu-decode"], script, PYTHON=stub, STUB_PIP_REFUSE=refuse)
    assert proc.returncode == 0, proc.stderr
    calls = (script.parent / "results" / DEVICE / "gpu-decode" / "stub-calls.txt").read_text().splitlines()
    installs = [c for c in calls if c.startswith("-m pip install")]
    assert all("--no-index --find-links .whl" in c and "nvidia-nvimgcodec-cu13[nvjpeg]" in c for c in installs)
    assert len(installs) == (2 if refuse else 1)  # an externally managed Python is asked again, past that
    assert ("--break-system-packages" in installs[-1]) == bool(refuse)
    assert calls[-1].startswith("bench/studies/does_the_gpu_decode_jpegs/gpu_decode.py")


def test_prepare_wheels_downloads_for_the_gpu_machines_python(tree, tmp_path):
    script, _ = tree
    fake = tmp_path / "pip-stub"
    fake.write_text('#!/usr/bin/env bash\necho "$*" >"$STUB_LOG"\nwhile [ "$1" != -d ]; do shift; done\n'
                    'touch "$2/nvidia_nvimgcodec_cu13-0.6.1.37-py3-none-manylinux2014_x86_64.whl"\n')
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    proc = run(["--prepare-wheels"], script, PYTHON=str(fake), STUB_LOG=str(log))
    assert proc.returncode == 0, proc.stderr
    args = log.read_text()
    assert args.startswith("-m pip download") and "--python-version 3.12 --only-binary=:all:" in args
    assert "--platform manylinux2014_x86_64 -d .whl" in args and "nvidia-nvjpeg==13.0.*" in args
    assert "1 wheels" in proc.stdout and "copy .whl along with the tree" in proc.stdout
    assert run(["--prepare-wheels", "extra"], script).returncode == 2
