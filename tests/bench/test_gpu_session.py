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
STEPS = ["info", "gpu-tests", "gpu-bench", "transfers", "nwt", "gpu-feed", "loader-compare", "scaleout"]
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
if [ -n "${{STUB_SLEEP:-}}" ]; then sleep "$STUB_SLEEP"; fi
exit "${{STUB_EXIT:-0}}"
"""


BUDGET, RESERVE = 540, 30  # the script's default seconds a command, less the kill grace and packing


def run(args: list[str], script: Path = SCRIPT, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SESSION_") and k != "OUT"}
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


def test_docs_gpu_commands_cover_every_step_within_the_limits():
    section = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    lines = re.findall(r"^bash bench/gpu_session\.sh ([a-z -]+?)\s+# ~(\d+) s$", section, re.M)
    est = estimates()
    commands = [(names.split(), int(secs)) for names, secs in lines]
    assert 1 <= len(commands) <= 2  # the whole GPU script in two commands
    assert sorted(s for names, _ in commands for s in names) == sorted(STEPS)  # each step exactly once
    for names, secs in commands:
        assert secs == sum(est[n] for n in names)  # the comment is the sum of the estimates
        assert secs <= BUDGET - RESERVE  # every step of the command starts, by the script's own rule
    assert sum(secs for _, secs in commands) <= 25 * 60  # 30 minutes of GPU time, less the machine's starts


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
    for f in files:  # what the device tool brings back: plain names, at most two folders down
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
    assert len(files) <= 8 and {f.parent for f in files} == {out / DEVICE}
    with tarfile.open(out / DEVICE / "nwt.tgz") as tar:
        names = tar.getnames()
        assert "nwt/log.txt" in names and "nwt/stub-calls.txt" in names
        calls = tar.extractfile("nwt/stub-calls.txt").read().decode()
    assert "-m cupy_nwt reproduce --no-gpu --no-progress --out" in calls
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
    # gpu-tests is taken to need 1 s; with 15 s and a 1-s grace it gets 4 s, and the stub sleeps 60
    proc = run(["gpu-tests", "transfers"], script, PYTHON=stub, OUT=str(out), STUB_SLEEP="60",
               GPU_SESSION_SECONDS="15", GPU_SESSION_KILL_GRACE="1", GPU_SESSION_ESTIMATES="gpu-tests=1")
    assert proc.returncode == 1
    assert "CUT OFF: gpu-tests" in proc.stderr and "NOT STARTED: transfers (estimate 75 s" in proc.stderr
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
    assert "NOT STARTED: nwt (estimate 250 s" in proc.stderr and "done: info" in proc.stderr
    assert [f.name for f in _returned(out)] == ["info.tgz"]


def test_the_deadline_counts_from_the_scripts_start_the_probe_included(tree, tmp_path):
    """A slow probe (CuPy's import, the driver's start) eats into the command's time like any step."""
    script, stub = tree
    # 47 s less 30 s reserve leaves 17 s for info's 15 s estimate, but not after a 3-s probe
    proc = run(["info"], script, PYTHON=stub, GPU_SESSION_SECONDS="47", STUB_PROBE_SLEEP="3")
    assert proc.returncode == 1
    assert re.search(r"NOT STARTED: info \(estimate 15 s, 1[0-4] s left", proc.stderr), proc.stderr


def test_gpu_tests_get_a_per_test_timeout_where_pytest_timeout_is_installed(tree, tmp_path):
    script, stub = tree
    assert run(["gpu-tests", "gpu-bench"], script, PYTHON=stub).returncode == 0
    results = script.parent / "results" / DEVICE
    for step in ("gpu-tests", "gpu-bench"):
        assert "--timeout=120" in (results / step / "stub-calls.txt").read_text()
    proc = run(["gpu-tests"], script, PYTHON=stub, STUB_NO_TIMEOUT="1")
    assert proc.returncode == 0 and "pytest-timeout is not installed" in proc.stdout  # in the step's log.txt
    assert "--timeout" not in (results / "gpu-tests" / "stub-calls.txt").read_text()


NATIVE = """#!/usr/bin/env bash
echo "native $*" >>"$GPU_SESSION_STEP_DIR/stub-calls.txt"
echo '{"experiment": "'"$1"'", "source": "native"}'
"""


def test_transfers_runs_the_native_reference_beside_cupy_nwt_and_reports_the_shares(tree):
    script, stub = tree
    native = script.parent / "native" / "build" / "nwt_native"  # built beforehand and carried to the GPU
    native.parent.mkdir(parents=True)
    native.write_text(NATIVE)
    native.chmod(0o755)
    assert run(["transfers"], script, PYTHON=stub).returncode == 0
    step = script.parent / "results" / DEVICE / "transfers"
    calls = (step / "stub-calls.txt").read_text().splitlines()
    assert [c.split()[:3] for c in calls] == [["-m", "cupy_nwt", "bandwidth"], ["-m", "cupy_nwt", "overlap"],
                                              ["native", "bandwidth"], ["native", "overlap"],
                                              ["bench/native_report.py", str(step.relative_to(script.parent.parent))]]
    assert json.loads((step / "native-overlap.json").read_text())["source"] == "native"


def test_transfers_without_nvcc_or_a_prebuilt_native_says_so_and_still_passes(tree):
    script, stub = tree  # the copied tree has no bench/native/
    proc = run(["transfers"], script, PYTHON=stub)
    assert proc.returncode == 0 and "the native reference is skipped" in proc.stdout


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
    assert run(["info", "gpu-bench"], script, PYTHON=stub, OUT=str(out)).returncode == 0
    hard = out / DEVICE / "nwt"  # a command killed before it could pack: the step's folder came back
    hard.mkdir()
    (hard / "log.txt").write_text("partial\n")
    proc = run(["--unpack", str(out)], script)
    assert proc.returncode == 0, proc.stderr
    results = script.parent / "results" / DEVICE
    assert sorted(p.name for p in results.iterdir()) == ["gpu-bench", "info", "nwt"]
    assert (results / "info" / "stub-calls.txt").is_file() and (results / "nwt" / "log.txt").read_text() == "partial\n"
    assert run(["--unpack", str(tmp_path / "empty")], script).returncode == 2
