"""A loader's settings: its arguments turned into one frozen ``Options``, checked in one place (with
PyTorch's rules and error types where PyTorch has them), as Grain's ``options`` does. Everything
below the ``DataLoader`` reads these, never the loader.

Resolving builds nothing and measures nothing: ``num_workers="auto"`` reads the saved pick
(``picks.pick``), and on a miss resolves to online tuning that starts from
``tuning.policy.starting_workers`` and saves the count it settles at (``tuning.online``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from .. import system
from .._checks import check_bool, check_int, check_number
from ..errors import ArgumentError, ArgumentTypeError
from ..picks.pick import OnlinePick, auto_fingerprint, auto_request, missing, saved_pick
from ..ranks import RankLayout, process_group_layout, rank_layout, worker_budget
from ._stats import STALL_WARNING_S, check_stall
from .device.place import resolve_device
from .device.prefetch import PrefetchOps
from .plan.order import fresh_seed
from .plan.sampling import Sampling
from .ring.collate import default_collate, torch_default_collate
from .ring.frameworks import check_output, generator_seed, joined_output, torch_global_seed, uses_torch
from .tuning.online import Tuning, check_tuning
from .tuning.policy import starting_workers
from .workers.capacity import check_worker_count
from .workers.kinds import check_worker_type, kind
from .workers.pool import WorkerKind
from .workers.torch_workers import is_iter_datapipe, with_shuffle_settings

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """A loader's resolved settings (``DataLoader``'s docstring says what each means)."""

    dataset: Any
    sampling: Sampling
    num_workers: int
    worker_type: str
    prefetch_factor: int
    pin_memory: bool | str
    collate_fn: Callable | None
    batch_transform: Callable | None
    worker_init_fn: Callable | None
    persistent_workers: bool
    timeout: float | None
    in_order: bool
    zero_copy: bool
    context: BaseContext | None  # the workers' start context (None: the kind's default)
    multiprocessing_context: Any  # as given
    pin_memory_device: str  # torch's, accepted and ignored (with its warning)
    output: str  # the framework batches come out in ("auto": the samples')
    device: str
    device_id: int | None
    rank_layout: RankLayout
    seed: int
    stall_warning_s: float | None
    tuning: Tuning | None
    generator: Any = None  # as given (read back as ``loader.generator``); ``seed`` holds what was drawn from it
    seed_drawn: bool = False  # neither seed nor generator given: a saved state's seed may replace it (torchdata's rule)
    num_workers_why: str | None = None  # num_workers="auto": why the tuner picked the count (``stats()`` says it)
    on_bad_sample: str = "raise"  # "skip": a sample that fails to read or decode is left out of its batch
    max_bad_samples: int | None = None  # with "skip": more in one epoch stops it (None: no limit)
    torch_in_use: bool = False  # torch was imported when the loader was made (``frameworks.uses_torch``)
    snapshot_every_n_steps: int | None = 1  # torchdata's, read back; every batch brings its reader's state here

    @property
    def generator_given(self) -> bool:
        """Whether the seed was drawn from a NumPy or torch generator (not an int), which a state's seed replaces
        as torchdata restores its generator from the state."""
        return self.generator is not None and not isinstance(self.generator, (int, np.integer))

    @property
    def rank(self) -> int:
        return self.rank_layout.rank

    @property
    def world_size(self) -> int:
        return self.rank_layout.world_size

    @property
    def worker_kind(self) -> WorkerKind:
        return kind(self.worker_type)

    @property
    def start_method(self) -> str:
        return self.worker_kind.start_method(self.context, self.device)

    @property
    def joined_output(self) -> str:
        """What batches are joined as (``frameworks.joined_output``): ``output``, or torch's tensors for "auto"
        in a program that uses torch with the default collate."""
        return joined_output(self.output, self.torch_in_use, self.collate_fn is None)

    def with_context(self, multiprocessing_context: Any) -> Options:
        """These options with another ``multiprocessing_context`` (checked as at construction)."""
        context = resolve_context(multiprocessing_context, self.num_workers)
        return replace(self, context=context, multiprocessing_context=multiprocessing_context)


def resolve(dataset: Any, batch_size: Any, shuffle: Any, sampler: Any, batch_sampler: Any, num_workers: Any,
            collate_fn: Any, pin_memory: Any, drop_last: Any, timeout: Any, worker_init_fn: Any,
            multiprocessing_context: Any, generator: Any, *, prefetch_factor: Any, persistent_workers: Any,
            in_order: Any, seed: Any, device: Any, batch_transform: Any, zero_copy: Any,
            pin_memory_device: Any = "", output: Any = "auto",
            rank: Any, world_size: Any, worker_type: Any, autotune: Any, cpu_budget: Any, memory_budget: Any,
            stall_warning_s: Any = STALL_WARNING_S, on_bad_sample: Any = "raise", max_bad_samples: Any = None,
            snapshot_every_n_steps: Any = 1,
            gpus: PrefetchOps | None = None) -> Options:
    """``DataLoader``'s arguments, checked in PyTorch's order and resolved; ``gpus``: a loader's own CUDA ops."""
    seed = seed_from(seed, generator)
    if worker_type is not None:
        worker_type = check_worker_type(worker_type)
    prefetch_factor = check_int("prefetch_factor", 2 if prefetch_factor is None else prefetch_factor, ge=1)
    rank = check_int("rank", rank, optional=True)
    world_size = check_int("world_size", world_size, optional=True)
    timeout = resolve_timeout(timeout)
    stall_warning_s = check_stall(stall_warning_s)
    collate_fn = _collate_fn(collate_fn)
    for name, fn in (("worker_init_fn", worker_init_fn), ("batch_transform", batch_transform)):
        _callable_or_none(name, fn)
    in_order, zero_copy = check_bool("in_order", in_order), check_bool("zero_copy", zero_copy)
    if isinstance(num_workers, (int, np.integer)) and not isinstance(num_workers, bool) and num_workers < 0:
        raise ArgumentError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing. "
                            f"cupy_nwt: got {num_workers}; num_workers='auto' picks a count for this machine")
    auto = None if isinstance(num_workers, (int, np.integer)) else auto_request(num_workers)
    if auto is None:
        num_workers = check_int("num_workers", num_workers, ge=0, also="'auto'")
    else:
        num_workers = "auto"
    context = resolve_context(multiprocessing_context, num_workers if isinstance(num_workers, int) else 1)
    if worker_type is not None and not kind(worker_type).processes and context is not None:
        raise ArgumentError(f"multiprocessing_context applies to process workers, not worker_type={worker_type!r}")
    layout = rank_layout(rank, world_size)
    device, device_id = resolve_device(device, layout, gpus)
    check_pin_memory(pin_memory, pin_memory_device, device, stacklevel=4)
    output = check_output(output, device)
    seed_drawn = seed is None
    seed = default_seed(layout) if seed is None else seed
    if shuffle is not None and is_iter_datapipe(dataset):  # torch applies it to the pipe's shufflers
        dataset, shuffle = with_shuffle_settings(dataset, shuffle), None
    sampling = Sampling.resolve(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, seed, layout.rank,
                                layout.world_size)
    tuning = check_tuning(autotune, cpu_budget, memory_budget, num_workers=num_workers,
                          iterable=sampling.style == "iterable", default_cpus=max(1, auto_cpus(layout)) if auto is not None else None)
    why = None
    on_bad_sample, max_bad_samples = check_bad_samples(on_bad_sample, max_bad_samples, sampling.style == "iterable")
    snapshot_every_n_steps = check_int("snapshot_every_n_steps", snapshot_every_n_steps, ge=0, optional=True)
    if auto is None:
        warn_if_too_many_workers(num_workers, stacklevel=4, method=_method(worker_type, context, device),
                                 prefetch_factor=prefetch_factor)
        if tuning is not None:
            tuning = tuning.starting(num_workers, prefetch_factor)
    else:
        num_workers, tuning, worker_type, why = _auto_workers(
            dataset, sampling, prefetch_factor, pin_memory, batch_transform, worker_type,
            device if device_id is None else f"cuda:{device_id}", layout, tuning, auto.step, autotune is False)
    if tuning is not None:
        num_workers = tuning.workers
    return Options(dataset, sampling, int(num_workers), worker_type or "process", int(prefetch_factor), pin_memory,
                   collate_fn, batch_transform, worker_init_fn, bool(persistent_workers), timeout, bool(in_order),
                   bool(zero_copy), context, multiprocessing_context, pin_memory_device, output, device, device_id, layout,
                   seed, stall_warning_s, tuning, generator, seed_drawn, why, on_bad_sample, max_bad_samples,
                   uses_torch(), snapshot_every_n_steps)


