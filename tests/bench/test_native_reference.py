"""bench/native/ (the CUDA C reference) and bench/native_report.py, without a GPU.

The native program builds here warning-free for sm_90 and its no-GPU paths answer in JSON; its
statistics agree with cupy_nwt's. The report is checked on files of both shapes: cupy_nwt's built
by its own result classes, the native one in the shape nwt_native prints.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_overlap import _constant_result as overlap_result
from test_transfers import GEN5
from test_transfers import _constant_result as bandwidth_result

from cupy_nwt._reporting import tables as report
from cupy_nwt.experiments import kernel_check, timing

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "bench" / "native"
sys.path.insert(0, str(ROOT / "bench"))
import native_report  # noqa: E402


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    if kernel_check.find_nvcc() is None or shutil.which("make") is None:
        pytest.skip("nvcc or make is not installed here: the native reference cannot be built")
    build = tmp_path_factory.mktemp("native-build")
    proc = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={build}", f"NVCC={kernel_check.find_nvcc()}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every warning is an error there
    assert "warning:" not in proc.stderr.lower() and "warning #" not in proc.stderr.lower()
    return build / "nwt_native"


def run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60)


def test_native_statistics_are_cupy_nwts(native):
    xs = [3.0, 1.0, 2.0, 4.0, 10.0, 2.5]
    proc = run(native, "summarize", *map(str, xs))
    assert proc.returncode == 0, proc.stderr
    ours = timing.summarize(xs)
    theirs = json.loads(proc.stdout)
    for key in ("median", "mean", "min", "max", "stdev", "p25", "p75", "n"):
        assert theirs[key] == pytest.approx(getattr(ours, key), rel=1e-8), key


@pytest.mark.parametrize("experiment", ["bandwidth", "overlap"])
def test_native_dry_run_is_one_error_document_and_exit_3(native, experiment):
    proc = run(native, experiment, "--dry-run")
    assert proc.returncode == 3
    assert json.loads(proc.stdout) == {"experiment": experiment, "source": "native",
                                       "error": "dry run: no CUDA call was made"}


def test_native_bad_arguments_are_exit_2_with_escaped_json(native):
    proc = run(native, "overlap", '--we"ird\\')
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"] == 'option --we"ird\\ needs a value'
    assert run(native).returncode == 2 and run(native, "bandwidth", "--min", "9", "--max", "3").returncode == 2


def test_native_without_a_gpu_says_so_in_json(native):
    proc = run(native, "bandwidth", "--max", "8192")
    if proc.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert proc.returncode == 3 and json.loads(proc.stdout)["error"].startswith("no usable GPU")


def test_native_prints_every_field_the_report_reads():
    source = (NATIVE / "nwt_native.cu").read_text()
    for key in ("experiment", "points", "direction", "memory", "nbytes", "gbps", "median", "batching",
                "total_bytes", "chunks", "one_copy_gbps", "many_copies_gbps", "stages", "versions", "name", "seconds"):
        assert f'"{key}"' in source, key
    assert re.search(r'#include "spin.cu"', source) and re.search(r'#include "overlap.cu"', source)


# ------------------------------------------------------------------ the report, on files of both shapes


def _native_of(doc: dict, gbps_factor: float = 1.0, seconds_factor: float = 1.0) -> dict:
    """nwt_native's shape: the fields it prints, scaled from a cupy_nwt document."""
    out = copy.deepcopy(doc)
    out["source"] = "native"
    for p in out.get("points", []):
        p["gbps"]["median"] *= gbps_factor
    for b in out.get("batching", []):
        b["one_copy_gbps"] *= gbps_factor
        b["many_copies_gbps"] *= gbps_factor
    for s in out.get("stages", {}).values():
        s["median"] *= seconds_factor
    for v in out.get("versions", []):
        v["seconds"]["median"] *= seconds_factor
    return out


def _write(folder: Path, gbps_factor: float, seconds_factor: float) -> Path:
    bw = json.loads(report.to_json(bandwidth_result(GEN5)))
    ov = json.loads(report.to_json(overlap_result()))
    for name, doc in (("bandwidth.json", bw), ("overlap.json", ov),
                      ("native-bandwidth.json", _native_of(bw, gbps_factor)),
                      ("native-overlap.json", _native_of(ov, seconds_factor=seconds_factor))):
        (folder / name).write_text(json.dumps(doc))
    return folder


def test_report_gives_cupy_nwt_over_native_per_figure(tmp_path, capsys):
    folder = _write(tmp_path, gbps_factor=1.02, seconds_factor=0.95)  # native 2% faster copies, 5% faster overlap
    assert native_report.main([str(folder)]) == 0
    rep = json.loads((folder / "native_vs_cupy_nwt.json").read_text())
    rows = {r["figure"]: r for r in rep["rows"]}
    pinned = rows[f"h2d pinned {16 * 1024**2} B"]
    assert pinned["share"] == pytest.approx(1 / 1.02) and pinned["copy_bound"] and pinned["meets_goal"]
    assert not rows[f"h2d pageable {16 * 1024**2} B"]["copy_bound"]  # pageable: the staging sets the time
    assert not rows[f"d2h pinned {64 * 1024} B"]["copy_bound"]  # small: the call may set the time
    assert rows["overlap async_v2"]["share"] == pytest.approx(0.95) and rows["overlap async_v2"]["meets_goal"] is False
    assert "overlap async_v2" in rep["copy_bound_below_goal"] and rep["unmatched"] == []
    assert rep["copy_bound_min_share"] == pytest.approx(0.95)
    out = capsys.readouterr().out
    assert "BELOW" in out and "overlap stage kernel" in out


def test_report_lists_figures_native_did_not_measure(tmp_path):
    folder = _write(tmp_path, 1.0, 1.0)
    nb = json.loads((folder / "native-bandwidth.json").read_text())
    nb["points"] = [p for p in nb["points"] if p["nbytes"] != 64 * 1024]
    (folder / "native-bandwidth.json").write_text(json.dumps(nb))
    rep = native_report.compare(folder)
    assert len(rep["unmatched"]) == 4 and all("65536 B" in f for f in rep["unmatched"])
    assert rep["copy_bound_min_share"] == pytest.approx(1.0)


@pytest.mark.parametrize(("name", "content", "match"), [
    ("native-overlap.json", '{"experiment": "overlap", "source": "native", "error": "no usable GPU: x"}',
     "the native run failed: no usable GPU"),
    ("overlap.json", '{"experiment": "bandwidth"}', "not a overlap result"),
    ("bandwidth.json", "{cut", "cannot read it as JSON"),
])
def test_report_refuses_a_failed_or_wrong_input_in_one_line(tmp_path, capsys, name, content, match):
    folder = _write(tmp_path, 1.0, 1.0)
    (folder / name).write_text(content)
    assert native_report.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not (folder / "native_vs_cupy_nwt.json").exists()
