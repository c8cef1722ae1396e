"""pytest plugin: transfer and loader benchmarks that pytest-benchmark saves, compares and gates.

Registered through the ``pytest11`` entry point, so installing cupy-nwt is enough. Two factory
fixtures, ``transfer_benchmark`` and ``loader_benchmark``, run on pytest-benchmark's ``benchmark``
fixture, so ``--benchmark-autosave`` / ``--benchmark-compare`` / ``--benchmark-compare-fail`` work on
them as on any benchmark. pytest-benchmark compares times; a pipeline is judged by throughput, so
``--nwt-throughput-drop=PCT`` fails the run when ``gbps`` or ``samples_per_s`` in a benchmark's
``extra_info`` fell by more than PCT percent against the saved baseline (any benchmark that puts
those keys there is gated, not only ours).

Nothing here imports CuPy: all CUDA goes through :mod:`cupy_nwt.cuda`, lazily, so loading the plugin
costs every pytest run next to nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

#: extra_info keys the gate watches (higher is better), with the unit printed next to them.
THROUGHPUT_KEYS: dict[str, str] = {"gbps": "GB/s", "samples_per_s": "samples/s"}

_GATE_KEY = pytest.StashKey["ThroughputGate"]()


# ---------------------------------------------------------------- the device clock


class DeviceClock:
    """A clock that only moves by device time handed to it.

    pytest-benchmark times a round as ``timer()`` after minus ``timer()`` before. With this clock
    as the timer (the documented ``@pytest.mark.benchmark(timer=...)`` route) and a round that
    advances it by the CUDA-event time of its copy, pytest-benchmark records device time, not the
    wall time of a call that may return before (or long after) the copy itself ran.
    """

    __name__ = "device_clock"  # what pytest-benchmark writes as the timer in its JSON

    def __init__(self) -> None:
        self._now = 0.0

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"device time must be >= 0 s, got {seconds!r}")
        self._now += seconds


DEVICE_CLOCK = DeviceClock()


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class TransferBenchmarkResult:
    """One copy size and direction, timed with CUDA events; GB/s are decimal, per direction."""

    nbytes: int
    direction: str
    pinned: bool
    repeats: int
    median_s: float
    min_s: float
    gbps: float
    best_gbps: float
    link_gbps: float | None
    link_fraction: float | None
    timing: str = "cuda-events"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoaderBenchmarkResult:
    """Timed batches of one DataLoader configuration (warm-up batches excluded)."""

    batches: int
    samples: int
    seconds: float
    samples_per_s: float
    median_batch_s: float
    peak_memory_bytes: int | None
    num_workers: int
    device: str
    pin_path: str
    epochs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- options and hooks


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
    for line, bad in gate.lines:
        terminalreporter.write_line(line, red=bad)
    if gate.failed:
        terminalreporter.write_line(
            f"cupy_nwt throughput gate FAILED: {len(gate.regressions)} benchmark(s) fell by more than "
            f"{gate.max_drop_pct:g}%",
            red=True,
            bold=True,
        )


# ---------------------------------------------------------------- transfer_benchmark


class _CopyTimer:
    """Buffers for one copy size and direction; ``once()`` returns device seconds per copy.

    Small copies are issued back to back within one event pair (as the transfer experiments do)
    so the events' resolution does not swamp them; the result is divided back to one copy.
    """

    def __init__(self, nbytes: int, direction: str, pinned: bool) -> None:
        import numpy as np  # noqa: PLC0415

        from . import cuda  # noqa: PLC0415
        from .transfers import copies_per_sample  # noqa: PLC0415

        self.nbytes, self.direction = nbytes, direction
        self.k = copies_per_sample(nbytes)
        self.pattern = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)
        self.host = cuda.pinned_empty(nbytes, np.uint8) if pinned else np.empty(nbytes, np.uint8)
        self.host[:] = self.pattern if direction == "h2d" else 0  # touch every page before timing
        self.dev = cuda.device_empty(nbytes, np.uint8)
        self.stream = cuda.stream()
        if direction == "d2h":
            cuda.memcpy_h2d(self.dev, self.pattern, self.stream)
            self.stream.synchronize()

    def _copies(self, st: Any) -> None:
        from . import cuda  # noqa: PLC0415

        copy = cuda.memcpy_h2d if self.direction == "h2d" else cuda.memcpy_d2h
        a, b = (self.dev, self.host) if self.direction == "h2d" else (self.host, self.dev)
        for _ in range(self.k):
            copy(a, b, st)

    def once(self) -> float:
        from .timing import device_time  # noqa: PLC0415

        return device_time(self._copies, repeats=1, warmup=0, stream=self.stream)[0] / self.k

    def verified(self) -> bool:
        """Whether the bytes arrived intact (a fast copy of the wrong bytes is not a result)."""
        import numpy as np  # noqa: PLC0415

        from . import cuda  # noqa: PLC0415

        self.stream.synchronize()
        if self.direction == "h2d":
            back = np.zeros(self.nbytes, np.uint8)
            cuda.memcpy_d2h(back, self.dev, self.stream)
            self.stream.synchronize()
            return bool(np.array_equal(back, self.pattern))
        return bool(np.array_equal(self.host, self.pattern))

    def link_gbps(self) -> float | None:
        from . import cuda  # noqa: PLC0415
        from .transfers import link_rate  # noqa: PLC0415

        return link_rate(cuda.pcie_link(cuda.current_device()))[0]  # the copies ran on the current GPU

    def close(self) -> None:
        from . import cuda  # noqa: PLC0415

        self.stream.synchronize()
        self.host = self.dev = None
        cuda.release_memory_pools()


def _transfer_args(nbytes: int | str, direction: str, pinned: bool, repeats: int, warmup: int) -> tuple[int, str]:
    from .units import parse_size  # noqa: PLC0415

    size = parse_size(nbytes)
    d = str(direction).lower()
    if d not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
    if not isinstance(pinned, bool):
        raise ValueError(f"pinned must be True or False, got {pinned!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    return size, d


@pytest.fixture
def transfer_benchmark(benchmark: Any, request: pytest.FixtureRequest) -> Callable[..., TransferBenchmarkResult]:
    """Factory: ``transfer_benchmark(nbytes, direction="h2d", pinned=True, repeats=20, warmup=3)``.

    Times one host<->device copy size with CUDA events and records those device seconds in
    pytest-benchmark (so save/compare work), plus ``gbps`` and ``link_fraction`` (of the PCIe
    link's theoretical rate) in ``benchmark.extra_info``. Skips, with the probe's reason, when no
    GPU is usable. Like ``benchmark``, call it once per test (parametrize for a size sweep).
    """
    from . import cuda  # noqa: PLC0415

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


def _transfer_result(nbytes: int, direction: str, pinned: bool, times: list[float],
                     link_gbps: float | None) -> TransferBenchmarkResult:
    med, best = statistics.median(times), min(times)
    gbps = nbytes / med / 1e9 if med > 0 else math.inf
    return TransferBenchmarkResult(
        nbytes=nbytes, direction=direction, pinned=pinned, repeats=len(times), median_s=med, min_s=best,
        gbps=gbps, best_gbps=nbytes / best / 1e9 if best > 0 else math.inf,
        link_gbps=link_gbps, link_fraction=gbps / link_gbps if link_gbps else None,
    )


# ---------------------------------------------------------------- loader_benchmark


def _batch_len(batch: Any) -> int | None:
    """Samples in a collated batch: the leading dimension of its first array-like leaf."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for leaf in batch:
            n = _batch_len(leaf)
            if n is not None:
                return n
    return None


def _leaves(batch: Any) -> Iterator[Any]:
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for b in batch:
            yield from _leaves(b)
    else:
        yield batch


def _epochs(loader: Any) -> Iterator[tuple[int, Any]]:
    """(epoch, batch) forever: a benchmark longer than one epoch runs on, as training would."""
    epoch = 0
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield epoch, batch
        if empty:
            raise ValueError("the loader yields no batches (empty dataset, or drop_last with fewer samples than batch_size)")
        epoch += 1


@pytest.fixture
def loader_benchmark(benchmark: Any) -> Callable[..., LoaderBenchmarkResult]:
    """Factory: ``loader_benchmark(dataset, batches=20, warmup=2, **DataLoader_kwargs)``.

    Iterates a cupy_nwt ``DataLoader`` and records seconds per batch in pytest-benchmark (warm-up
    batches, which include worker start-up, are not recorded), plus ``samples_per_s`` and the peak
    memory of the main process and its workers (PSS, see :mod:`cupy_nwt.nwt.memory`) in
    ``benchmark.extra_info``. Batches on the GPU are waited for (current stream) before the clock
    stops. Works on the host without a GPU (``device="cpu"``, or ``"auto"`` there).
    """

    def run(dataset: Any, batches: int = 20, warmup: int = 2, **loader_kwargs: Any) -> LoaderBenchmarkResult:
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(f"batches must be an int >= 1, got {batches!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        from . import cuda  # noqa: PLC0415
        from .loader import DataLoader  # noqa: PLC0415
        from .nwt.memory import MemorySampler  # noqa: PLC0415

        loader = DataLoader(dataset, **loader_kwargs)
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
                counts.append(loader.batch_size if n is None else n)

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
            )
        benchmark.extra_info.update(result.to_dict())
        return result

    return run


# ---------------------------------------------------------------- the gate


@dataclass(frozen=True)
class Comparison:
    """One throughput figure now against the same benchmark's figure in a baseline."""

    fullname: str
    key: str
    old: float
    new: float
    source: str

    @property
    def change_pct(self) -> float:
        return (self.new - self.old) / self.old * 100.0

    def message(self, max_drop_pct: float | None) -> str:
        unit = THROUGHPUT_KEYS.get(self.key, self.key)
        head = f"{self.fullname}: {unit} {_num(self.old)} -> {_num(self.new)} ({self.change_pct:+.1f}%)"
        if self.regressed(max_drop_pct):
            head = (f"{self.fullname}: {unit} fell {-self.change_pct:.1f}% (more than {max_drop_pct:g}%): "
                    f"{_num(self.old)} -> {_num(self.new)}")
        return f"{head} [baseline {self.source}]"

    def regressed(self, max_drop_pct: float | None) -> bool:
        return max_drop_pct is not None and -self.change_pct > max_drop_pct

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["change_pct"] = self.change_pct
        return d


def _num(x: float) -> str:
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.4g}"


