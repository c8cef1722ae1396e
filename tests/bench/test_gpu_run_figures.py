"""The GPU run's headline figures from repeats: intervals and met / missed / undecided, checked without a GPU.

``cupy_nwt.reporting.figures`` judges a target only where a figure's interval allows; the studies
the GPU run calls (gpu_feed.py, loader_compare.py, overlap_sweep.py, native_report.py) carry their
repeats into it. Here their summaries are fed made-up repeats: no timing is asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cupy_nwt.reporting.figures import figure, judge

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("low", "high", "target", "higher", "verdict"), [
    (0.98, 1.01, 0.97, True, "met"), (0.90, 0.96, 0.97, True, "missed"), (0.95, 0.99, 0.97, True, "undecided"),
    (0.01, 0.04, 0.05, False, "met"), (0.06, 0.20, 0.05, False, "missed"), (0.03, 0.08, 0.05, False, "undecided"),
])
def test_a_target_is_judged_only_where_the_interval_allows(low, high, target, higher, verdict):
    assert judge(low, high, target, higher) == verdict


def test_a_figure_holds_its_repeats_interval_and_verdict():
    f = figure([0.02, 0.03, 0.025, float("nan")], 0.05, higher_is_better=False)
    assert f["repeats"] == 3 and f["dropped"] == 1 and f["median"] == pytest.approx(0.025)
    assert f["low"] <= f["median"] <= f["high"] and f["verdict"] == "met" and f["level"] == 0.9
    assert figure([0.5, 0.6], 1.0)["verdict"] == "undecided"  # under 3 repeats nothing is decided
    assert figure([], 1.0)["median"] is None and figure([1.0, 2.0, 3.0])["verdict"] is None
    with pytest.raises(ValueError):
        judge(2.0, 1.0, 1.5)


@pytest.fixture
def gpu_feed(monkeypatch):
    import importlib.util  # noqa: PLC0415

    path = ROOT / "bench" / "studies" / "does_the_gpu_wait_for_batches" / "gpu_feed.py"
    spec = importlib.util.spec_from_file_location("gpu_feed_figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_feed_loops_last_the_seconds_asked(gpu_feed):
    assert gpu_feed.steps_for(150, 0.0, 5.0) == 150
    assert gpu_feed.steps_for(150, 5.0, 5.0) == 1000  # a 5-s loop of 5-ms steps
    assert gpu_feed.steps_for(2000, 5.0, 5.0) == 2000


def test_gpu_feed_summarises_each_row_over_its_repeats(gpu_feed):
    def row(mode, repeat, idle):
        loop = {"idle_fraction": idle, "samples_per_second": 20000.0 + repeat, "wall_seconds": 5.2, "steps": 1000}
        return {"workload": "decode-png", "num_workers": 4, "mode": mode, "repeat": repeat, "loops": {"queued": loop}}

    rows = [row(m, r, idle) for r in range(3) for m, idle in (("cupy_nwt", 0.02 + r / 100), ("torch", 0.10 + r / 100))]
    summary = {g["mode"]: g for g in gpu_feed.summarize_rows(rows)}
    assert summary["cupy_nwt"]["idle_fraction"]["repeats"] == 3 and summary["cupy_nwt"]["loop"] == "queued"
    assert summary["cupy_nwt"]["idle_fraction"]["verdict"] == "met" and summary["torch"]["idle_fraction"]["verdict"] == "missed"
    assert summary["torch"]["loop_seconds"] == [5.2] * 3


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--seconds", "-1"]])
def test_gpu_feed_refuses_bad_repeats_in_one_line(gpu_feed, argv, capsys):
    assert gpu_feed.main(["--workers", "1", *argv]) == 2
    assert "--repeats >= 1" in capsys.readouterr().err


@pytest.fixture
def loader_compare(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "is_the_loader_faster_than_torch"))
    import loader_compare  # noqa: PLC0415

    return loader_compare


def test_loader_compare_pairs_each_repeat_with_torchs(loader_compare):
    def point(kind, rates, firsts):
        return loader_compare.Point("numba-array", kind, 15, {"median": rates[1]}, None, 3, firsts[1], 0.0,
                                    rates, firsts)

    result = loader_compare.Comparison({}, "cuda", 128, 300, 3, 3, None, {"numba-array": ""}, [
        point("cupy_nwt", [1.9e6, 2.0e6, 2.1e6], [0.30, 0.28, 0.29]),
        point("torch", [1.0e6, 1.1e6, 1.2e6], [0.20, 0.21, 0.22])])
    f = result.to_dict()["intervals_vs_torch"]["cupy_nwt"]["numba-array"]["15"]
    assert f["samples_per_s_ratio"]["repeats"] == 3 and f["samples_per_s_ratio"]["target"] == 1.5
    assert f["samples_per_s_ratio"]["verdict"] == "met"  # every paired ratio is >= 1.75
    assert f["first_batch_ratio"]["verdict"] == "missed"  # torch's first batch came sooner every time
    json.dumps(result.to_dict())


def test_overlap_sweep_judges_every_shape_against_ten_percent(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "are_transfers_as_fast_as_cuda_c"))
    import overlap_sweep  # noqa: PLC0415

    calls = []

    def run(streams, nbytes):
        calls.append((streams, nbytes))
        slow = 1.2 if streams == 8 else 1.05
        return {"versions": [{"name": "sequential", "vs_ideal": 1.7}, {"name": "async_v1", "vs_ideal": slow},
                             {"name": "async_v2", "vs_ideal": 1.02 + 0.02 * len(calls) % 3}],
                "ideal_seconds": 1e-3, "correct": True}

    doc = overlap_sweep.sweep([2, 4, 8], overlap_sweep.parse_sizes("16MiB,64MiB"), 3, run, progress=lambda _: None)
    assert len(calls) == 18 and calls[:6] == [(s, n) for s in (2, 4, 8) for n in (16 << 20, 64 << 20)]  # rounds in turn
    shapes = {(sh["streams"], sh["nbytes"]): sh for sh in doc["shapes"]}
    assert shapes[(8, 64 << 20)]["vs_ideal"]["async_v1"]["verdict"] == "missed"
    assert shapes[(2, 16 << 20)]["vs_ideal"]["async_v1"]["verdict"] == "met"
    assert all(sh["chunks"] == sh["streams"] and sh["correct"] for sh in doc["shapes"])
    assert "8 streams 67108864 B async_v1" in doc["verdicts"]["missed"]
    assert overlap_sweep.table(doc).count("\n") == 12  # a heading and one line per shape and version


@pytest.mark.parametrize(("argv", "message"), [(["--streams", "two"], "--streams takes"),
                                                (["--sizes", "3"], "float32"), (["--rounds", "0"], "--rounds"),
                                                (["--streams", "3", "--sizes", "16MiB"], "whole float32 chunks")])
def test_overlap_sweep_refuses_bad_arguments_in_one_line(monkeypatch, tmp_path, capsys, argv, message):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "are_transfers_as_fast_as_cuda_c"))
    import overlap_sweep  # noqa: PLC0415

    assert overlap_sweep.main([*argv, "--output", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_overlap_sweep_without_a_gpu_is_exit_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CUPY_NWT_DISABLE_GPU", "1")
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "are_transfers_as_fast_as_cuda_c"))
    import overlap_sweep  # noqa: PLC0415

    assert overlap_sweep.main(["--output", str(tmp_path / "o.json")]) == 3
    assert not (tmp_path / "o.json").exists() and capsys.readouterr().err.count("\n") == 1



@pytest.fixture
def copy_engines(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "studies" / "does_it_scale_over_ranks"))
    import copy_engines  # noqa: PLC0415

    return copy_engines


def test_copy_engines_reads_two_processes_sharing_what_one_fills(copy_engines):
    gib = 2**30

    def shared(n):  # two at once: each gets half the bytes of one alone in the same 2 s
        return [(2 * 25 * gib // n, 10.0, 12.0)] * n

    doc = copy_engines.rounds(shared, 3)
    assert len(doc["rounds"]) == 3 and doc["two_over_one"]["median"] == pytest.approx(1.0)
    assert doc["rounds"][0]["two_each_gbps"] == [pytest.approx(25 * gib / 2 / 1e9)] * 2  # half of one alone each
    assert doc["reading"].startswith("the two share")

    def side_by_side(n):
        return [(2 * 25 * gib, 10.0 + i * 0.01, 12.0 + i * 0.01) for i in range(n)]

    assert copy_engines.rounds(side_by_side, 3)["reading"].startswith("the two copy side by side")


def test_copy_engines_refuses_bad_arguments_and_a_missing_gpu_in_one_line(copy_engines, monkeypatch, tmp_path, capsys):
    assert copy_engines.main(["--rounds", "0", "--output", str(tmp_path / "c.json")]) == 2
    monkeypatch.setenv("CUPY_NWT_DISABLE_GPU", "1")
    assert copy_engines.main(["--output", str(tmp_path / "c.json")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and not (tmp_path / "c.json").exists()


def test_gpu_feed_takes_the_tuners_pick_for_the_step(gpu_feed):
    import types  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    asked = {}

    def tune(dataset, **kwargs):
        asked.update(kwargs)
        return types.SimpleNamespace(best_workers=3, why="picked 3 workers")

    workload = types.SimpleNamespace(dataset=np.zeros((64, 4), np.float32), batch_transform=None)
    pick = gpu_feed.tuned_workers(workload, 16, 5.0, tune=tune)
    assert pick["workers"] == 3 and pick["why"] == "picked 3 workers" and pick["seconds"] >= 0
    assert asked["step"] == pytest.approx(0.005) and asked["strategy"] == "fast" and asked["device"] == "cuda"


def test_gpu_feed_tunes_for_real_on_the_host(gpu_feed):
    import types  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    workload = types.SimpleNamespace(dataset=np.zeros((256, 8), np.float32), batch_transform=None)
    pick = gpu_feed.tuned_workers(workload, 16, 1.0, device="cpu", iterations=10)
    assert pick["workers"] >= 0 and pick["why"]
