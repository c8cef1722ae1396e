"""bench/native/ (the CUDA C reference) and bench/studies/are_transfers_as_fast_as_cuda_c/native_report.py, without a GPU.

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

from cupy_nwt.experiments import kernel_check, pipeline_model, timing
from cupy_nwt.reporting import tables as report

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "bench" / "native"
sys.path.insert(0, str(ROOT / "bench" / "studies" / "are_transfers_as_fast_as_cuda_c"))
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


@pytest.mark.parametrize("argv", [["bandwidth", "--max", "8192"], ["overlap", "--repeats", "2"]])
def test_native_without_a_gpu_says_so_in_json(native, argv):
    proc = run(native, *argv)
    if proc.returncode == 0:
        pytest.skip("this machine has a GPU")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["error"].startswith("no usable GPU") and doc["experiment"] == argv[0]


@pytest.mark.parametrize(("stages", "streams", "ratios", "serial"), [
    ((1.0, 0.5, 1.0), 4, (1.5, 1.25), 4 * 2.5 + 11 * 0.25),
    ((7.9e-5, 1.6e-5, 7.8e-5), 4, (1.3, 1.05), 7.3e-4),
    ((1.0, 2.0, 1.0), 3, (1.5, 1.5), 12.0),
    ((1.0, 0.5, 1.0), 1, (3.0, 3.0), 2.7),
])
def test_native_ideals_are_pipeline_models(native, stages, streams, ratios, serial):
    proc = run(native, "ideal", *map(str, (*stages, streams, *ratios, serial)))
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)
    hop = pipeline_model.handoff_seconds(serial, *stages, streams)
    assert theirs["handoff_seconds"] == pytest.approx(hop, rel=1e-8)
    assert theirs["ideal_seconds"] == pytest.approx(pipeline_model.ideal_pipeline_seconds(*stages, streams), rel=1e-8)
    assert theirs["duplex_seconds"] == pytest.approx(
        pipeline_model.measured_ideal_seconds(*stages, streams, *ratios), rel=1e-8)
    assert theirs["seconds"] == pytest.approx(
        pipeline_model.measured_ideal_seconds(*stages, streams, *ratios, hop), rel=1e-8)


def test_native_ideal_refuses_what_pipeline_model_refuses(native):
    assert run(native, "ideal", "1", "1", "1", "0", "1", "1", "3").returncode == 2
    assert run(native, "ideal", "1", "1", "1", "4", "0", "1", "3").returncode == 2
    assert run(native, "ideal", "1", "x", "1", "4", "1", "1", "3").returncode == 2


@pytest.mark.parametrize("argv", [
    ["overlap", "--repeats", "99999999999999999999999"],  # past long long: strtoll would clamp it
    ["overlap", "--repeats", "3000000000"],  # past int, where the count ends up
    ["bandwidth", "--max", "9223372036854775807"],  # doubling the sizes up to it would overflow
    ["bandwidth", "--min", " 5"],
    ["summarize", "nan", "1", "2"],  # NaN has no order: the median would be any number
    ["summarize", ""],  # strtod reads nothing: it was 0
    ["summarize", "1e999"],
    ["ideal", "1", "1", "1", "2.5", "1", "1", "10"],  # streams are whole
    ["ideal", "1", "1", "1", "nan", "1", "1", "10"],  # a NaN cast to int is undefined
    ["ideal", "-1", "1", "1", "4", "1", "1", "10"],  # pipeline_model refuses negative stages
    ["ideal", "1", "1", "1", "4", "nan", "1", "10"],
])
def test_native_refuses_numbers_out_of_range_in_one_json_line(native, argv):
    proc = run(native, *argv)
    assert proc.returncode == 2, proc.stdout
    assert "error" in json.loads(proc.stdout) and proc.stderr.count("\n") == 1


def test_native_help_names_every_command_and_exits_0(native):
    proc = run(native, "--help")
    assert proc.returncode == 0
    for word in ("bandwidth", "overlap", "--dry-run", "summarize", "ideal", "--batch-chunk", "--streams"):
        assert word in proc.stdout, word


def test_native_prints_every_field_the_report_reads():
    source = (NATIVE / "nwt_native.cu").read_text()
    for key in ("experiment", "points", "direction", "memory", "nbytes", "gbps", "median", "batching",
                "total_bytes", "chunks", "one_copy_gbps", "many_copies_gbps", "stages", "versions", "name", "seconds",
                "duplex", "h2d_alone", "d2h_alone", "h2d_duplex", "d2h_duplex", "handoff", "serial_chunks",
                "ideal_from_measured_stages", "excess_explained", "vs_ideal", "vs_measured_ideal", "by_duplex",
                "by_handoff", "unexplained", "crossings_for_the_rest"):
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
    for p in out.get("duplex", []):
        for key in p["gbps"]:
            p["gbps"][key] *= gbps_factor
    if out.get("handoff"):
        out["handoff"]["serial_chunks"]["seconds"]["median"] *= seconds_factor
        out["handoff"]["seconds"] *= seconds_factor
        out["ideal_from_measured_stages"]["seconds"] *= seconds_factor
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
    batched = [name for name in rows if " as " in name]
    assert batched and all(rows[name]["copy_bound"] == (" pinned " in name) for name in batched), batched
    assert rows["overlap async_v2"]["share"] == pytest.approx(0.95) and rows["overlap async_v2"]["meets_goal"] is False
    assert "overlap async_v2" in rep["copy_bound_below_goal"] and rep["unmatched"] == []
    assert rep["copy_bound_min_share"] == pytest.approx(0.95)
    out = capsys.readouterr().out
    assert "BELOW" in out and "overlap stage kernel" in out


def test_report_compares_the_duplex_stage_and_lists_both_excess_splits(tmp_path, capsys):
    folder = _write(tmp_path, gbps_factor=1.25, seconds_factor=1.0)  # native copies 25% faster
    ov = json.loads(report.to_json(overlap_result(async_v1=6.2e-4)))
    (folder / "overlap.json").write_text(json.dumps(ov))
    native = _native_of(ov, gbps_factor=1.25)
    native["versions"][1]["excess_explained"]["by_duplex"] = 0.5  # what nwt_native would have written
    (folder / "native-overlap.json").write_text(json.dumps(native))
    assert native_report.main([str(folder)]) == 0
    rep = json.loads((folder / "native_vs_cupy_nwt.json").read_text())
    rows = {r["figure"]: r for r in rep["rows"]}
    chunk = 4 * 1024 * 256 * 4
    h2d = rows[f"overlap duplex h2d_duplex {chunk} B"]
    assert h2d["cupy_nwt"] == pytest.approx(chunk / 1e-4 / 1e9) and h2d["share"] == pytest.approx(0.8)
    assert h2d["copy_bound"] and h2d["meets_goal"] is False
    assert rows["overlap hand-off"]["cupy_nwt"] == pytest.approx(2e-6) and not rows["overlap hand-off"]["copy_bound"]
    assert rows["overlap serial_chunks"]["share"] == pytest.approx(1.0)
    assert rows["overlap ideal from measured stages"]["native"] == pytest.approx(5.99e-4)
    assert rep["unmatched"] == []
    excess = {(e["source"], e["version"]): e for e in rep["excess"]}
    assert set(excess) == {(s, v) for s in ("cupy_nwt", "native") for v in ("async_v1", "async_v2")}
    assert excess[("cupy_nwt", "async_v1")]["by_duplex"] == pytest.approx(0.75)
    assert excess[("cupy_nwt", "async_v1")]["crossings_for_the_rest"] == pytest.approx(12.5)
    assert excess[("native", "async_v1")]["by_duplex"] == pytest.approx(0.5)
    assert excess[("cupy_nwt", "async_v2")]["by_duplex"] is None  # faster than the ideal: nothing to explain
    out = capsys.readouterr().out
    assert "cupy_nwt async_v1" in out and "75%" in out and "50%" in out and "12.5" in out


def test_report_reads_an_overlap_file_from_before_the_duplex_stage(tmp_path):
    folder = _write(tmp_path, 1.0, 1.0)
    for name in ("overlap.json", "native-overlap.json"):
        doc = json.loads((folder / name).read_text())
        for key in ("duplex", "handoff", "ideal_from_measured_stages"):
            doc.pop(key)
        for v in doc["versions"]:
            v.pop("excess_explained")
        (folder / name).write_text(json.dumps(doc))
    rep = native_report.compare(folder)
    assert rep["excess"] == [] and rep["unmatched"] == []
    assert not any("duplex" in r["figure"] or "hand-off" in r["figure"] for r in rep["rows"])


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


def test_report_takes_alternated_rounds_and_judges_a_share_only_where_its_interval_allows(tmp_path):
    rounds = [(1.02, 0.95), (0.99, 0.99), (1.0, 1.02)]  # native's copies and overlap, round by round
    for k, (gbps, seconds) in enumerate(rounds, start=1):
        scratch = tmp_path / f"round{k}"
        scratch.mkdir()
        _write(scratch, gbps_factor=gbps, seconds_factor=seconds)
        for f in scratch.iterdir():
            shutil.copy(f, tmp_path / (f.name if k == 1 else f.name.replace(".json", f"-r{k}.json")))
    assert native_report.rounds(tmp_path) == ["", "-r2", "-r3"]
    rep = native_report.compare(tmp_path)
    rows = {r["figure"]: r for r in rep["rows"]}
    pinned = rows[f"h2d pinned {16 * 1024**2} B"]
    assert pinned["rounds"]["repeats"] == 3 and pinned["share"] == pytest.approx(1.0)
    assert pinned["rounds"]["low"] == pytest.approx(1 / 1.02) and pinned["verdict"] == "met"  # all of it >= 0.97
    v2 = rows["overlap async_v2"]
    assert v2["rounds"]["low"] < 0.97 < v2["rounds"]["high"] and v2["verdict"] == "undecided"
    assert rows[f"h2d pageable {16 * 1024**2} B"]["verdict"] is None  # not copy-bound: not judged
    assert rep["rounds"] == 3 and "overlap async_v2" in rep["verdicts"]["undecided"]
    (tmp_path / "overlap-r3.json").unlink()  # an incomplete round is left out, not half-read
    assert native_report.rounds(tmp_path) == ["", "-r2"]


def test_one_round_decides_nothing(tmp_path):
    rep = native_report.compare(_write(tmp_path, gbps_factor=1.0, seconds_factor=1.0))
    assert rep["rounds"] == 1 and {r["verdict"] for r in rep["rows"]} <= {"undecided", None}
