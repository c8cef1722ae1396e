"""One ``loader_benchmark`` run: rounds of batches, each with its samples/s, CPU and instructions, sized
to a target noise within a time cap.

Why rounds and not batches: with workers, batches arrive in bursts (some were prefetched, the next is
waited for), so one batch says little; a round of consecutive batches lasting at least
:data:`ROUND_S` does. Each round records its wall seconds, the CPU seconds of the pipeline
(:mod:`cupy_nwt.pytest_plugin._cpu`) and the cores other processes took meanwhile.

How long to run (``batches=None``, the default): the first round takes batches until ROUND_S has
passed, which fixes the batches per round; after :data:`PILOT_ROUNDS` rounds the noise of the
deciding figure is the half-width of the 95% interval of its median
(:func:`~cupy_nwt.pytest_plugin._interval.median_halfwidth`), and rounds are added, in steps that
the half-width's 1/sqrt(rounds) shrinkage says should be enough, until it is at most the target or
the time cap is reached. The deciding figure is CPU per sample, the steady one, unless the pipeline
is I/O-bound (it used less than :data:`IO_BOUND_CORES` cores), when it is samples/s.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import RunError
from ._cpu import PipelineClock, Reading, window
from ._interval import median_halfwidth, rounds_for

#: seconds the base revision's count may take after this run's own (both count at once)
COUNT_TIMEOUT_S = 900.0

#: a round lasts at least this long. The CPU of a round is the pipeline's over its window, but the
#: batches counted are those handed out, and workers run up to ``prefetch_factor`` batches ahead:
#: a round gains or loses the batches in flight at its edges, an error that telescopes away over a
#: run but is ~1/(batches per round) in each round (README example, 2 workers on 2 busy vCPUs: per-round
#: spread 10% at 0.4 s, 5% at 1 s). Readings at a round's ends cost ~1 ms.
ROUND_S = 1.0
#: rounds before the noise is first judged: the fewest with a finite 95% interval of a median.
PILOT_ROUNDS = 6
MAX_ROUNDS = 400
#: a pipeline using fewer cores than this (CPU seconds per wall second) is I/O-bound.
IO_BOUND_CORES = 0.25


@dataclass(frozen=True)
class Round:
    samples: int
    batches: int
    wall_s: float
    cpu_s: float
    others_cores: float
    instructions: int | None


@dataclass(frozen=True)
class Sizing:
    """How the run was sized and why it stopped."""

    batches_per_round: int
    stopped: str  # "target noise", "time cap", "round limit" or "fixed"
    target_noise_pct: float | None
    noise_pct: float | None  # the deciding figure's half-width, percent
    decided_by: str  # "cpu_s_per_1k" or "samples_per_s"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cores(rounds: list[Round]) -> float:
    wall = sum(r.wall_s for r in rounds)
    return sum(r.cpu_s for r in rounds) / wall if wall > 0 else 0.0


def rates(rounds: list[Round]) -> tuple[float, ...]:
    return tuple(r.samples / r.wall_s for r in rounds if r.wall_s > 0 and r.samples > 0)


def cpu_per_1k(rounds: list[Round]) -> tuple[float, ...]:
    return tuple(1000.0 * r.cpu_s / r.samples for r in rounds if r.cpu_s > 0 and r.samples > 0)


def instructions_per_sample(rounds: list[Round]) -> tuple[float, ...]:
    return tuple(r.instructions / r.samples for r in rounds
                 if r.instructions is not None and r.instructions > 0 and r.samples > 0)


def deciding(rounds: list[Round]) -> tuple[str, tuple[float, ...]]:
    if cores(rounds) < IO_BOUND_CORES:
        return "samples_per_s", rates(rounds)
    return "cpu_s_per_1k", cpu_per_1k(rounds)


class RoundRunner:
    """Takes batches from ``next_batch`` (which returns the samples in the batch) and times rounds."""

    def __init__(self, next_batch: Callable[[], int], clock: PipelineClock, round_s: float = ROUND_S) -> None:
        self.next_batch = next_batch
        self.clock = clock
        self.round_s = round_s
        self.rounds: list[Round] = []
        self.batch_seconds: list[float] = []

    def _batches(self, until: Callable[[int, float], bool]) -> Round:
        a: Reading = self.clock.read()
        t0 = time.perf_counter()
        samples = batches = 0
        while True:
            b0 = time.perf_counter()
            samples += self.next_batch()
            self.batch_seconds.append(time.perf_counter() - b0)
            batches += 1
            if until(batches, time.perf_counter() - t0):
                break
        wall = time.perf_counter() - t0
        w = window(a, self.clock.read())
        r = Round(samples, batches, wall, w.cpu_s, w.others_cores, w.instructions)
        self.rounds.append(r)
        return r

    def first_round(self, least_batches: int) -> int:
        """One round of batches until ``round_s`` has passed; its batch count is every round's."""
        return self._batches(lambda n, s: n >= least_batches and s >= self.round_s).batches

    def round(self, batches: int) -> Round:
        return self._batches(lambda n, s: n >= batches)