def compare_throughput(
    current: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Mapping[str, Any]],
    source: str,
) -> list[Comparison]:
    """Pair each throughput key in ``current[fullname]`` (an extra_info) with the baseline's.

    ``baseline`` maps fullname -> a benchmark entry of pytest-benchmark's JSON (with ``extra_info``).
    Benchmarks or keys missing on either side, and non-positive figures, are not compared.
    """
    out = []
    for fullname, info in current.items():
        entry = baseline.get(fullname)
        if not entry:
            continue
        old_info = entry.get("extra_info") or {}
        for key in THROUGHPUT_KEYS:
            old, new = _positive(old_info.get(key)), _positive(info.get(key))
            if old is not None and new is not None:
                out.append(Comparison(fullname, key, old, new, source))
    return out


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def load_baseline(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read a pytest-benchmark JSON file into fullname -> benchmark entry; clear errors if it is not one."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise pytest.UsageError(f"--nwt-baseline: no such file: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise pytest.UsageError(f"--nwt-baseline: {p} is not readable JSON ({exc})") from None
    benches = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benches, list) or not all(isinstance(b, dict) and "fullname" in b for b in benches):
        raise pytest.UsageError(
            f"--nwt-baseline: {p} is not a pytest-benchmark result (expected a 'benchmarks' list of "
            "entries with 'fullname'; write one with --benchmark-json or --benchmark-autosave)"
        )
    return {b["fullname"]: b for b in benches}


