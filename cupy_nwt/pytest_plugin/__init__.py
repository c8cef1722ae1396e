"""pytest plugin: transfer and loader benchmarks that pytest-benchmark saves, compares and gates.

Registered through the ``pytest11`` entry point, so installing cupy-nwt is enough. Two factory
fixtures, ``transfer_benchmark`` and ``loader_benchmark``, run on pytest-benchmark's ``benchmark``
fixture, so ``--benchmark-autosave`` / ``--benchmark-compare`` / ``--benchmark-compare-fail`` work on
them as on any benchmark. pytest-benchmark compares times; a pipeline is judged by throughput, so
``--nwt-throughput-drop=PCT`` fails the run when ``gbps`` or ``samples_per_s`` in a benchmark's
``extra_info`` fell by more than PCT percent against the saved baseline *and* by more than the
noise of the benchmark's rounds, and reports "inconclusive" instead of failing when that noise is
larger than PCT (the rule: :mod:`cupy_nwt.pytest_plugin._gate`). Any benchmark that puts those keys
(and, for the noise, ``<key>_rounds``) in its ``extra_info`` is gated, not only ours.

This module holds the options, the hooks and the fixtures; their parts live in
:mod:`cupy_nwt.pytest_plugin._parts`. Nothing here imports CuPy: all CUDA goes through
:mod:`cupy_nwt.cuda`, lazily, so loading the plugin costs every pytest run next to nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from ._gate import (
    THROUGHPUT_KEYS,
    Comparison,
    ThroughputGate,
    compare_throughput,
    judge,
    load_baseline,
)
from ._parts import (
    DEVICE_CLOCK,
    DeviceClock,
    LoaderBenchmarkResult,
    TransferBenchmarkResult,
    loader_args,
    round_rates,
)
from ._parts import CopyTimer as _CopyTimer
from ._parts import batch_len as _batch_len
from ._parts import epochs as _epochs
from ._parts import leaves as _leaves
from ._parts import transfer_args as _transfer_args
from ._parts import transfer_result as _transfer_result

__all__ = [
    "DEVICE_CLOCK", "THROUGHPUT_KEYS", "Comparison", "DeviceClock", "LoaderBenchmarkResult", "ThroughputGate",
    "TransferBenchmarkResult", "compare_throughput", "judge", "load_baseline", "loader_benchmark",
    "transfer_benchmark",
]

_GATE_KEY = pytest.StashKey[ThroughputGate]()
_MARKUP = {"regressed": {"red": True}, "inconclusive": {"yellow": True}}



def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r} (example: 20 for 20%)") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"a drop must be between 0 and 100 percent, got {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cupy_nwt", "cupy_nwt throughput gate")
    group.addoption(
        "--nwt-throughput-drop",
        type=_percent,
        default=None,
        metavar="PCT",
        help="fail the run when a benchmark's gbps or samples_per_s (extra_info) fell by more than "
        "PCT percent against the baseline (--benchmark-compare's selection or --nwt-baseline)",
    )
    group.addoption(
        "--nwt-baseline",
        default=None,
        metavar="FILE.json",
        help="a pytest-benchmark JSON file (--benchmark-autosave/--benchmark-json output) to compare "
        "throughput against, instead of or besides --benchmark-compare's selection",
    )


def pytest_configure(config: pytest.Config) -> None:
    drop = config.getoption("nwt_throughput_drop", None)
    baseline_opt = config.getoption("nwt_baseline", None)
    explicit = load_baseline(baseline_opt) if baseline_opt else None
    if drop is not None and explicit is None and not config.getoption("benchmark_compare", None):
        raise pytest.UsageError(
            "--nwt-throughput-drop needs a baseline: add --benchmark-compare[=NUM|ID] (after a run with "
            "--benchmark-autosave) or --nwt-baseline FILE.json"
        )
    config.stash[_GATE_KEY] = ThroughputGate(drop, explicit)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make the device clock the benchmark timer of every test that uses ``transfer_benchmark``.

    The user's own ``benchmark`` mark (group, ...) is kept; only its timer is replaced.
    """
    for item in items:
        if "transfer_benchmark" not in getattr(item, "fixturenames", ()):
            continue
        mark = item.get_closest_marker("benchmark")
        kwargs = dict(mark.kwargs) if mark else {}
        kwargs["timer"] = DEVICE_CLOCK
        item.add_marker(pytest.mark.benchmark(**kwargs), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gate = session.config.stash.get(_GATE_KEY, None)
    if gate is None:
        return
    gate.evaluate(session.config)
    if gate.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    gate = config.stash.get(_GATE_KEY, None)
    if gate is None or not gate.evaluated or not gate.lines:
        return
    terminalreporter.section("cupy_nwt throughput")
    for line, verdict in gate.lines:
        terminalreporter.write_line(line, **_MARKUP.get(verdict, {}))
    for line, verdict in gate.summary():
        terminalreporter.write_line(line, bold=True, **_MARKUP[verdict])


# ---------------------------------------------------------------- transfer_benchmark


@pytest.fixture
def transfer_benchmark(benchmark: Any, request: pytest.FixtureRequest) -> Callable[..., TransferBenchmarkResult]:
    """Factory: ``transfer_benchmark(nbytes, direction="h2d", pinned=True, repeats=20, warmup=3)``.

    Times one host<->device copy size with CUDA events and records those device seconds in
    pytest-benchmark (so save/compare work), plus ``gbps``, ``gbps_rounds`` (one per timed repeat,
    for the throughput gate) and ``link_fraction`` (of the PCIe link's theoretical rate) in
    ``benchmark.extra_info``. Skips, with the probe's reason, when no
    GPU is usable. Like ``benchmark``, call it once per test (parametrize for a size sweep).
    """
    from .. import cuda  # noqa: PLC0415

    status = cuda.gpu_status()
    if not status.available:
        benchmark.skipped = True  # pytest-benchmark would otherwise warn that it went unused
        pytest.skip(f"needs a GPU: {status.reason}")
    mark = request.node.get_closest_marker("benchmark")
    if mark is None or mark.kwargs.get("timer") is not DEVICE_CLOCK:
        pytest.fail(
            "transfer_benchmark must be named as a test argument or fixture dependency (not fetched with "
            "request.getfixturevalue) so that cupy_nwt can make CUDA-event device time its benchmark timer",
            pytrace=False,
        )

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
def loader_benchmark(benchmark: Any) -> Callable[..., LoaderBenchmarkResult]:
    """Factory: ``loader_benchmark(dataset, batches=20, warmup=2, rounds=5, **DataLoader_kwargs)``.

    Iterates a cupy_nwt ``DataLoader`` and records seconds per batch in pytest-benchmark (warm-up
    batches, which include worker start-up, are not recorded), plus ``samples_per_s``, the same
    per round of consecutive timed batches (``samples_per_s_rounds``, what the throughput gate
    judges, so one stalled batch cannot decide it) and the peak memory of the main process and its
    workers (PSS, see :mod:`cupy_nwt.nwt.memory`) in ``benchmark.extra_info``. Batches on the GPU are
    waited for (current stream) before the clock stops. Works on the host without a GPU (``device="cpu"``, or ``"auto"`` there).
    """

    def run(dataset: Any, batches: int = 20, warmup: int = 2, rounds: int = 5,
            **loader_kwargs: Any) -> LoaderBenchmarkResult:
        loader_args(batches, warmup, rounds)
        from .. import cuda  # noqa: PLC0415
        from ..loader import DataLoader  # noqa: PLC0415
        from ..nwt.memory import MemorySampler  # noqa: PLC0415

        loader: DataLoader[Any] = DataLoader(dataset, **loader_kwargs)
        # the batches arrive on the loader's GPU's current stream, whichever GPU is current here
        sync = cuda.stream_synchronizer(loader.device_id) if loader.device_id is not None else None
        seconds: list[float] = []
        counts: list[int] = []
        last_epoch = 0
        with loader:
            stream = _epochs(loader)

            def one_batch() -> None:
                nonlocal last_epoch
                t0 = time.perf_counter()
                last_epoch, batch = next(stream)
                if sync is not None and any(cuda.is_device_array(x) for x in _leaves(batch)):
                    sync()
                seconds.append(time.perf_counter() - t0)
                n = _batch_len(batch)
                counts.append((loader.batch_size or 1) if n is None else n)

            try:
                for _ in range(warmup):  # outside pytest-benchmark so it never sees worker start-up
                    one_batch()
                del seconds[:], counts[:]
                with MemorySampler(loader.worker_pids) as sampler:
                    benchmark.pedantic(one_batch, rounds=batches, warmup_rounds=0, iterations=1)
            finally:
                stream.close()  # end the epoch's iterator before the loader closes
            peak = sampler.peak
            result = LoaderBenchmarkResult(
                batches=len(seconds), samples=sum(counts), seconds=sum(seconds),
                samples_per_s=sum(counts) / sum(seconds) if sum(seconds) > 0 else math.inf,
                median_batch_s=statistics.median(seconds),
                peak_memory_bytes=peak.bytes if peak.samples else None,
                num_workers=int(loader.num_workers),
                device=str(loader.device),
                pin_path=str(loader.pin_path),
                epochs=last_epoch + 1,
                # a disabled benchmark (--benchmark-disable) times one batch only
                rounds=min(rounds, len(seconds)),
                samples_per_s_rounds=round_rates(counts, seconds, min(rounds, len(seconds))),
            )
        benchmark.extra_info.update(result.to_dict())
        return result

    return run