def sized_run(runner: RoundRunner, least_batches: int, target_pct: float, max_seconds: float) -> Sizing:
    """Run rounds until the deciding figure's noise is at most ``target_pct`` or ``max_seconds`` pass."""
    start = time.perf_counter()
    k = runner.first_round(least_batches)
    for _ in range(PILOT_ROUNDS - 1):
        runner.round(k)
    target = target_pct / 100.0
    stopped = "target noise"
    while True:
        key, values = deciding(runner.rounds)
        hw = median_halfwidth(values) if len(values) >= 2 else math.inf
        n = len(runner.rounds)
        if hw <= target:
            break
        elapsed = time.perf_counter() - start
        per_round = elapsed / n
        left = int((max_seconds - elapsed) / per_round) if per_round > 0 else 0
        if left <= 0:
            stopped = "time cap"
            break
        if n >= MAX_ROUNDS:
            stopped = "round limit"
            break
        more = min(max(rounds_for(hw, n, target) - n, 2), left, MAX_ROUNDS - n)
        for _ in range(more):
            runner.round(k)
    key, values = deciding(runner.rounds)
    hw = median_halfwidth(values) if len(values) >= 2 else math.inf
    return Sizing(k, stopped, target_pct, 100.0 * hw if math.isfinite(hw) else None, key)


def fixed_run(runner: RoundRunner, batches: int, rounds: int) -> Sizing:
    """``rounds`` consecutive, near-equal rounds of ``batches`` timed batches in all."""
    size, extra = divmod(batches, rounds)
    for r in range(rounds):
        runner.round(size + (r < extra))
    key, values = deciding(runner.rounds)
    hw = median_halfwidth(values) if len(values) >= 2 else math.inf
    return Sizing(size, "fixed", None, 100.0 * hw if math.isfinite(hw) else None, key)


