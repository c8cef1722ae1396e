"""pytest plugin: transfer and loader benchmarks that pytest-benchmark saves, and a gate CI can trust.

Registered through the ``pytest11`` entry point, so installing cupy-nwt is enough. Two factory
fixtures, ``transfer_benchmark`` and ``loader_benchmark``, run on pytest-benchmark's ``benchmark``
fixture, so ``--benchmark-autosave`` / ``--benchmark-compare`` work on them as on any benchmark.
pytest-benchmark compares times, which on a shared CI runner drift by more than any limit worth
setting; so ``--nwt-throughput-drop=PCT`` judges figures no neighbour moves: an exact cost per sample
(instructions, simulated cache misses, page faults and system calls weighed into estimated cycles,
:mod:`cupy_nwt.pytest_plugin._cost`) counted under callgrind against a committed baseline
(:mod:`cupy_nwt.pytest_plugin._count`),
and samples/s and CPU per sample against the base revision measured round for round in the same job
(``--nwt-against``: :mod:`cupy_nwt.pytest_plugin._against`); the rule is
:mod:`cupy_nwt.pytest_plugin._gate`. Baselines are files the user commits (``--nwt-save-baseline``,
``--nwt-baseline``, ``--nwt-require-baseline`` for CI: :mod:`cupy_nwt.pytest_plugin._session`). Any benchmark that puts those keys (and ``<key>_rounds``)
in its ``extra_info`` is gated, not only ours.

This module holds the options, the hooks and the fixtures; their parts live in the private modules
beside it. Nothing here imports CuPy: all CUDA goes through :mod:`cupy_nwt.cuda`, lazily, so loading
the plugin costs every pytest run next to nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pytest

from ._baseline import load_baseline, save_baseline
from ._count import count_args
from ._gate import (
    MEASURES,
    THROUGHPUT_KEYS,
    Comparison,
    Judgement,
    compare_throughput,
    judge,
)
from ._loader_run import DEFAULT_MAX_SECONDS, DEFAULT_TARGET_NOISE_PCT, run_loader_benchmark
from ._parts import (
    DEVICE_CLOCK,
    ROUND_CLOCK,
    DeviceClock,
    LoaderBenchmarkResult,
    TransferBenchmarkResult,
    loader_args,
    sizing_args,
)
from ._parts import CopyTimer as _CopyTimer
from ._parts import transfer_args as _transfer_args
from ._parts import transfer_result as _transfer_result
from ._session import DEFAULT_INSTRUCTIONS_DROP_PCT, ThroughputGate, start_gate

__all__ = [
    "DEVICE_CLOCK", "MEASURES", "ROUND_CLOCK", "THROUGHPUT_KEYS", "Comparison", "DeviceClock", "Judgement",
    "LoaderBenchmarkResult", "ThroughputGate", "TransferBenchmarkResult", "compare_throughput", "judge",
    "load_baseline", "loader_benchmark", "save_baseline", "transfer_benchmark",
]

_GATE_KEY = pytest.StashKey[ThroughputGate]()
_MARKUP = {"regressed": {"red": True}, "inconclusive": {"yellow": True}, "no baseline": {"yellow": True},
           "other-machine": {"yellow": True}}
#: the fixtures whose pytest-benchmark timer the plugin sets, and to what
_TIMERS = {"transfer_benchmark": DEVICE_CLOCK, "loader_benchmark": ROUND_CLOCK}


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (example: 20 for 20%)") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"a percentage between 0 and 100 is needed, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"seconds must be > 0 and at most a day, got {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cupy_nwt", "cupy_nwt throughput gate")
    group.addoption(
        "--nwt-throughput-drop", type=_percent, default=None, metavar="PCT",
        help="fail the run when a judged figure (the exact cost per sample against the baseline; samples/s "
        "and CPU per sample against --nwt-against REV; GB/s) got worse by more than its limit (PCT percent; "
        "--nwt-instructions-drop for exact counts) and beyond the 95%% interval of the change",
    )
    group.addoption(
        "--nwt-baseline", default=None, metavar="FILE.json",
        help="the baseline to compare with: a file written by --nwt-save-baseline (or pytest-benchmark's "
        "--benchmark-json); a missing file is a note, or an error with --nwt-require-baseline",
    )
    group.addoption(
        "--nwt-save-baseline", default=None, metavar="FILE.json",
        help="write this run's figures, machine and pipeline to FILE.json, to commit and compare with later",
    )
    group.addoption(
        "--nwt-require-baseline", action="store_true", default=False,
        help="CI mode: fail when the --nwt-baseline file, or a benchmark's entry in it, is missing",
    )
    group.addoption(
        "--nwt-against", default=None, metavar="REV",
        help="measure the git revision REV (a worktree of it) beside this run, round for round in the same job, "
        "and judge samples/s and CPU per sample by the pairs' ratios (what a baseline from another hour cannot)",
    )
    group.addoption(
        "--nwt-instructions", choices=("auto", "off"), default="auto",
        help="auto (default): count each loader benchmark's cost per sample (instructions, simulated cache misses, "
        "page faults, system calls) under valgrind's callgrind where valgrind is installed (exact: the deciding "
        "figure for CPU-bound pipelines); off: do not",
    )
    group.addoption(
        "--nwt-instructions-drop", type=_percent, default=DEFAULT_INSTRUCTIONS_DROP_PCT, metavar="PCT",
        help="the limit for the exact counts (cost and instructions per sample) once the gate is on "
        "(default %(default)s)",
    )
    group.addoption(
        "--nwt-target-noise", type=_percent, default=DEFAULT_TARGET_NOISE_PCT, metavar="PCT",
        help="loader_benchmark runs rounds until the 95%% interval of its deciding figure's median is within "
        "+-PCT percent (default %(default)s) ...",
    )
    group.addoption(
        "--nwt-max-seconds", type=_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
        help="... or until S seconds of rounds have passed (default %(default)s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_GATE_KEY] = start_gate(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    gate = session.config.stash.get(_GATE_KEY, None)
    if gate is not None:
        gate.session_started(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    gate = config.stash.get(_GATE_KEY, None)
    if gate is not None:
        gate.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make the plugin's clock the benchmark timer of every test that uses one of its fixtures.

    The user's own ``benchmark`` mark (group, ...) is kept; only its timer is replaced.
    """
    for item in items:
        names = getattr(item, "fixturenames", ())
        clock = next((c for f, c in _TIMERS.items() if f in names), None)
        if clock is None:
            continue
        mark = item.get_closest_marker("benchmark")
        kwargs = dict(mark.kwargs) if mark else {}
        kwargs["timer"] = clock
        item.add_marker(pytest.mark.benchmark(**kwargs), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests this session runs, for the gate to tell a baseline entry not run here from one that gave nothing."""
    gate = session.config.stash.get(_GATE_KEY, None)
    if gate is not None:
        gate.collected = {item.nodeid for item in session.items}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gate = session.config.stash.get(_GATE_KEY, None)
    if gate is None:
        return
    gate.evaluate(session.config, session.exitstatus)
    if gate.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    gate = config.stash.get(_GATE_KEY, None)
    if gate is None or not gate.evaluated:
        return
    table = gate.table()
    if table:
        terminalreporter.section("cupy_nwt benchmarks")
        for line, verdict in table:
            terminalreporter.write_line(line, **_MARKUP.get(verdict, {}))
    if gate.lines:
        terminalreporter.section("cupy_nwt throughput")
        for line, verdict in gate.lines:
            terminalreporter.write_line(line, **_MARKUP.get(verdict, {}))
    for line, verdict in gate.summary():
        terminalreporter.write_line(line, bold=True, **_MARKUP[verdict])


def _check_timer(benchmark: Any, request: pytest.FixtureRequest, name: str) -> None:
    mark = request.node.get_closest_marker("benchmark")
    if mark is None or mark.kwargs.get("timer") is not _TIMERS[name]:
        benchmark.skipped = True
        pytest.fail(
            f"{name} must be named as a test argument or fixture dependency (not fetched with "
            f"request.getfixturevalue) so that cupy_nwt can set its benchmark timer",
            pytrace=False,
        )


# ---------------------------------------------------------------- transfer_benchmark


@pytest.fixture
def transfer_benchmark(benchmark: Any, request: pytest.FixtureRequest) -> Callable[..., TransferBenchmarkResult]:
    """Factory: ``transfer_benchmark(nbytes, direction="h2d", pinned=True, repeats=20, warmup=3)``.

    Times one host<->device copy size with CUDA events and records those device seconds in
    pytest-benchmark (so save/compare work), plus ``gbps``, ``gbps_rounds`` (one per timed repeat,
    for the throughput gate) and ``link_fraction`` (of the PCIe link's theoretical rate) in
    ``benchmark.extra_info``. Skips, with the probe's reason, when no
    GPU is usable. Like ``benchmark``, call it once per test (parametrize for a size sweep).

    Returns:
        The factory. Its arguments: ``nbytes``, the copy size (an int or "64MiB"); ``direction``,
        "h2d" or "d2h"; ``pinned``, page-locked host memory (else pageable); ``repeats`` and
        ``warmup``, timed and untimed copies. It returns a ``TransferBenchmarkResult``.
    """
    from .. import cuda  # noqa: PLC0415

    status = cuda.gpu_status()
    if not status.available:
        benchmark.skipped = True  # pytest-benchmark would otherwise warn that it went unused
        pytest.skip(f"needs a GPU: {status.reason}")
    _check_timer(benchmark, request, "transfer_benchmark")

    def run(nbytes: int | str, direction: str = "h2d", pinned: bool = True, repeats: int = 20,
            warmup: int = 3) -> TransferBenchmarkResult:
        size, d = _transfer_args(nbytes, direction, pinned, repeats, warmup)
        timer = _CopyTimer(size, d, pinned)
        times: list[float] = []

        def one_copy() -> None:
            t = timer.once()
            times.append(t)
            DEVICE_CLOCK.advance(t)

        try:
            benchmark.pedantic(one_copy, rounds=repeats, warmup_rounds=warmup, iterations=1)
            timed = times[warmup:] or times  # a disabled benchmark runs the target once, unwarmed
            ok = timer.verified()
            link = timer.link_gbps()  # read right after the copies: an idle GPU downclocks its link
        finally:
            timer.close()
        if not ok:
            raise AssertionError(f"{d} copy of {size} bytes delivered wrong bytes: the GB/s figure is void")
        result = _transfer_result(size, d, pinned, timed, link)
        benchmark.extra_info.update(result.to_dict())
        return result

    return run


# ---------------------------------------------------------------- loader_benchmark


@pytest.fixture
def loader_benchmark(benchmark: Any, request: pytest.FixtureRequest) -> Callable[..., LoaderBenchmarkResult]:
    """Factory: ``loader_benchmark(dataset, batches=None, warmup=2, rounds=None, target_noise=None,
    max_seconds=None, count_samples=None, **DataLoader_kwargs)``.

    Iterates a cupy_nwt ``DataLoader`` in rounds of consecutive batches (warm-up batches, which
    include worker start-up, are not timed) and records per round its samples/s (wall clock) and
    the CPU seconds per 1,000 samples of the main process and every process it started (and
    instructions per sample where the kernel allows counting): ``<figure>`` and ``<figure>_rounds``
    in ``benchmark.extra_info``, with peak memory (PSS), the machine and the pipeline. With
    ``batches=None`` the run sizes itself: rounds of at least 1 s, added until the 95% interval of
    the deciding figure's median is within +-``target_noise`` percent (``--nwt-target-noise``, 1)
    or ``max_seconds`` (``--nwt-max-seconds``, 15) have passed. ``batches`` (and ``rounds``,
    default 5) fix the run instead. pytest-benchmark records each round's wall seconds per 1,000
    samples. Batches on the GPU are waited for (current stream) before a round ends; it runs on the
    host without a GPU (``device="cpu"``, or ``"auto"`` there). Where valgrind is installed (and
    ``--nwt-instructions`` is not ``off``), the instructions per sample of ``count_samples`` samples
    (default 1024) are then counted under callgrind (:mod:`cupy_nwt.pytest_plugin._count`). Under
    ``--nwt-against REV`` the rounds alternate with REV's, pair by pair (``batches`` is then ignored).

    Returns:
        The factory. Its arguments: ``dataset`` and any ``DataLoader`` keyword (the pipeline to
        guard); ``batches`` and ``rounds`` (a fixed run instead of one sized by the noise);
        ``warmup``, untimed batches first; ``target_noise`` and ``max_seconds``, when a self-sized
        run stops; ``count_samples``, samples counted under callgrind. It returns a
        ``LoaderBenchmarkResult``.
    """
    _check_timer(benchmark, request, "loader_benchmark")
    gate = request.config.stash[_GATE_KEY]

    def run(dataset: Any, batches: int | None = None, warmup: int = 2, rounds: int | None = None,
            target_noise: float | None = None, max_seconds: float | None = None, count_samples: int | None = None,
            **loader_kwargs: Any) -> LoaderBenchmarkResult:
        loader_args(batches, warmup, rounds)
        wanted = count_args(count_samples)
        target = request.config.getoption("nwt_target_noise") if target_noise is None else target_noise
        cap = request.config.getoption("nwt_max_seconds") if max_seconds is None else max_seconds
        sizing_args(target, cap)
        result: LoaderBenchmarkResult = run_loader_benchmark(
            benchmark, dataset, batches=batches, warmup=warmup, rounds=rounds, target_noise_pct=float(target),
            max_seconds=float(cap), loader_kwargs=loader_kwargs, node=request.node, against=gate.against,
            count=request.config.getoption("nwt_instructions") != "off", count_samples=wanted)
        benchmark.extra_info.update(result.to_dict())
        return result

    return run
