"""What the plugin's benchmark fixtures are built from: the device clock, the copy timer, the results.

Kept apart from :mod:`cupy_nwt.pytest_plugin` (options, hooks and the fixtures themselves) and
:mod:`cupy_nwt.pytest_plugin._gate` (the comparison). Nothing here imports CuPy at import time: all CUDA
goes through :mod:`cupy_nwt.cuda`, lazily.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Generator, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ArgumentError


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
            raise ArgumentError(f"device time must be >= 0 s, got {seconds!r}")
        self._now += seconds


DEVICE_CLOCK = DeviceClock()


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class TransferBenchmarkResult:
    """One copy size and direction, timed with CUDA events; GB/s are decimal, per direction.

    ``gbps_rounds`` holds the GB/s of each timed repeat: the rounds the throughput gate judges.
    """

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
    gbps_rounds: tuple[float, ...]
    timing: str = "cuda-events"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoaderBenchmarkResult:
    """Timed rounds of one DataLoader configuration (warm-up batches excluded).

    Headline figures are over all timed rounds; ``<figure>_rounds`` hold them per round, what the
    throughput gate judges. ``cpu_s_per_1k`` is CPU seconds per 1,000 samples of the main process
    and every process it started; ``instructions_per_sample`` is the exact count of callgrind
    (``instructions_counted_by``) over a fixed set of samples, else perf's per round where the kernel
    allows, else None and ``instructions_note`` says why. ``cost_per_sample`` weighs the same count's
    cache misses, page faults and system calls in (``cost_components``; :mod:`cupy_nwt.pytest_plugin._cost`). ``against`` holds, under ``--nwt-against``,
    the base revision's rounds, each measured beside the round of the same index here. ``cpu_cores`` is the pipeline's CPU seconds per wall
    second, ``others_cores`` the same for everything else on the ``cpus_watched`` CPUs this process may
    run on, meanwhile.
    """

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
    rounds: int
    samples_per_s_rounds: tuple[float, ...]
    cpu_s_per_1k: float | None = None
    cpu_s_per_1k_rounds: tuple[float, ...] = ()
    cpu_cores: float | None = None
    others_cores: float | None = None
    cpus_watched: int | None = None
    instructions_per_sample: float | None = None
    instructions_per_sample_rounds: tuple[float, ...] = ()
    instructions_note: str = ""
    instructions_counted_by: str = ""  # "callgrind" (exact, one figure), "perf" (per round) or "" (none)
    instructions_samples: int | None = None  # the samples callgrind counted
    count_seconds: float | None = None  # the count's seconds under callgrind (CI time it costs)
    cost_per_sample: float | None = None  # instructions, cache misses and kernel work weighed in (._cost)
    cost_components: dict[str, float] = field(default_factory=dict)  # per sample, unweighted
    cost_model: str = ""  # the weights' name (._cost.MODEL)
    count_software: dict[str, Any] = field(default_factory=dict)  # what the count ran on (._loader_run.software)
    native_cpu_s_per_1k: float | None = None  # the counted region's CPU natively (information)
    against: dict[str, Any] = field(default_factory=dict)  # --nwt-against: the base revision's paired rounds
    batches_per_round: int = 0
    stopped: str = "fixed"
    target_noise_pct: float | None = None
    noise_pct: float | None = None
    decided_by: str = "samples_per_s"
    pipeline: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RoundClock(DeviceClock):
    """The loader's benchmark timer: moves by each timed round's wall seconds per 1,000 samples.

    The rounds are sized while they run, and pytest-benchmark's ``pedantic`` needs its round count
    up front, so the rounds are replayed to it afterwards; rounds of different batch counts stay
    comparable because each is per 1,000 samples.
    """

    __name__ = "wall_s_per_1k_samples"


ROUND_CLOCK = RoundClock()


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else math.inf


def transfer_result(nbytes: int, direction: str, pinned: bool, times: list[float],
                    link_gbps: float | None) -> TransferBenchmarkResult:
    med, best = statistics.median(times), min(times)
    gbps = _rate(nbytes / 1e9, med)
    return TransferBenchmarkResult(
        nbytes=nbytes, direction=direction, pinned=pinned, repeats=len(times), median_s=med, min_s=best,
        gbps=gbps, best_gbps=_rate(nbytes / 1e9, best),
        link_gbps=link_gbps, link_fraction=gbps / link_gbps if link_gbps else None,
        gbps_rounds=tuple(_rate(nbytes / 1e9, t) for t in times),
    )


# ---------------------------------------------------------------- arguments


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def transfer_args(nbytes: int | str, direction: str, pinned: bool, repeats: int, warmup: int) -> tuple[int, str]:
    from ..reporting.units import parse_size  # noqa: PLC0415

    size = parse_size(nbytes)
    d = str(direction).lower()
    if d not in ("h2d", "d2h"):
        raise ArgumentError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
    if not isinstance(pinned, bool):
        raise ArgumentError(f"pinned must be True or False, got {pinned!r}")
    _count("repeats", repeats, 1)
    _count("warmup", warmup, 0)
    return size, d


def loader_args(batches: int | None, warmup: int, rounds: int | None) -> None:
    if batches is not None:
        _count("batches", batches, 1)
    _count("warmup", warmup, 0)
    if rounds is not None:
        _count("rounds", rounds, 1)
        if batches is None:
            raise ArgumentError("rounds needs batches: give both for a fixed run, or neither to let the "
                             "benchmark size itself")
        if rounds > batches:
            raise ArgumentError(f"rounds ({rounds}) must not exceed batches ({batches}): each round times whole "
                             "batches; time more batches or ask for fewer rounds")


def sizing_args(target_noise: float, max_seconds: float) -> None:
    if isinstance(target_noise, bool) or not isinstance(target_noise, (int, float)) or not 0 < target_noise < 100:
        raise ArgumentError(f"target_noise must be a percentage between 0 and 100, got {target_noise!r}")
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not 0 < max_seconds <= 86400:
        raise ArgumentError(f"max_seconds must be a number of seconds > 0 (at most a day), got {max_seconds!r}")


# ---------------------------------------------------------------- the copy timer


class CopyTimer:
    """Buffers for one copy size and direction; ``once()`` returns device seconds per copy.

    Small copies are issued back to back within one event pair (as the transfer experiments do)
    so the events' resolution does not swamp them; the result is divided back to one copy.
    """

    def __init__(self, nbytes: int, direction: str, pinned: bool) -> None:
        import numpy as np  # noqa: PLC0415

        from .. import cuda  # noqa: PLC0415
        from ..experiments.transfers import copies_per_sample  # noqa: PLC0415

        self.nbytes, self.direction = nbytes, direction
        self.k = copies_per_sample(nbytes)
        self.pattern = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)
        self.host: Any = cuda.pinned_empty(nbytes, np.uint8) if pinned else np.empty(nbytes, np.uint8)
        self.host[:] = self.pattern if direction == "h2d" else 0  # touch every page before timing
        self.dev: Any = cuda.device_empty(nbytes, np.uint8)
        self.stream = cuda.stream()
        if direction == "d2h":
            cuda.memcpy_h2d(self.dev, self.pattern, self.stream)
            self.stream.synchronize()

    def _copies(self, st: Any) -> None:
        from .. import cuda  # noqa: PLC0415

        copy = cuda.memcpy_h2d if self.direction == "h2d" else cuda.memcpy_d2h
        a, b = (self.dev, self.host) if self.direction == "h2d" else (self.host, self.dev)
        for _ in range(self.k):
            copy(a, b, st)

    def once(self) -> float:
        from ..experiments.timing import device_time  # noqa: PLC0415

        return device_time(self._copies, repeats=1, warmup=0, stream=self.stream)[0] / self.k

    def verified(self) -> bool:
        """Whether the bytes arrived intact (a fast copy of the wrong bytes is not a result)."""
        import numpy as np  # noqa: PLC0415

        from .. import cuda  # noqa: PLC0415

        self.stream.synchronize()
        if self.direction == "h2d":
            back = np.zeros(self.nbytes, np.uint8)
            cuda.memcpy_d2h(back, self.dev, self.stream)
            self.stream.synchronize()
            return bool(np.array_equal(back, self.pattern))
        return bool(np.array_equal(self.host, self.pattern))

    def link_gbps(self) -> float | None:
        from .. import cuda  # noqa: PLC0415
        from ..experiments.transfers import link_rate  # noqa: PLC0415

        return link_rate(cuda.pcie_link(cuda.current_device()))[0]  # the copies ran on the current GPU

    def close(self) -> None:
        from .. import cuda  # noqa: PLC0415

        self.stream.synchronize()
        self.host = self.dev = None
        cuda.release_memory_pools()


# ---------------------------------------------------------------- batches


def batch_len(batch: Any) -> int | None:
    """Samples in a collated batch: the leading dimension of its first array-like leaf."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for leaf in batch:
            n = batch_len(leaf)
            if n is not None:
                return n
    return None


def leaves(batch: Any) -> Iterator[Any]:
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for b in batch:
            yield from leaves(b)
    else:
        yield batch


def epochs(loader: Any) -> Generator[tuple[int, Any], None, None]:
    """(epoch, batch) forever: a benchmark longer than one epoch runs on, as training would."""
    epoch = 0
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield epoch, batch
        if empty:
            raise ArgumentError("the loader yields no batches (empty dataset, or drop_last with fewer samples "
                             "than batch_size)")
        epoch += 1