def median_or_none(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


def pipeline_of(loader: Any, dataset: Any) -> dict[str, Any]:
    """What the figures depend on besides the machine: recorded beside them, shown when it changed."""
    from ..picks.fingerprint import transform_name  # noqa: PLC0415

    try:
        length: int | None = len(dataset)
    except TypeError:
        length = None
    kind = type(dataset)
    return {
        "dataset": f"{kind.__module__}.{kind.__qualname__}", "dataset_len": length,
        "batch_size": loader.batch_size, "num_workers": int(loader.num_workers),
        "worker_type": str(loader.worker_type), "prefetch_factor": int(loader.prefetch_factor),
        "transform": transform_name(loader.batch_transform), "device": str(loader.device),
    }


def round_figures(r: Round) -> dict[str, Any]:
    return {"samples": r.samples, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "others_cores": r.others_cores}


def paired_run(runner: RoundRunner, base: Any, least_batches: int, target_pct: float, max_seconds: float) -> tuple[
        Sizing, list[dict[str, Any]]]:
    """Rounds here and in the base revision's child, in pairs, the order flipped every pair.

    Stops when the pairs' samples/s interval is within ``target_pct`` (from :data:`PILOT_ROUNDS` pairs
    on) or ``2 * max_seconds`` have passed: both sides share the time a lone run would have had twice.
    """
    from ._interval import paired_interval  # noqa: PLC0415

    start = time.perf_counter()
    theirs = [base.round(None)]
    k = runner.first_round(least_batches)
    stopped = "target noise"
    while True:
        n = len(runner.rounds)
        ours = rates(runner.rounds)
        base_rates = tuple(b["samples"] / b["wall_s"] for b in theirs)
        hw = math.inf
        if n >= PILOT_ROUNDS and len(ours) == len(base_rates):
            iv = paired_interval(base_rates, ours)
            hw = (iv.high - iv.low) / 2.0
            if hw <= target_pct / 100.0:
                break
        if n >= PILOT_ROUNDS and time.perf_counter() - start >= 2 * max_seconds:
            stopped = "time cap"
            break
        if n >= MAX_ROUNDS:
            stopped = "round limit"
            break
        if n % 2 == 0:
            theirs.append(base.round(None))
            runner.round(k)
        else:
            runner.round(k)
            theirs.append(base.round(None))
    return Sizing(k, stopped, target_pct, 100.0 * hw if math.isfinite(hw) else None, "samples_per_s"), theirs


def software() -> dict[str, str]:
    """What an exact count depends on besides the pipeline and the CPU: the interpreter, NumPy, this package
    and valgrind (an upgrade moves the counts of unchanged code)."""
    import platform  # noqa: PLC0415

    import numpy  # noqa: PLC0415

    from .. import __version__  # noqa: PLC0415
    from ._callgrind import valgrind_version  # noqa: PLC0415

    return {"python": platform.python_version(), "numpy": numpy.__version__, "cupy_nwt": __version__,
            "valgrind": valgrind_version()}


OFF_NOTE = "counting is off (--nwt-instructions=off)"


def counts_info(source: Any, loader: Any, samples: int | None) -> dict[str, Any]:
    """The exact counts of ``loader``'s pipeline on ``source`` as ``extra_info`` keys; ``count_note`` when none."""
    from ..errors import CallgrindError  # noqa: PLC0415
    from ._cost import MODEL  # noqa: PLC0415
    from ._count import count_pipeline  # noqa: PLC0415

    try:
        c = count_pipeline(source, batch_size=loader.batch_size, collate_fn=loader.collate_fn,
                           batch_transform=loader.batch_transform, samples=samples)
    except CallgrindError as exc:
        return {"count_note": str(exc)}
    out: dict[str, Any] = {"instructions_per_sample": c.per_sample, "instructions_counted_by": "callgrind",
                           "instructions_samples": c.samples, "count_seconds": c.seconds, "count_software": software()}
    if c.cost is not None:
        out.update(cost_per_sample=c.cost.total, cost_components=c.cost.to_dict(), cost_model=MODEL,
                   native_cpu_s_per_1k=c.native_cpu_s_per_1k)
    return out


def run_loader_benchmark(benchmark: Any, dataset: Any, *, batches: int | None, warmup: int, rounds: int | None,
                         target_noise_pct: float, max_seconds: float, loader_kwargs: dict[str, Any],
                         node: Any = None, against: Any = None, count: bool = False,
                         count_samples: int | None = None) -> Any:
    """The body of the ``loader_benchmark`` fixture (see its docstring); returns a LoaderBenchmarkResult.

    ``against``: a :class:`~cupy_nwt.pytest_plugin._against.BaseRevision` to measure beside, round
    for round; ``count``: count instructions per sample under callgrind after the rounds.
    """
    from .. import cuda  # noqa: PLC0415
    from ..loader import DataLoader  # noqa: PLC0415
    from ..nwt.footprint import MemorySampler  # noqa: PLC0415
    from ..picks.fingerprint import machine_fingerprint  # noqa: PLC0415
    from ._against import serve, served_here  # noqa: PLC0415
    from ._cpu import live_descendants, open_instruction_counter  # noqa: PLC0415
    from ._parts import ROUND_CLOCK, LoaderBenchmarkResult, batch_len, epochs, leaves  # noqa: PLC0415
    serving = served_here(node.nodeid) if node is not None else None
    base = None
    if against is not None and serving is None:
        base = against.start(node.path, node.nodeid, node.config.invocation_params.dir)  # starts while ours warms up
    theirs: list[dict[str, Any]] = []
    counter, why_not = open_instruction_counter()  # before the loader: workers started later are counted
    others = live_descendants()  # not the pipeline: a fixture's server, an earlier loader awaiting collection
    try:
        loader: DataLoader[Any] = DataLoader(dataset, **loader_kwargs)
        sync = cuda.stream_synchronizer(loader.device_id) if loader.device_id is not None else None
        last_epoch = 0
        with loader:
            stream = epochs(loader)

            def next_batch() -> int:
                nonlocal last_epoch
                last_epoch, batch = next(stream)
                if sync is not None and any(cuda.is_device_array(x) for x in leaves(batch)):
                    sync()
                n = batch_len(batch)
                return (loader.batch_size or 1) if n is None else n

            # the base revision's child pytest is this process's child, not part of its pipeline
            clock = PipelineClock(loader.worker_pids, counter,
                                  exclude=[*others, *([base.proc.pid] if base is not None else [])])
            runner = RoundRunner(next_batch, clock)
            try:
                for _ in range(warmup):  # worker start-up and first-touch costs stay out of the rounds
                    next_batch()
                # the sampler reads smaps every 0.2 s: its CPU (~1 ms per process per read) stays well under 1%
                with MemorySampler(loader.worker_pids, interval=0.2) as sampler:
                    least = max(2, loader.num_workers)
                    if serving is not None:
                        sizes: list[int] = []

                        def one(_: int | None) -> dict[str, Any]:
                            if not sizes:
                                sizes.append(runner.first_round(least))
                                return round_figures(runner.rounds[-1])
                            return round_figures(runner.round(sizes[0]))

                        serve(serving, {"ready": True}, one,
                              lambda n: counts_info(dataset, loader, n) if count else {"count_note": "counting is off"})
                        sizing = Sizing(sizes[0] if sizes else 0, "served", None, None, "samples_per_s")
                    elif base is not None:
                        base.wait_ready()
                        sizing, theirs = paired_run(runner, base, least, target_noise_pct, max_seconds)
                    elif batches is None:
                        sizing = sized_run(runner, least, target_noise_pct, max_seconds)
                    else:
                        sizing = fixed_run(runner, batches, rounds or min(5, batches))
            finally:
                stream.close()  # end the epoch's iterator before the loader closes
            pipeline = pipeline_of(loader, dataset)
        if count and base is not None and theirs:
            base.ask_count(count_samples)  # the base revision counts while this one does
        counts: dict[str, Any] = {}
        if count and serving is None:
            counts = counts_info(dataset, loader, count_samples)
            if "count_note" in counts:
                why_not = f"{counts['count_note']}; {why_not}" if why_not else str(counts["count_note"])
        elif not count and counter is None:  # the option, not the hardware counter, is why nothing was counted
            why_not = f"{OFF_NOTE}; {why_not}" if why_not else OFF_NOTE
        base_counts = base.counted(COUNT_TIMEOUT_S) if count and base is not None and theirs else {}
    finally:
        if counter is not None:
            counter.close()
        if base is not None:
            base.close()
    done = runner.rounds
    if not done:
        raise RunError("the benchmark ran no round (the base revision's child stopped it before any)")
    against_info: dict[str, Any] = {}
    if against is not None and theirs:
        against_info = {
            "rev": against.commit, "rev_name": against.name, "pairs": len(theirs),
            "samples_per_s_rounds": [b["samples"] / b["wall_s"] for b in theirs],
            "cpu_s_per_1k_rounds": [1000.0 * b["cpu_s"] / b["samples"] for b in theirs], **base_counts,
        }
    replay = iter([1000.0 * r.wall_s / r.samples for r in done])
    benchmark.pedantic(lambda: ROUND_CLOCK.advance(next(replay)), rounds=len(done), warmup_rounds=0, iterations=1)
    samples, wall = sum(r.samples for r in done), sum(r.wall_s for r in done)
    cpu_rounds, ins_rounds = cpu_per_1k(done), instructions_per_sample(done)
    ins_note = why_not or ("" if ins_rounds else "the counter read no instructions")
    ins = (sum(r.instructions or 0 for r in done) / samples) if ins_rounds else None
    by = "perf" if ins_rounds else ""
    if "instructions_per_sample" in counts:
        ins, ins_rounds, ins_note, by = counts["instructions_per_sample"], (), "", "callgrind"
    peak = sampler.peak
    return LoaderBenchmarkResult(
        batches=sum(r.batches for r in done), samples=samples, seconds=wall,
        samples_per_s=samples / wall if wall > 0 else math.inf,
        median_batch_s=statistics.median(runner.batch_seconds),
        peak_memory_bytes=peak.bytes if peak.samples else None,
        num_workers=int(loader.num_workers), device=str(loader.device), pin_path=str(loader.pin_path),
        epochs=last_epoch + 1, rounds=len(done), samples_per_s_rounds=rates(done),
        cpu_s_per_1k=1000.0 * sum(r.cpu_s for r in done) / samples if samples else None,
        cpu_s_per_1k_rounds=cpu_rounds, cpu_cores=cores(done),
        others_cores=sum(r.others_cores * r.wall_s for r in done) / wall if wall > 0 else None,
        cpus_watched=len(clock.cpus),
        instructions_per_sample=ins, instructions_per_sample_rounds=ins_rounds, instructions_note=ins_note,
        instructions_counted_by=by, instructions_samples=counts.get("instructions_samples"),
        count_seconds=counts.get("count_seconds"), cost_per_sample=counts.get("cost_per_sample"),
        cost_components=counts.get("cost_components") or {}, cost_model=counts.get("cost_model", ""),
        count_software=counts.get("count_software") or {},
        native_cpu_s_per_1k=counts.get("native_cpu_s_per_1k"), against=against_info,
        batches_per_round=sizing.batches_per_round, stopped=sizing.stopped,
        target_noise_pct=sizing.target_noise_pct, noise_pct=sizing.noise_pct, decided_by=sizing.decided_by,
        pipeline=pipeline, machine=machine_fingerprint().to_dict(),
    )
