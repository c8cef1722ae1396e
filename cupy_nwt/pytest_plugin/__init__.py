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

This module holds the hooks and the fixtures; the options are :mod:`cupy_nwt.pytest_plugin._options`,
the gate's parts live in the private modules beside it, imported only by a run that gives a gate
option or records a benchmark: the plugin loads in every pytest session of an environment with
cupy-nwt installed, and a project that never uses it must not pay for it, nor see it. Nothing here
imports CuPy: all CUDA goes through :mod:`cupy_nwt.cuda`, lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from .._lazy import lazy_names
from ._options import OLDEST_PYTEST, add_options, gate_asked, too_old

if TYPE_CHECKING:
    from ._baseline import load_baseline, save_baseline
    from ._gate import MEASURES, THROUGHPUT_KEYS, Comparison, Judgement, compare_throughput, judge
    from ._parts import DEVICE_CLOCK, ROUND_CLOCK, DeviceClock, LoaderBenchmarkResult, TransferBenchmarkResult
    from ._session import ThroughputGate

__all__ = [
    "DEVICE_CLOCK", "MEASURES", "ROUND_CLOCK", "THROUGHPUT_KEYS", "Comparison", "DeviceClock", "Judgement",
    "LoaderBenchmarkResult", "ThroughputGate", "TransferBenchmarkResult", "compare_throughput", "judge",
    "load_baseline", "loader_benchmark", "save_baseline", "transfer_benchmark",
]

__getattr__ = lazy_names(__name__, {
    **dict.fromkeys(("load_baseline", "save_baseline"), "._baseline"),
    **dict.fromkeys(("MEASURES", "THROUGHPUT_KEYS", "Comparison", "Judgement", "compare_throughput", "judge"), "._gate"),
    **dict.fromkeys(("DEVICE_CLOCK", "ROUND_CLOCK", "DeviceClock", "LoaderBenchmarkResult", "TransferBenchmarkResult"),
                    "._parts"),
    "ThroughputGate": "._session",
})

_SUPPORTED = not too_old(pytest.__version__)
#: the session's gate, once something asked for it (``_gate_of``); the node ids the session runs
_GATE_KEY = pytest.StashKey["ThroughputGate"]() if _SUPPORTED else None
_COLLECTED_KEY = pytest.StashKey[set[str]]() if _SUPPORTED else None
_MARKUP = {"regressed": {"red": True}, "inconclusive": {"yellow": True}, "no baseline": {"yellow": True},
           "other-machine": {"yellow": True}}
#: the plugin's fixtures whose pytest-benchmark timer it sets (``_parts.DEVICE_CLOCK``, ``_parts.ROUND_CLOCK``)
_TIMED = {"transfer_benchmark": "DEVICE_CLOCK", "loader_benchmark": "ROUND_CLOCK"}


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    asked = gate_asked(config)
    if not _SUPPORTED:
        asked = [flag for flag in asked if flag.startswith("--nwt-")]  # pytest-benchmark's own stay its
        if asked:
            oldest = ".".join(map(str, OLDEST_PYTEST))
            raise pytest.UsageError(f"{asked[0]}: cupy_nwt's gate needs pytest {oldest} or later; this is pytest "
                                    f"{pytest.__version__} (pip install 'pytest>={oldest}')")
        return
    if asked:  # a usage error in the gate's options is told before any test runs
        _gate_of(config)


def _gate_of(config: pytest.Config) -> ThroughputGate:
    """The session's gate, started on first need: at configure when a gate option is given, else by the
    first loader benchmark or at the session's end when a benchmark was recorded."""
    assert _GATE_KEY is not None
    gate = config.stash.get(_GATE_KEY, None)
    if gate is None:
        from ._session import start_gate  # noqa: PLC0415 - the gate's machinery, only where it is used

        gate = config.stash[_GATE_KEY] = start_gate(config)
    return gate


def _started_gate(config: pytest.Config) -> ThroughputGate | None:
    return config.stash.get(_GATE_KEY, None) if _GATE_KEY is not None else None


