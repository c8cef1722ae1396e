"""The cost per sample (instructions, cache misses, page faults, system calls weighed into estimated cycles):
how it is formed, judged against a stored baseline and against the base revision, and shown."""

from __future__ import annotations

import pytest

from cupy_nwt import BaselineError
from cupy_nwt.pytest_plugin._baseline import load_baseline
from cupy_nwt.pytest_plugin._callgrind import CallgrindError, syscalls_in
from cupy_nwt.pytest_plugin._cost import MODEL, WEIGHTS, cost_of
from cupy_nwt.pytest_plugin._gate import compare_against, compare_throughput, signed_change
from cupy_nwt.pytest_plugin._session import GateOptions, ThroughputGate, components_line

PLAIN = {"instructions": 596_047.0, "l1_misses": 15_405.5, "ll_misses": 450.2, "page_faults": 3.0, "syscalls": 2.0}
#: the docs' pipeline with three NumPy passes over each batch: instructions +0.8%, page faults more than double
PASSES = {"instructions": 600_668.0, "l1_misses": 16_590.1, "ll_misses": 1_595.0, "page_faults": 6.6, "syscalls": 2.0}


def _total(parts: dict[str, float]) -> float:
    return parts["instructions"] + sum(WEIGHTS[k] * parts[k] for k in WEIGHTS)


def _counted(parts: dict[str, float] | None, model: str = MODEL, samples: int = 128) -> dict:
    info = {"instructions_per_sample": (parts or PLAIN)["instructions"], "instructions_counted_by": "callgrind",
            "instructions_samples": samples, "cpu_cores": 1.5, "others_cores": 0.2,
            "machine": {"cpu_model": "X", "usable_cpus": 2}}
    if parts is not None:
        info.update(cost_per_sample=_total(parts), cost_components=dict(parts), cost_model=model)
    return info


def _judged(old: dict, new: dict) -> dict:
    cs = compare_throughput({"t::a": new}, {"t::a": {"fullname": "t::a", "extra_info": old}}, "b.json",
                            instructions_limit_pct=1.0)
    return {c.key: c for c in cs}


def test_the_cost_adds_every_component_at_its_weight():
    events = {"Ir": 1280, "I1mr": 1, "D1mr": 2, "D1mw": 3, "ILmr": 4, "DLmr": 5, "DLmw": 6, "Dr": 99}
    c = cost_of(events, page_faults=64, syscalls=32, samples=128)
    assert (c.instructions, c.l1_misses, c.ll_misses, c.page_faults, c.syscalls) == (10.0, 6 / 128, 15 / 128,
                                                                                     0.5, 0.25)
    assert c.total == pytest.approx(10.0 + WEIGHTS["l1_misses"] * 6 / 128 + WEIGHTS["ll_misses"] * 15 / 128
                                    + WEIGHTS["page_faults"] * 0.5 + WEIGHTS["syscalls"] * 0.25)
    assert sum(c.weighted().values()) == pytest.approx(c.total)


def test_numpy_passes_fail_on_the_cost_that_an_instruction_count_misses():
    got = _judged(_counted(PLAIN), _counted(PASSES))
    ins, cost = got["instructions_per_sample"], got["cost_per_sample"]
    assert ins.change_pct < 1.0  # the instruction count alone would pass it
    assert ins.judgement(5).verdict == "reported" and ins.judgement(5).reason == "a component of cost/sample, which decides"
    assert cost.regressed(5) and cost.limit(5) == 1.0
    line = cost.message(5)
    assert line.startswith("t::a: cost/sample rose ") and "(more than 1%)" in line
    assert "most of it page faults, 3.00 -> 6.60 a sample (+120.0%)" in line and "[baseline b.json]" in line


def test_unchanged_counts_pass_and_the_cpu_clock_is_not_judged():
    got = _judged(_counted(PLAIN), _counted({**PLAIN, "l1_misses": PLAIN["l1_misses"] + 1}))
    assert not any(c.regressed(5) for c in got.values())
    assert got["cost_per_sample"].judgement(5).verdict == "ok"


@pytest.mark.parametrize(("old", "why"), [
    (_counted(PLAIN, model="cycles(other)"), "counted over different samples or with other weights in the baseline"),
    (_counted(PLAIN, samples=1024), "not counted exactly on both sides"),
])
def test_a_cost_under_other_weights_or_samples_is_shown_not_judged(old, why):
    j = _judged(old, _counted(PASSES))["cost_per_sample"].judgement(5)
    assert j.verdict == "reported" and j.reason == why


def test_a_baseline_without_the_cost_leaves_the_instruction_count_to_decide_alone():
    got = _judged(_counted(None), _counted({**PLAIN, "instructions": PLAIN["instructions"] * 1.02}))
    assert "cost_per_sample" not in got
    assert got["instructions_per_sample"].regressed(5)