def check_bad_samples(on_bad_sample: Any, max_bad_samples: Any, iterable: bool) -> tuple[str, int | None]:
    """``on_bad_sample`` ("raise" or "skip") and ``max_bad_samples`` (None or an int >= 0, with "skip").

    Skipping is for map-style datasets: a stream's iterator that raised cannot go on where it was.
    """
    if on_bad_sample not in ("raise", "skip"):
        raise ArgumentError(f"on_bad_sample must be 'raise' or 'skip', got {on_bad_sample!r}")
    limit = check_int("max_bad_samples", max_bad_samples, ge=0, optional=True)
    if limit is not None and on_bad_sample != "skip":
        raise ArgumentError("max_bad_samples limits skipped samples: it needs on_bad_sample='skip'")
    if on_bad_sample == "skip" and iterable:
        raise ArgumentError("on_bad_sample='skip' needs a map-style dataset: an iterable-style dataset's iterator "
                            "cannot go on after it raised; skip bad records inside its __iter__")
    return on_bad_sample, limit


def auto_cpus(layout: RankLayout) -> int:
    """The workers ``num_workers="auto"`` may tune up to: the rank's share of the node's CPUs
    (``ranks.worker_budget``) less one for its own main process (for a single rank the usable CPUs
    less one, ``autotune``'s default budget); 0 where the share is one CPU: the NWT rule, N workers
    and the main process would oversubscribe N CPUs, so the main process makes the batches."""
    return worker_budget(layout) - 1


