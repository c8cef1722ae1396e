"""The host-only building blocks every experiment reports through: statistics, GB/s, sizes and
size sweeps, tables and JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

from cupy_nwt.experiments import timing
from cupy_nwt.experiments.timing import summarize
from cupy_nwt.reporting import tables as report
from cupy_nwt.reporting import units

# ---------------------------------------------------------------------------- timing


def test_summarize_single_sample_has_no_spread():
    s = summarize([2.5])
    assert (s.median, s.mean, s.min, s.max, s.p25, s.p75, s.n) == (2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 1)
    assert s.stdev == 0.0 and s.spread == 0.0


def test_summarize_is_order_free_and_robust_to_one_outlier():
    a = summarize([1.0, 1.1, 0.9, 1.0, 50.0])
    b = summarize([50.0, 1.0, 0.9, 1.1, 1.0])
    assert a == b
    assert a.median == 1.0 and a.max == 50.0 and a.mean == pytest.approx(10.8)


def test_summarize_even_count_and_quartiles():
    s = summarize([4, 1, 3, 2])
    assert s.median == 2.5 and (s.p25, s.p75) == (1.75, 3.25)
    assert s.spread == pytest.approx(1.5 / 2.5)
    assert s.stdev == pytest.approx(math.sqrt(5 / 3))


def test_summarize_accepts_generators_and_identical_values():
    s = summarize(x for x in [3, 3, 3])
    assert s.median == 3.0 and s.stdev == 0.0 and s.spread == 0.0


def test_summarize_zero_median_spread_is_zero():
    assert summarize([0.0, 0.0, 0.0]).spread == 0.0


def test_summarize_empty_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one sample"):
        summarize([])


def test_stats_to_dict_includes_spread():
    d = summarize([1.0, 2.0, 3.0]).to_dict()
    assert d["median"] == 2.0 and "spread" in d and d["n"] == 3


@pytest.mark.parametrize(("nbytes", "seconds", "expected"), [
    (10**9, 1.0, 1.0), (64 * 1024**2, 0.001, 67.108864), (0, 1.0, 0.0), (1, 1e-9, 1.0)])
def test_gbps_is_decimal(nbytes, seconds, expected):
    assert timing.gbps(nbytes, seconds) == pytest.approx(expected)


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_gbps_of_no_time_is_infinite(seconds):
    assert timing.gbps(100, seconds) == float("inf")


def test_host_time_counts_calls_and_validates():
    calls = []
    out = timing.host_time(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(out) == 4 and len(calls) == 6 and all(t >= 0 for t in out)
    with pytest.raises(ValueError, match="repeats"):
        timing.host_time(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        timing.host_time(lambda: None, warmup=-1)


# ---------------------------------------------------------------------------- units


@pytest.mark.parametrize(("text", "expected"), [
    ("4096", 4096), (4096, 4096), ("4KiB", 4096), ("4k", 4096), ("4 KiB", 4096), ("4KB", 4000),
    ("64M", 64 * 1024**2), ("64MiB", 64 * 1024**2), ("1GB", 10**9), ("1GiB", 1024**3),
    ("1.5KiB", 1536), (".5MiB", 512 * 1024), ("  8b ", 8), ("2g", 2 * 1024**3),
])
def test_parse_size_good(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize(("text", "match"), [
    ("foo", "not a size"), ("", "not a size"), ("4 XB", "not a size"), ("-4KiB", "not a size"),
    ("1.2.3", "not a size"), ("0", "positive"), ("0KiB", "positive"), (0, "positive"), (-5, "positive"),
    (True, "not a size"), (False, "not a size"),
    ("0.1", r"^size must be at least 1 byte, got '0.1' \(0.1 bytes\)$"),
    ("0.5", r"^size must be at least 1 byte, got '0.5' \(0.5 bytes\)$"),
])
def test_parse_size_bad(text, match):
    with pytest.raises(ValueError, match=match):
        units.parse_size(text)


def test_size_sweep_default_blog_range():
    sweep = units.size_sweep(4 * 1024, 256 * 1024**2)
    assert sweep[0] == 4096 and sweep[-1] == 256 * 1024**2 and len(sweep) == 17


@pytest.mark.parametrize(("lo", "hi", "factor", "expected"), [
    (4096, 4096, 2, [4096]), (1, 8, 2, [1, 2, 4, 8]), (3, 10, 2, [3, 6, 10]), (1, 100, 10, [1, 10, 100]),
    (1, 64, 4, [1, 4, 16, 64]),
])
def test_size_sweep_shapes(lo, hi, factor, expected):
    assert units.size_sweep(lo, hi, factor) == expected


@pytest.mark.parametrize(("lo", "hi", "factor", "match"), [
    (0, 10, 2, "0 < min <= max"), (10, 5, 2, "0 < min <= max"), (-1, 5, 2, "0 < min <= max"),
    (1, 10, 1, "factor must be >= 2"),
])
def test_size_sweep_bad(lo, hi, factor, match):
    with pytest.raises(ValueError, match=match):
        units.size_sweep(lo, hi, factor)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (4096, "4 KiB"), (1536, "1.5 KiB"), (256 * 1024**2, "256 MiB"),
    (3 * 1024**3, "3 GiB"), (5 * 1024**5, "5120 TiB"),
    (1024**2 - 1, "1.0 MiB"), (1024**3 - 1, "1.0 GiB"), (1023.9 * 1024, "1023.9 KiB")])
def test_fmt_bytes(n, text):
    assert units.fmt_bytes(n) == text


# ---------------------------------------------------------------------------- report


def test_table_aligns_numbers_right_and_text_left():
    text = report.table(["name", "GB/s"], [["pinned", 25.0], ["pageable", 7.5]], title="t")
    lines = text.splitlines()
    assert lines[0] == "t"
    assert lines[1] == "name       GB/s"
    assert lines[2] == "--------  -----"
    assert lines[3] == "pinned    25.00"
    assert lines[4] == "pageable   7.50"


def test_table_cells_none_small_floats_and_bools():
    text = report.table(["a", "b", "c"], [[None, 0.001234, True], [1, 0.0, False]])
    rows = text.splitlines()[2:]
    assert rows[0].split() == ["-", "0.00123", "True"]
    assert rows[1].split() == ["1", "0.00", "False"]


def test_table_without_rows_has_header_and_rule():
    assert report.table(["x", "yy"], []).splitlines() == ["x  yy", "-  --"]


def test_table_big_numbers_get_separators():
    assert "1,234,567.00" in report.table(["n"], [[1234567.0]])


def test_key_values_pads_keys():
    assert report.key_values([("a", 1), ("bbb", None)], title="T").splitlines() == ["T", "a    1", "bbb  -"]


@dataclass(frozen=True)
class _Thing:
    x: int

    def to_dict(self):
        return {"x": self.x, "twice": 2 * self.x}


def test_to_json_uses_to_dict_and_numpy_scalars(tmp_path):
    np = pytest.importorskip("numpy")
    obj = {"thing": _Thing(3), "n": np.int64(7), "f": np.float32(0.5), "stats": summarize([1.0])}
    d = json.loads(report.to_json(obj))
    assert d["thing"] == {"x": 3, "twice": 6} and d["n"] == 7 and d["f"] == 0.5 and d["stats"]["n"] == 1
    p = report.write_json(obj, tmp_path / "a" / "b.json")
    assert json.loads(p.read_text()) == d and p.read_text().endswith("\n")


def test_to_json_rejects_unknown_objects_clearly():
    with pytest.raises(TypeError, match="cannot serialise object"):
        report.to_json({"x": object()})