def test_the_base_revision_counted_in_the_same_job_is_judged_exactly():
    info = {**_counted(PASSES), "against": {"rev": "abc", "rev_name": "HEAD", **_counted(PLAIN)}}
    got = {c.key: c for c in compare_against({"t::a": info}, instructions_limit_pct=1.0)}
    assert got["cost_per_sample"].regressed(5)
    assert "[baseline HEAD (abc), same job]" in got["cost_per_sample"].message(5)
    same = {"against": {"rev": "abc", "rev_name": "HEAD", **_counted(PLAIN)}, **_counted(PLAIN)}
    assert not any(c.regressed(5) for c in compare_against({"t::a": same}, instructions_limit_pct=1.0))


@pytest.mark.parametrize(("old", "new", "shown"), [
    (7_108.7, 7_232.6, "+1.7%"), (100.0, 100.4, "+0.4%"), (100.0, 99.96, "-0.04%"), (5.0, 5.0, "+0%"),
    (1_000_000.0, 1_000_021.0, "+0.0021%"),
])
def test_a_change_is_shown_as_the_change_of_the_figures_beside_it(old, new, shown):
    assert signed_change(old, new) == shown


def test_the_table_shows_the_real_change_and_every_component():
    """Rounds whose medians differ by 1.7% but whose Hodges-Lehmann shift is ~0 once printed +0.0%."""
    old = [7_108.7, 7_300.0, 7_000.0, 7_232.6, 7_050.0, 7_290.0, 7_100.0]
    new = [7_232.6, 7_108.7, 7_300.0, 7_000.0, 7_290.0, 7_050.0, 7_240.0]
    base = {**_counted(PLAIN), "samples_per_s_rounds": old}
    here = {**_counted(PASSES), "samples_per_s_rounds": new}
    gate = ThroughputGate(GateOptions(5.0, "b.json", None, True, False), None)
    gate.current = {"t::a": here}
    gate.comparisons = compare_throughput(gate.current, {"t::a": {"fullname": "t::a", "extra_info": base}},
                                          "b.json", instructions_limit_pct=1.0)
    rows = [text for text, _ in gate.table()]
    assert "+1.7%" in rows[1] and "regressed" in rows[1]
    assert rows[2].startswith("  cost/sample = instructions 600,668.0 (baseline 596,047.0, +0.78%)")
    assert "page faults 6.6 x 35,000 (baseline 3, +120.0%)" in rows[2]
    assert components_line(None, None) == ""


def test_system_calls_are_counted_between_the_markers_only():
    log = b"\n".join([
        b"SYSCALL[1,1](0) sys_read ( 4 ) --> Success(0x1)",
        b"SYSCALL[1,1](262) sys_newfstatat ( 4294967196, 0x1(/m/begin), 0x2 )[sync] --> Failure(0x2)",
        b"SYSCALL[1,1](9) sys_mmap ( 0x0, 8192 ) --> [pre-success] Success(0x4835000)",
        b"SYSCALL[1,1](0) sys_read ( 4, 0x1, 832 ) --> [async] ... ",
        b"SYSCALL[1,1](0) ... [async] --> Success(0x340) ",
        b"==1== a line of valgrind's own",
        b"SYSCALL[1,1](262) sys_newfstatat ( 4294967196, 0x1(/m/end), 0x2 )[sync] --> Failure(0x2)",
        b"SYSCALL[1,1](3) sys_close ( 4 ) --> Success(0x0)",
    ])
    assert syscalls_in(log, ("/m/begin", "/m/end")) == 2
    with pytest.raises(CallgrindError, match="region markers are missing"):
        syscalls_in(log, ("/m/nowhere", "/m/end"))


def test_a_baseline_with_malformed_components_is_refused(tmp_path):
    path = tmp_path / "b.json"
    info = {**_counted(PLAIN), "cost_components": {**PLAIN, "page_faults": -1}}
    path.write_text('{"benchmarks": [{"fullname": "t::a", "extra_info": %s}]}' % __import__("json").dumps(info))
    with pytest.raises(BaselineError, match="cost_components is not an object of every component"):
        load_baseline(path)


def test_a_baseline_with_an_infinite_component_or_a_benchmark_listed_twice_is_refused(tmp_path):
    """json reads ``Infinity``; and of two entries of one benchmark the second silently decided."""
    import json

    path = tmp_path / "b.json"
    info = {**_counted(PLAIN), "cost_components": {**PLAIN, "l1_misses": float("inf")}}
    path.write_text(json.dumps({"benchmarks": [{"fullname": "t::a", "extra_info": info}]}))
    assert "Infinity" in path.read_text()
    with pytest.raises(BaselineError, match=r"^--nwt-baseline: .*b\.json: t::a: cost_components is not an object of "
                                            r"every component, each a finite number >= 0 \(re-create"):
        load_baseline(path)
    entry = {"fullname": "t::a", "extra_info": _counted(PLAIN)}
    path.write_text(json.dumps({"benchmarks": [entry, entry]}))
    with pytest.raises(BaselineError, match=r"^--nwt-baseline: .*b\.json: t::a: listed twice"):
        load_baseline(path)