def _auto_workers(dataset: Any, sampling: Sampling, prefetch_factor: int, pin_memory: bool | str,
                  batch_transform: Callable | None, worker_type: str | None, device: str, layout: RankLayout,
                  tuning: Tuning | None, step: Any = None, untuned: bool = False) -> tuple[int, Tuning | None, str, str]:
    """``num_workers="auto"``: the count, the tuning, the worker type, and why.

    A hit is the saved pick (where ``autotune``'s tuning starts, if given). A miss is online tuning (the
    ``autotune`` given, else the default policy within ``auto_cpus``) from ``starting_workers``, which
    saves the count it settles at; with no CPU to spare, 0 workers. ``untuned`` (``autotune=False`` said,
    not left to its default): a miss runs the starting count as given, neither tuned nor saved."""
    if not sampling.own or sampling.batch_size is None:
        raise ArgumentError("num_workers='auto' tunes on a map-style dataset batched by the loader itself "
                         "(no sampler, batch_sampler or batch_size=None); give a number")
    fp = auto_fingerprint(dataset, batch_size=sampling.batch_size, prefetch_factor=prefetch_factor,
                          pin_memory=pin_memory, device=device, batch_transform=batch_transform, layout=layout,
                          step=step)
    hit = saved_pick(fp, worker_type=worker_type)
    if hit is not None:
        tuning = tuning.starting(hit.workers, prefetch_factor) if tuning is not None else None
        return hit.workers, tuning, hit.worker_type, hit.why or f"the saved pick, {hit.workers} workers"
    if tuning is None:
        cpus = auto_cpus(layout)
        if cpus < 1 or untuned:
            start = starting_workers(cpus) if cpus >= 1 else 0
            return start, None, worker_type or "process", missing(fp, start, cpus, tunes=False)
        tuning = check_tuning(True, None, None, num_workers="auto", iterable=False, default_cpus=cpus)
        assert tuning is not None
    start, chosen = starting_workers(tuning.budget.cpus), worker_type or "process"
    why = missing(fp, start, tuning.budget.cpus)
    saves = OnlinePick(fp, int(sampling.batch_size), int(prefetch_factor), pin_memory, chosen)
    tuning = tuning.starting(start, prefetch_factor, saves)
    return tuning.workers, tuning, chosen, why


