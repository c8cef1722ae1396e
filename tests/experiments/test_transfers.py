"""Bandwidth experiment: configuration rules, arithmetic, rendering and plotting without a GPU;
measurement and data checks on a GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cupy_nwt import cuda
from cupy_nwt.errors import CupyNwtError
from cupy_nwt.experiments import transfers
from cupy_nwt.experiments.timing import summarize
from cupy_nwt.experiments.transfers import BandwidthConfig, BandwidthPoint, BandwidthResult, BatchingPoint
from cupy_nwt.reporting import tables as report
from cupy_nwt.system import HostInfo

MiB = 1024**2


def _point(direction: str, memory: str, nbytes: int, gbps_values: list[float]) -> BandwidthPoint:
    """A point built from constants, for rendering and arithmetic only (not a measurement)."""
    seconds = [nbytes / g / 1e9 for g in gbps_values]
    return BandwidthPoint(direction, memory, nbytes, transfers.copies_per_sample(nbytes),
                          summarize(seconds), summarize(gbps_values), True)


def _constant_result(link: cuda.PcieLink | None) -> BandwidthResult:
    sizes = (64 * 1024, MiB, 16 * MiB)
    rates = {"pageable": 10.0, "pinned": 50.0}
    points = [_point(d, m, n, [rates[m] * f for f in (0.98, 1.0, 1.01)])
              for n in sizes for m in transfers.MEMORIES for d in transfers.DIRECTIONS]
    batching = [BatchingPoint(d, m, 16 * MiB, 64 * 1024, summarize([1e-3]), summarize([4e-3]), True)
                for m in transfers.MEMORIES for d in transfers.DIRECTIONS]
    device = cuda.DeviceInfo(0, "Constant GPU", "9.0", 80 * 1024**3, 3, 132, "0000:01:00.0", link)
    host = HostInfo("constant CPU", 2, 1, 2, 8 * 1024**3, 4 * 1024**3, "3.11", "linux")
    config = BandwidthConfig(sizes=sizes, batch_total=16 * MiB)
    return BandwidthResult(config, device, host, link, tuple(points), tuple(batching))


GEN5 = cuda.PcieLink(current_gen=1, current_width=16, max_gen=5, max_width=16, source="nvml")


@pytest.mark.parametrize(("nbytes", "expected"), [(4096, 256), (64 * 1024, 128), (8 * MiB, 1), (256 * MiB, 1),
                                                   (3 * MiB, 3)])
def test_copies_per_sample_reaches_target_within_cap(nbytes, expected):
    assert transfers.copies_per_sample(nbytes) == expected


def test_copies_per_sample_rejects_non_positive():
    with pytest.raises(ValueError, match="positive"):
        transfers.copies_per_sample(0)


def test_default_config_is_the_blog_sweep():
    c = BandwidthConfig()
    assert c.sizes[0] == 4096 and c.sizes[-1] == 256 * MiB
    assert all(b == 2 * a for a, b in zip(c.sizes, c.sizes[1:]))
    assert c.buffer_bytes == 256 * MiB
    assert c.steps == 2 * len(c.sizes) + 2
    assert json.loads(report.to_json(c))["sizes"][0] == 4096


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"sizes": ()}, "empty"),
    ({"sizes": (4096, 0)}, "positive"),
    ({"repeats": 0}, "--repeats"),
    ({"warmup": -1}, "--warmup"),
    ({"device": -1}, "--device"),
    ({"batch_total": MiB, "batch_chunk": 3 * 1024}, "whole multiple"),
    ({"batch_total": MiB, "batch_chunk": 2 * MiB}, "whole multiple"),
])
def test_config_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BandwidthConfig(**kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"repeats": "3"}, "--repeats"), ({"repeats": 2.5}, "--repeats"), ({"warmup": None}, "--warmup"),
    ({"device": True}, "--device"), ({"sizes": ("4k",)}, "size"), ({"sizes": 4096}, "sizes"),
    ({"batch_total": 1.5 * MiB}, "--batch-total"),
])
def test_config_refuses_wrong_types_in_one_line(kwargs, match):
    """A string or a float is refused when the config is made, not met as a bare TypeError (or a float
    count) on the GPU mid-run."""
    with pytest.raises(CupyNwtError, match=match) as caught:
        BandwidthConfig(**kwargs)
    assert "\n" not in str(caught.value)


def test_link_rate_prefers_the_negotiated_maximum():
    assert transfers.link_rate(GEN5) == (pytest.approx(63.0, rel=5e-3), "max")
    only_current = cuda.PcieLink(4, 16, None, None, "sysfs")
    assert transfers.link_rate(only_current) == (pytest.approx(31.5, rel=5e-3), "current")
    assert transfers.link_rate(None) == (None, "none")
    assert transfers.link_rate(cuda.PcieLink(None, None, None, None, "sysfs")) == (None, "none")


def test_speedups_pair_pinned_with_pageable_per_size():
    result = _constant_result(GEN5)
    ups = result.speedups
    assert len(ups) == 2 * 3
    assert all(u.speedup == pytest.approx(5.0) for u in ups)
    partial = [p for p in result.points if not (p.memory == "pinned" and p.nbytes == MiB)]
    assert len(transfers.speedups(partial)) == 2 * 2


def test_batching_point_arithmetic():
    b = BatchingPoint("h2d", "pinned", 64 * MiB, 64 * 1024, summarize([2e-3]), summarize([5e-3]), True)
    assert b.chunks == 1024
    assert b.slowdown == pytest.approx(2.5)
    assert b.one_copy_gbps == pytest.approx(64 * MiB / 2e-3 / 1e9)
    assert b.to_dict()["many_copies_gbps"] == pytest.approx(64 * MiB / 5e-3 / 1e9)


def test_result_json_has_link_fraction_and_verification():
    result = _constant_result(GEN5)
    d = json.loads(report.to_json(result))
    assert d["experiment"] == "bandwidth" and d["verified"] is True
    assert d["link_basis"] == "max" and d["link_gbps"] == pytest.approx(63.0, rel=5e-3)
    pinned = [p for p in d["points"] if p["memory"] == "pinned"]
    assert pinned[0]["link_fraction"] == pytest.approx(50.0 / d["link_gbps"])
    assert {p["direction"] for p in d["points"]} == {"h2d", "d2h"}
    assert d["device"]["link"]["max_gen"] == 5


def test_result_without_link_reports_no_fraction():
    result = _constant_result(None)
    assert result.link_gbps is None and result.link_basis == "none"
    assert all(p["link_fraction"] is None for p in result.to_dict()["points"])
    assert "unknown" in result.link_label


def test_bandwidth_summary_lists_every_size_and_speedup():
    text = transfers.bandwidth_summary(_constant_result(GEN5))
    for size in ("64 KiB", "1 MiB", "16 MiB"):
        assert size in text
    assert "Gen5 x16 (max, nvml)" in text
    assert "5.00" in text  # pinned/pageable
    assert "79%" in text  # 50 GB/s of the 63 GB/s link
    assert "256 x 64 KiB" in text


def test_run_bandwidth_without_gpu_raises_the_probe_reason(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(False, "no usable GPU: test says so"))
    with pytest.raises(cuda.NoGPUError, match="test says so"):
        transfers.run_bandwidth(BandwidthConfig(sizes=(4096,), batch_total=4096, batch_chunk=4096))


# ------------------------------------------------------------------------------------ GPU

@pytest.fixture(scope="module")
def gpu_result() -> BandwidthResult:
    sizes = (64 * 1024, MiB, 4 * MiB, 16 * MiB)
    return transfers.run_bandwidth(BandwidthConfig(sizes=sizes, repeats=10, warmup=2,
                                                   batch_total=4 * MiB, batch_chunk=64 * 1024))


@pytest.mark.gpu
def test_round_trip_data_is_verified_and_points_complete(gpu_result):
    result = gpu_result
    assert result.verified
    assert len(result.points) == 4 * 2 * 2 and len(result.batching) == 4
    assert all(p.gbps.median > 0 for p in result.points)


@pytest.mark.gpu
def test_pinned_h2d_beats_pageable_from_1_mib(gpu_result):
    for u in gpu_result.speedups:
        if u.direction == "h2d" and u.nbytes >= MiB:
            assert u.pinned_gbps > u.pageable_gbps, u


@pytest.mark.gpu
def test_raw_copies_move_the_bytes_both_ways():
    src = cuda.pinned_empty(1000, np.uint8)
    src[:] = np.arange(1000) % 251
    dev = cuda.device_empty(1000, np.uint8)
    back = np.zeros(1000, np.uint8)
    s = cuda.stream()
    cuda.memcpy_h2d(dev, src, s)
    cuda.memcpy_d2h(back, dev, s)
    s.synchronize()
    assert np.array_equal(back, src)
    with pytest.raises(ValueError, match="size mismatch"):
        cuda.memcpy_h2d(dev[:10], src, s)


@pytest.mark.parametrize("link", [GEN5, None], ids=["with-link", "no-link"])
def test_plot_writes_a_png(tmp_path, link):
    pytest.importorskip("matplotlib")
    from cupy_nwt.cli import plots

    out = plots.plot_bandwidth(_constant_result(link), tmp_path / "sub" / "bw.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
