"""Overlap experiment: the ideal-pipeline arithmetic, configuration and reporting without a GPU;
correctness and the async speed-up on a GPU."""

from __future__ import annotations

import json

import pytest

from cupy_nwt import cuda
from cupy_nwt._reporting import tables as report
from cupy_nwt.experiments import overlap
from cupy_nwt.experiments.overlap import OverlapConfig, OverlapResult, OverlapStages, VersionTiming
from cupy_nwt.experiments.timing import summarize


@pytest.mark.parametrize(("h", "k", "d", "streams", "expected"), [
    (1.0, 2.0, 3.0, 4, 6.0 + 3 * 3.0),
    (1.0, 2.0, 3.0, 1, 6.0),
    (2.0, 1.0, 2.0, 4, 5.0 + 3 * 2.0),
    (0.0, 0.0, 0.0, 8, 0.0),
    (0.25, 0.01, 0.25, 2, 0.51 + 0.25),
])
def test_ideal_pipeline_seconds(h, k, d, streams, expected):
    assert overlap.ideal_pipeline_seconds(h, k, d, streams) == pytest.approx(expected)


def test_ideal_pipeline_is_never_worse_than_sequential_stages():
    h, k, d = 0.3, 0.1, 0.25
    for streams in (1, 2, 4, 16):
        ideal = overlap.ideal_pipeline_seconds(h / streams, k / streams, d / streams, streams)
        assert ideal <= h + k + d + 1e-12


@pytest.mark.parametrize(("args", "match"), [((1.0, 1.0, 1.0, 0), "streams"), ((-1.0, 1.0, 1.0, 2), "negative")])
def test_ideal_pipeline_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        overlap.ideal_pipeline_seconds(*args)


def test_default_size_is_the_blogs():
    c = OverlapConfig()
    assert c.elements == 4 * 1024 * 256 * 4 and c.chunk_elements == 4 * 1024 * 256
    assert OverlapConfig(streams=8).elements == 4 * 1024 * 256 * 8
    assert c.nbytes == c.elements * 4


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"streams": 0}, "--streams"),
    ({"elements": -4}, "--elements"),
    ({"elements": 0}, "--elements"),
    ({"streams": 3, "elements": 10}, "multiple"),
    ({"repeats": 0}, "--repeats"),
    ({"warmup": -1}, "--warmup"),
    ({"device": -2}, "--device"),
])
def test_config_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OverlapConfig(**kwargs)


def _constant_result(max_error: float = 2e-7) -> OverlapResult:
    """Built from constants to exercise the arithmetic and rendering, not a measurement."""
    stages = OverlapStages(summarize([1e-4]), summarize([2e-5]), summarize([1e-4]))
    versions = (VersionTiming("sequential", summarize([9e-4, 1e-3, 1.1e-3]), 0.0),
                VersionTiming("async_v1", summarize([5e-4]), max_error),
                VersionTiming("async_v2", summarize([4e-4]), 0.0))
    device = cuda.DeviceInfo(0, "Constant GPU", "9.0", 80 * 1024**3, 3, 132, "0000:01:00.0", None)
    return OverlapResult(OverlapConfig(), device, stages, versions)


def test_result_speedups_and_ideal():
    r = _constant_result()
    assert r.ideal_seconds == pytest.approx(2.2e-4 + 3 * 1e-4)
    assert r.speedup("async_v1") == pytest.approx(2.0)
    assert r.speedup("sequential") == pytest.approx(1.0)
    assert r.vs_ideal("async_v2") == pytest.approx(4e-4 / 5.2e-4)
    assert r.correct and r.max_error == pytest.approx(2e-7)
    with pytest.raises(KeyError, match="no version"):
        r.version("v3")


def test_result_flags_a_wrong_answer():
    assert not _constant_result(max_error=0.5).correct


def test_result_json_and_text():
    r = _constant_result()
    d = json.loads(report.to_json(r))
    assert d["experiment"] == "overlap" and d["correct"] is True
    assert [v["name"] for v in d["versions"]] == list(overlap.VERSIONS)
    assert d["versions"][1]["speedup_vs_sequential"] == pytest.approx(2.0)
    assert d["config"]["chunk_elements"] == 4 * 1024 * 256
    text = overlap.overlap_summary(r)
    assert "async_v2" in text and "0.520 ms" in text and "ok" in text


def test_run_overlap_without_gpu_raises_the_probe_reason(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test says so"))
    with pytest.raises(cuda.NoGPUError, match="test says so"):
        overlap.run_overlap(OverlapConfig(streams=2, elements=1024))


# ------------------------------------------------------------------------------------ GPU

@pytest.fixture(scope="module")
def gpu_result() -> OverlapResult:
    return overlap.run_overlap(OverlapConfig(streams=4, repeats=10, warmup=2))


@pytest.mark.gpu
def test_every_version_computes_ones(gpu_result):
    assert [v.name for v in gpu_result.versions] == list(overlap.VERSIONS)
    for v in gpu_result.versions:
        assert v.max_error < 1e-5, v


@pytest.mark.gpu
def test_async_versions_beat_sequential(gpu_result):
    assert gpu_result.speedup("async_v1") > 1.0
    assert gpu_result.speedup("async_v2") > 1.0


def test_launch_time_is_reported_apart_from_the_device_stage_times():
    r = _constant_result()
    launch = overlap.LaunchTimes(summarize([12e-6]), summarize([15e-6]), summarize([11e-6]))
    with_launch = OverlapResult(r.config, r.device, r.stages, r.versions, launch, overran=1)
    d = json.loads(report.to_json(with_launch))
    assert d["launch_seconds"]["kernel"]["median"] == pytest.approx(15e-6)
    assert d["overran_samples"] == 1 and "spin" in d["timing"]
    assert d["ideal_seconds"] == pytest.approx(r.ideal_seconds)  # launches never enter the ideal
    assert "kernel 15.0 us" in overlap.overlap_summary(with_launch)