def default_seed(layout: RankLayout) -> int:
    """``seed=None``'s seed: fresh for one process, drawn from torch's global generator where torch is imported
    (as torch draws its base seed), else from the OS; on several ranks 0 (``ranks_default_seed``), as
    DistributedSampler's default, the same on every rank without asking the others (a collective here would
    hang a loader made on one rank alone, such as rank 0's validation set)."""
    if layout.is_distributed:
        return ranks_default_seed()
    drawn = torch_global_seed()
    return fresh_seed() if drawn is None else drawn


def following_group(options: Options) -> Options:
    """``options`` with the rank layout of a ``torch.distributed`` group initialised after the loader was made
    (a loader built before ``Trainer.fit`` launched the ranks), unless ``rank``/``world_size`` were given. A
    drawn seed then becomes what every rank uses (``ranks_default_seed``)."""
    if options.rank_layout.launcher == "explicit":
        return options
    group = process_group_layout()
    if group is None or (group.rank, group.world_size) == (options.rank, options.world_size):
        return options
    _log.info("the loader was made as rank %d of %d; torch.distributed now says rank %d of %d: sharding by it",
              options.rank, options.world_size, group.rank, group.world_size)
    followed = changed(options, "rank_layout", group)
    return replace(changed(followed, "seed", ranks_default_seed()), seed_drawn=True) if options.seed_drawn else followed


def ranks_default_seed() -> int:
    """``seed=None``'s seed on several ranks: 0, DistributedSampler's default."""
    return 0


