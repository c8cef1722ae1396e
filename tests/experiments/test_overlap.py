"""Overlap experiment: the ideal-pipeline arithmetic, configuration and reporting without a GPU;
correctness and the async speed-up on a GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cupy_nwt import cuda
from cupy_nwt.errors import CupyNwtError
from cupy_nwt.experiments import overlap, pipeline_model
from cupy_nwt.experiments.duplex import DuplexPoint
from cupy_nwt.experiments.overlap import ChunkTimes, OverlapConfig, OverlapResult, VersionTiming
from cupy_nwt.experiments.timing import summarize
from cupy_nwt.reporting import tables as report


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


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"streams": "4"}, "--streams"), ({"streams": 2.0}, "--streams"), ({"elements": 2048.0}, "--elements"),
    ({"repeats": None}, "--repeats"), ({"device": 0.0}, "--device"),
])
def test_config_refuses_wrong_types_in_one_line(kwargs, match):
    """A string or a float is refused when the config is made, not met as a bare TypeError (or a float
    array size) on the GPU mid-run."""
    with pytest.raises(CupyNwtError, match=match) as caught:
        OverlapConfig(**kwargs)
    assert "\n" not in str(caught.value)


CHUNK_BYTES = 4 * 1024 * 256 * 4


def _duplex_point(nbytes: int, h2d: float, d2h: float, h2d_duplex: float, d2h_duplex: float) -> DuplexPoint:
    return DuplexPoint(nbytes, 8, summarize([h2d]), summarize([d2h]), summarize([h2d_duplex]),
                       summarize([d2h_duplex]), summarize([max(h2d_duplex, d2h_duplex)]), True)


def _constant_result(max_error: float = 2e-7, async_v1: float = 5e-4) -> OverlapResult:
    """Built from constants to exercise the arithmetic and rendering, not a measurement.

    Stages h = d = 100 us, k = 20 us over 4 streams: the blog's ideal is 520 us. At the chunk size
    H2D takes 1.25x as long with D2H running, D2H 1.1x; the serial chunks take 4 * 220 us plus
    11 hand-offs of 2 us.
    """
    stages = ChunkTimes(summarize([1e-4]), summarize([2e-5]), summarize([1e-4]))
    versions = (VersionTiming("sequential", summarize([9e-4, 1e-3, 1.1e-3]), 0.0),
                VersionTiming("async_v1", summarize([async_v1]), max_error),
                VersionTiming("async_v2", summarize([4e-4]), 0.0))
    device = cuda.DeviceInfo(0, "Constant GPU", "9.0", 80 * 1024**3, 3, 132, "0000:01:00.0", None)
    duplex = (_duplex_point(CHUNK_BYTES, 8e-5, 8e-5, 1e-4, 8.8e-5),
              _duplex_point(4 * CHUNK_BYTES, 3.2e-4, 3.2e-4, 4e-4, 3.52e-4))
    serial = VersionTiming("serial_chunks", summarize([4 * 2.2e-4 + 11 * 2e-6]), 0.0)
    return OverlapResult(OverlapConfig(), device, stages, versions, duplex=duplex, serial_chunks=serial)


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


def test_measured_ideal_from_known_parts():
    # h = d = 1, k = 0.5, 4 streams: blog 2.5 + 3 * 1 = 5.5; duplex steps max(1.5, 0.5, 1.25) = 1.5
    assert pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 4) == pytest.approx(5.5)
    assert pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 4, 1.5, 1.25) == pytest.approx(2.5 + 3 * 1.5)
    assert pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 4, 1.5, 1.25, 0.25) == pytest.approx(7.5)
    # a kernel slower than either copy in duplex: the duplex rates no longer matter
    assert pipeline_model.measured_ideal_seconds(1.0, 2.0, 1.0, 3, 1.5, 1.5) == pytest.approx(4.0 + 2 * 2.0)
    assert pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 1, 3.0, 3.0) == pytest.approx(2.5)  # no steady state
    with pytest.raises(ValueError, match="positive"):
        pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 4, 0.0, 1.0)
    with pytest.raises(ValueError, match="streams"):
        pipeline_model.measured_ideal_seconds(1.0, 0.5, 1.0, 0)


def test_handoff_from_the_serial_chunks():
    # 4 chunks of (1 + 0.5 + 1) with 11 crossings of 0.25 between them
    assert pipeline_model.handoff_seconds(4 * 2.5 + 11 * 0.25, 1.0, 0.5, 1.0, 4) == pytest.approx(0.25)
    assert pipeline_model.handoff_seconds(2.5 + 2 * 0.1, 1.0, 0.5, 1.0, 1) == pytest.approx(0.1)
    assert pipeline_model.handoff_seconds(9.0, 1.0, 0.5, 1.0, 4) < 0  # faster than its stages: noise shows
    with pytest.raises(ValueError, match="chunks"):
        pipeline_model.handoff_seconds(1.0, 1.0, 1.0, 1.0, 0)


def test_excess_splits_into_duplex_handoff_and_the_rest():
    e = pipeline_model.ExcessExplained("async_v1", measured=8.0, ideal=5.5, duplex_ideal=7.0, measured_ideal=7.5,
                                       handoff=0.25)
    assert e.excess == pytest.approx(2.5)
    assert e.crossings_for_the_rest == pytest.approx(4.0)  # (8 - 7) / 0.25: 4 hand-offs, not the fill's 2
    assert (e.by_duplex, e.by_handoff, e.unexplained) == pytest.approx((0.6, 0.2, 0.2))
    assert e.vs_measured_ideal == pytest.approx(8.0 / 7.5)
    faster = pipeline_model.ExcessExplained("v", measured=5.0, ideal=5.5, duplex_ideal=7.0, measured_ideal=7.5)
    assert faster.by_duplex is None and faster.to_dict()["unexplained"] is None
    assert faster.crossings_for_the_rest is None and e.to_dict()["crossings_for_the_rest"] == pytest.approx(4.0)


def test_duplex_point_ratios_and_rates():
    p = _duplex_point(CHUNK_BYTES, 8e-5, 8e-5, 1e-4, 8.8e-5)
    assert p.ratio("h2d") == pytest.approx(1.25) and p.ratio("d2h") == pytest.approx(1.1)
    d = p.to_dict()
    assert d["gbps"]["h2d_alone"] == pytest.approx(CHUNK_BYTES / 8e-5 / 1e9)
    assert d["gbps"]["both_ways"] == pytest.approx(2 * CHUNK_BYTES / 1e-4 / 1e9)
    with pytest.raises(ValueError, match="direction"):
        p.ratio("up")


def test_result_rebuilds_the_ideal_from_its_measured_stages():
    r = _constant_result(async_v1=6.2e-4)
    assert r.chunk_duplex is r.duplex[0]
    assert r.handoff_seconds == pytest.approx(2e-6)
    assert r.duplex_ideal_seconds == pytest.approx(2.2e-4 + 3 * 1.25e-4)  # H2D's 125 us is the slowest step
    assert r.measured_ideal_seconds == pytest.approx(5.95e-4 + 2 * 2e-6)
    ex = r.excess("async_v1")
    assert ex is not None and ex.excess == pytest.approx(1e-4)
    assert (ex.by_duplex, ex.by_handoff, ex.unexplained) == pytest.approx((0.75, 0.04, 0.21))
    assert ex.crossings_for_the_rest == pytest.approx(12.5)  # (620 - 595) us / 2 us
    d = json.loads(report.to_json(r))
    v1 = d["versions"][1]["excess_explained"]
    assert v1["by_duplex"] == pytest.approx(0.75) and v1["vs_measured_ideal"] == pytest.approx(6.2e-4 / 5.99e-4)
    assert d["handoff"]["seconds"] == pytest.approx(2e-6) and d["handoff"]["serial_chunks"]["name"] == "serial_chunks"
    assert d["ideal_from_measured_stages"]["seconds"] == pytest.approx(5.99e-4)
    assert [p["nbytes"] for p in d["duplex"]] == [CHUNK_BYTES, 4 * CHUNK_BYTES]
    text = overlap.overlap_summary(r)
    assert "0.595 ms with the duplex rates, 0.599 ms with 2 hand-offs" in text
    assert "2.00 us a crossing" in text and "75%" in text and "x1.250" in text and "12.5" in text


def test_result_without_the_new_stages_keeps_the_blogs_ideal_alone():
    r = _constant_result()
    bare = OverlapResult(r.config, r.device, r.stages, r.versions)
    assert bare.measured_ideal_seconds is None and bare.excess("async_v1") is None and bare.handoff_seconds is None
    d = json.loads(report.to_json(bare))
    assert d["duplex"] == [] and d["handoff"] is None and d["versions"][1]["excess_explained"] is None
    assert "not measured" in overlap.overlap_summary(bare)


def test_a_wrong_serial_chunks_result_or_duplex_copy_fails_the_run():
    r = _constant_result()
    assert r.correct and r.problem is None
    wrong = VersionTiming("serial_chunks", r.serial_chunks.seconds, 0.5)
    bad = OverlapResult(r.config, r.device, r.stages, r.versions, duplex=r.duplex, serial_chunks=wrong)
    assert not bad.correct and bad.problem == "max error 0.5 exceeds 1e-05"
    lost = (dataclasses.replace(r.duplex[0], verified=False), r.duplex[1])
    bad = OverlapResult(r.config, r.device, r.stages, r.versions, duplex=lost, serial_chunks=r.serial_chunks)
    assert not bad.correct and bad.problem == "duplex copies of 4 MiB brought back other bytes"
    assert json.loads(report.to_json(bad))["correct"] is False


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
def test_duplex_stage_and_serial_chunks_are_measured_and_checked(gpu_result):
    assert [p.nbytes for p in gpu_result.duplex] == [gpu_result.config.chunk_elements * 4, gpu_result.config.nbytes]
    assert all(p.verified for p in gpu_result.duplex)
    assert gpu_result.serial_chunks is not None and gpu_result.serial_chunks.max_error < 1e-5
    assert gpu_result.measured_ideal_seconds is not None and gpu_result.measured_ideal_seconds > 0


@pytest.mark.gpu
def test_async_versions_beat_sequential(gpu_result):
    assert gpu_result.speedup("async_v1") > 1.0
    assert gpu_result.speedup("async_v2") > 1.0


def test_launch_time_is_reported_apart_from_the_device_stage_times():
    r = _constant_result()
    launch = overlap.ChunkTimes(summarize([12e-6]), summarize([15e-6]), summarize([11e-6]))
    with_launch = OverlapResult(r.config, r.device, r.stages, r.versions, launch, overran=1)
    d = json.loads(report.to_json(with_launch))
    assert d["launch_seconds"]["kernel"]["median"] == pytest.approx(15e-6)
    assert d["overran_samples"] == 1 and "spin" in d["timing"]
    assert d["ideal_seconds"] == pytest.approx(r.ideal_seconds)  # launches never enter the ideal
    assert "kernel 15.0 us" in overlap.overlap_summary(with_launch)