def pytest_sessionstart(session: pytest.Session) -> None:
    gate = _started_gate(session.config)
    if gate is not None:
        gate.session_started(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    gate = _started_gate(config)
    if gate is not None:
        gate.close()


def _plugin_fixture(item: pytest.Item, name: str) -> bool:
    """Whether ``item``'s fixture ``name`` is this plugin's, or one of the project's own that builds on it.

    A project may have a fixture of its own by the same name: its tests must run as they would without
    this plugin. pytest keeps a test's fixture definitions on ``_fixtureinfo`` only; where that is
    missing, the name is taken to be ours.
    """
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}).get(name) if info is not None else None
    if not defs:
        return info is None
    for d in reversed(defs):  # the one in use last; an override that asks for the name builds on the one before
        if getattr(getattr(d, "func", None), "__module__", None) == __name__:
            return True
        if name not in getattr(d, "argnames", ()):
            return False
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make the plugin's clock the benchmark timer of every test that uses one of its fixtures.

    The user's own ``benchmark`` mark (group, ...) is kept; only its timer is replaced.
    """
    if not _SUPPORTED:
        return
    for item in items:
        names = getattr(item, "fixturenames", ())
        fixture = next((f for f in _TIMED if f in names and _plugin_fixture(item, f)), None)
        if fixture is None:
            continue
        from . import _parts  # noqa: PLC0415

        mark = item.get_closest_marker("benchmark")
        kwargs = dict(mark.kwargs) if mark else {}
        kwargs["timer"] = getattr(_parts, _TIMED[fixture])
        item.add_marker(pytest.mark.benchmark(**kwargs), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The tests this session runs, for the gate to tell a baseline entry not run here from one that gave nothing."""
    if _COLLECTED_KEY is not None:
        session.config.stash[_COLLECTED_KEY] = {item.nodeid for item in session.items}


def _recorded(config: pytest.Config) -> bool:
    """Whether pytest-benchmark recorded a benchmark this session (the gate then reports on them)."""
    return bool(getattr(getattr(config, "_benchmarksession", None), "benchmarks", None))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    gate = _started_gate(config)
    if gate is None and (not _SUPPORTED or not _recorded(config)):
        return
    gate = gate if gate is not None else _gate_of(config)
    assert _COLLECTED_KEY is not None
    gate.collected = config.stash.get(_COLLECTED_KEY, set())
    gate.evaluate(config, session.exitstatus)
    if gate.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    gate = _started_gate(config)
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


def _use_clock(benchmark: Any, request: pytest.FixtureRequest, name: str) -> None:
    """Make sure the test's ``benchmark`` times with the plugin's clock for fixture ``name``.

    Set at collection through the test's ``benchmark`` mark where the fixture is named in the test's
    closure; a fixture reached only at run time (``request.getfixturevalue``, a project's own fixture of
    the same name that fetches this one) finds the ``benchmark`` already made, whose timer is then set
    directly: pytest-benchmark has no public way to change it (``tests/pytest_plugin`` pins ``_timer``).
    """
    from . import _parts  # noqa: PLC0415

    if not _SUPPORTED:
        benchmark.skipped = True
        oldest = ".".join(map(str, OLDEST_PYTEST))
        pytest.fail(f"{name} needs pytest {oldest} or later; this is pytest {pytest.__version__}", pytrace=False)
    clock = getattr(_parts, _TIMED[name])
    mark = request.node.get_closest_marker("benchmark")
    if mark is not None and mark.kwargs.get("timer") is clock:
        return
    if getattr(benchmark, "_timer", None) is None:
        benchmark.skipped = True
        pytest.fail(f"{name} must be named as a test argument or fixture dependency (not fetched with "
                    "request.getfixturevalue) so that cupy_nwt can set its benchmark timer with this "
                    "pytest-benchmark", pytrace=False)
    benchmark._timer = clock


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
    from ._parts import DEVICE_CLOCK, CopyTimer, transfer_args, transfer_result  # noqa: PLC0415

    status = cuda.gpu_status()
    if not status.available:
        benchmark.skipped = True  # pytest-benchmark would otherwise warn that it went unused
        pytest.skip(f"needs a GPU: {status.reason}")
    _use_clock(benchmark, request, "transfer_benchmark")

    def run(nbytes: int | str, direction: str = "h2d", pinned: bool = True, repeats: int = 20,
            warmup: int = 3) -> TransferBenchmarkResult:
        size, d = transfer_args(nbytes, direction, pinned, repeats, warmup)
        timer = CopyTimer(size, d, pinned)
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
        result = transfer_result(size, d, pinned, timed, link)
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
    from ._count import count_args  # noqa: PLC0415
    from ._loader_run import run_loader_benchmark  # noqa: PLC0415
    from ._parts import loader_args, sizing_args  # noqa: PLC0415

    _use_clock(benchmark, request, "loader_benchmark")
    gate = _gate_of(request.config)

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