def resolve_context(multiprocessing_context: Any, num_workers: int) -> BaseContext | None:
    """The context the workers start from: None for the loader's default, else a context object.

    ``multiprocessing_context`` takes a start method's name or a context, and only with workers (a
    ValueError otherwise, as in PyTorch).
    """
    if multiprocessing_context is None:
        return None
    if num_workers == 0:
        raise ArgumentError("multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                         f"but got num_workers={num_workers}")
    if isinstance(multiprocessing_context, str):
        methods = mp.get_all_start_methods()
        if multiprocessing_context not in methods:
            raise ArgumentError(f"multiprocessing_context option should specify a valid start method in {methods!r}, "
                             f"but got multiprocessing_context={multiprocessing_context!r}")
        return mp.get_context(multiprocessing_context)
    if not isinstance(multiprocessing_context, BaseContext):
        raise ArgumentTypeError("multiprocessing_context option should be a valid context object or a string specifying "
                        f"the start method, but got multiprocessing_context={multiprocessing_context!r}")
    return multiprocessing_context


def _method(worker_type: str | None, context: BaseContext | None, device: str) -> str:
    """How the workers will start: ``"thread"``, or a process start method."""
    chosen = kind(worker_type or "process")
    return chosen.start_method(context, device) if chosen.processes else "thread"


def check_worker_room(num_workers: int, *, worker_type: str = "process", device: str = "cpu", prefetch_factor: int = 2,
                      option: str = "num_workers", value: int | None = None) -> None:
    """``ArgumentError`` (``capacity.check_worker_count``) when ``num_workers`` of ``worker_type`` are more than this
    machine can hold, checked as the loader checks its own count: only past the usable CPUs (reading every
    limit costs a scan of /proc). ``option=value`` names what the caller asked for (the tuner's ``max_workers``)."""
    if num_workers > system.usable_cpus():
        check_worker_count(num_workers, _method(worker_type, None, device), prefetch_factor, option=option, value=value)


def warn_if_too_many_workers(num_workers: int, stacklevel: int = 3, *, method: str = "fork",
                             prefetch_factor: int = 2) -> None:
    """A UserWarning, as PyTorch gives (its sentence first: filters match it), when there are more workers than CPUs
    this process may use; what this machine can hold is added only when the count comes near it (half or more).
    ``ArgumentError`` (``capacity.check_worker_count``) when the machine cannot hold them."""
    cpus = system.usable_cpus()
    if num_workers > cpus:
        room = check_worker_count(num_workers, method, prefetch_factor)
        near = f"; {room.line}" if 2 * num_workers >= room.workers else ""
        kind = "threads" if method == "thread" else "processes"
        warnings.warn(f"This DataLoader will create {num_workers} worker processes in total. Our suggested max number "
                      f"of worker in current system is {cpus}, which is smaller than what this DataLoader is going to "
                      "create. Please be aware that excessive worker creation might get DataLoader running slow or "
                      "even freeze, lower the worker number to avoid potential slowness/freeze if necessary. "
                      f"cupy_nwt: its {num_workers} worker {kind} will share the {cpus} CPUs this process may use, "
                      f"which is slower and may stall; num_workers={cpus} or fewer avoids that{near}",
                      UserWarning, stacklevel=stacklevel)


def resolve_timeout(timeout: Any) -> float | None:
    """Seconds to wait for a batch, or None for no limit (``timeout=0``, PyTorch's default, or None)."""
    value = check_number("timeout", timeout, optional=True, unit="seconds")
    if value is not None and value < 0:
        raise ArgumentError(f"timeout option should be non-negative, got timeout={value:g}")  # torch's words
    return value or None


def seed_from(seed: Any, generator: Any) -> int | None:
    """The loader's seed from ``seed`` or ``generator``: an int, or a NumPy or torch Generator drawn from
    once, here (torch draws its base seed from it per iteration: the same generator state gives the
    same seed, so the same epochs; the epoch order itself is this loader's, not ``torch.randperm``'s)."""
    seed = check_int("seed", seed, ge=0, optional=True)
    if generator is None:
        return seed
    if seed is not None:
        raise ArgumentError("give seed or generator, not both")
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 2**63 - 1))
    drawn = generator_seed(generator)
    if drawn is not None:
        return drawn
    return check_int("generator", generator, ge=0, also="a numpy.random.Generator or a torch.Generator")