class ThroughputGate:
    """Collects this run's throughput figures and compares them with the baselines at session end."""

    def __init__(self, max_drop_pct: float | None, explicit: dict[str, dict[str, Any]] | None) -> None:
        self.max_drop_pct = max_drop_pct
        self.explicit = explicit
        self.comparisons: list[Comparison] = []
        self.lines: list[tuple[str, bool]] = []
        self.evaluated = False

    @property
    def regressions(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.regressed(self.max_drop_pct)]

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def evaluate(self, config: pytest.Config) -> None:
        self.evaluated = True
        baselines = self._baselines(config)
        if not baselines:
            return
        current = _current_throughput(config)
        for source, mapping in baselines:
            self.comparisons += compare_throughput(current, mapping, source)
        for c in self.comparisons:
            self.lines.append((c.message(self.max_drop_pct), c.regressed(self.max_drop_pct)))
        if self.max_drop_pct is not None and not self.comparisons:
            self.lines.append((
                "no throughput compared: no benchmark of this run has gbps/samples_per_s both now and in "
                f"the baseline ({', '.join(s for s, _ in baselines)})", False,
            ))

    def _baselines(self, config: pytest.Config) -> list[tuple[str, Mapping[str, Mapping[str, Any]]]]:
        out: list[tuple[str, Mapping[str, Mapping[str, Any]]]] = []
        if self.explicit is not None:
            out.append((str(config.getoption("nwt_baseline")), self.explicit))
        if config.getoption("benchmark_compare", None):
            # pytest-benchmark has no public accessor for the runs --benchmark-compare selected;
            # its session keeps them as {path: {fullname: entry}} (tests/test_pytest_plugin.py pins it).
            mapping = getattr(getattr(config, "_benchmarksession", None), "compared_mapping", None)
            if mapping is None:
                raise pytest.UsageError(
                    "cupy_nwt cannot read the runs --benchmark-compare selected from this pytest-benchmark "
                    "version; pass --nwt-baseline FILE.json instead"
                )
            if not mapping and self.max_drop_pct is not None:
                self.lines.append(("--benchmark-compare found no saved run: throughput not gated this time "
                                   "(save one with --benchmark-autosave)", False))
            out += [(_short(path), m) for path, m in mapping.items()]
        return out


def _short(path: Any) -> str:
    try:
        return os.path.relpath(path)
    except (TypeError, ValueError):
        return str(path)


def _current_throughput(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """fullname -> extra_info of this run's benchmarks that finished without error."""
    bs = getattr(config, "_benchmarksession", None)
    out: dict[str, dict[str, Any]] = {}
    for bench in getattr(bs, "benchmarks", None) or []:
        if bench.has_error or not bench:
            continue
        if any(k in bench.extra_info for k in THROUGHPUT_KEYS):
            out[bench.fullname] = bench.extra_info
    return out