PIN_WITHOUT_GPU = ("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                   "won't be used.")  # torch's words, so a filter written for torch's warning catches ours


def check_pin_value(pin_memory: Any) -> bool | str:
    """``pin_memory`` alone: True, False or "staging" (what the tuner checks before any trial)."""
    if pin_memory not in (True, False, "staging"):
        raise ArgumentError(f"pin_memory must be True, False or 'staging', got {pin_memory!r}")
    return pin_memory if isinstance(pin_memory, str) else bool(pin_memory)


def check_pin_memory(pin_memory: Any, pin_memory_device: Any, device: str, stacklevel: int = 3) -> None:
    """``pin_memory`` and torch's ``pin_memory_device``, with torch's warnings: pinning without a GPU
    does nothing; ``pin_memory_device`` is ignored (the loader pins for its ``device``)."""
    check_pin_value(pin_memory)
    if not isinstance(pin_memory_device, str):
        raise ArgumentError(f"pin_memory_device must be a str, got {type(pin_memory_device).__name__}")
    if pin_memory and pin_memory_device:
        warnings.warn(f"pin_memory_device is ignored (as torch ignores it): memory is pinned for device={device!r}; "
                      f"ignore pin_memory_device={pin_memory_device!r}.", UserWarning, stacklevel=stacklevel)
    if pin_memory and device == "cpu":
        warnings.warn(PIN_WITHOUT_GPU, UserWarning, stacklevel=stacklevel)


def _callable_or_none(name: str, fn: Any) -> Any:
    if fn is not None and not callable(fn):
        raise ArgumentTypeError(f"{name} must be callable or None, got {type(fn).__name__}")
    return fn


def _collate_fn(fn: Any) -> Any:
    """A ``collate_fn``, checked; ``default_collate`` given by name (``loader.collate_fn`` reads it back, as
    torch's does) is the default, so workers keep collating straight into the ring."""
    fn = _callable_or_none("collate_fn", fn)
    return None if fn is default_collate or fn is torch_default_collate else fn


def changed(options: Options, name: str, value: Any, gpus: PrefetchOps | None = None) -> Options:
    """``options`` with ``name`` set to ``value``, through the same checks the constructor runs; they raise
    before anything is built, so a refused value leaves the caller's options as they were."""
    o = options
    if name == "num_workers":
        n = check_int("num_workers", value, ge=0)
        warn_if_too_many_workers(n, stacklevel=4, method=_method(o.worker_type, o.context, o.device),
                                 prefetch_factor=o.prefetch_factor)
        return replace(o, num_workers=n)
    if name == "worker_type":
        worker_type = check_worker_type(value)
        if not kind(worker_type).processes and o.context is not None:
            raise ArgumentError(f"multiprocessing_context applies to process workers, not worker_type={worker_type!r}")
        return replace(o, worker_type=worker_type)
    if name == "prefetch_factor":
        return replace(o, prefetch_factor=check_int("prefetch_factor", value, ge=1))
    if name == "pin_memory":
        check_pin_memory(value, o.pin_memory_device, o.device, stacklevel=4)
        return replace(o, pin_memory=value)
    if name == "pin_memory_device":
        check_pin_memory(o.pin_memory, value, o.device, stacklevel=4)
        return replace(o, pin_memory_device=value)
    if name == "collate_fn":
        return replace(o, collate_fn=_collate_fn(value))
    if name in ("batch_transform", "worker_init_fn"):
        return replace(o, **{name: _callable_or_none(name, value)})
    if name == "timeout":
        return replace(o, timeout=resolve_timeout(value))
    if name == "in_order":
        return replace(o, in_order=check_bool(name, value))
    if name == "zero_copy":
        return replace(o, zero_copy=check_bool(name, value))
    if name in ("device", "device_id"):
        given = value if name == "device" else ("cpu" if value is None else f"cuda:{check_int('device_id', value, ge=0)}")
        device, device_id = resolve_device(given, o.rank_layout, gpus)
        check_pin_memory(o.pin_memory, o.pin_memory_device, device, stacklevel=4)
        return replace(o, device=device, device_id=device_id, output=check_output(o.output, device))
    if name == "output":
        return replace(o, output=check_output(value, o.device))
    if name == "seed":
        seed = check_int("seed", value, ge=0)
        return replace(o, seed=seed, sampling=replace(o.sampling, seed=seed), seed_drawn=False)
    if name == "generator":  # drawn from once, now, as the constructor draws from it; None draws afresh
        drawn = seed_from(None, value)
        seed = default_seed(o.rank_layout) if drawn is None else drawn
        return replace(o, seed=seed, sampling=replace(o.sampling, seed=seed), seed_drawn=drawn is None, generator=value)
    if name == "stall_warning_s":
        return replace(o, stall_warning_s=check_stall(value))
    if name == "rank_layout":
        if not isinstance(value, RankLayout):
            raise ArgumentTypeError(f"rank_layout must be a RankLayout, got {type(value).__name__}")
        return replace(o, rank_layout=value, sampling=replace(o.sampling, rank=value.rank, world_size=value.world_size))
    raise ArgumentError(f"{name} cannot be set after the DataLoader is made")
