"""Each reader's own state in a saved loader state: what the dataset (and a stream's iterator) keep themselves.

A reader is a worker, or the main process with ``num_workers=0`` (thread workers sharing one map-style
dataset are one reader too: they read one object). Its entry in a state's ``workers`` list is None (nothing of
its own to save: it starts from the dataset as the loader has it) or ``{"batches", "dataset", "iterator",
"ended"}``: the batches of this epoch it delivered, the ``state_dict()`` of its dataset copy and of its
stream's iterator (each None when that object keeps no state: both ``state_dict`` and ``load_state_dict``, as
torchdata's ``Stateful``), and whether its stream had run out (the next epoch then opens afresh from there).

When the entry is taken, for the state to resume exactly what an uninterrupted run gives next:

* mid-epoch: as of the reader's last batch *delivered to the caller* (its worker may have made more), or as
  the epoch began for a reader that delivered none yet;
* before an epoch's first batch and between epochs: the main process's dataset (and its stream's iterator,
  opened for it once ``iter()`` was called, as torchdata's exists from ``iter()`` on) as they are now; a
  persistent worker's as it left the previous epoch; None for workers that start afresh from the dataset
  (as the uninterrupted run's workers do), and for a stream of a loader not iterated yet.

On resume each entry is loaded into its reader before that reader's first sample, in torchdata's order: a
map-style dataset's ``load_state_dict()`` before its first ``__getitem__``; a stream's dataset
``load_state_dict()``, then ``iter()``, then the iterator's ``load_state_dict()``. A stream's ``set_epoch`` comes
before the dataset's state, or after it for an entry that holds no batch of the epoch (taken before that epoch
began), as in the uninterrupted run. A stream whose reader saved nothing is fast-forwarded by its delivered
batches instead, each delivered turn pulled again (a failed one too, its error not raised again).

Per-reader states cannot be merged: they resume only with the same readers. A stream's state is refused
under another layout (``state_checks``); a map-style one keeps its elastic sample order under another worker
count or world size, and the dataset states are dropped with a one-line warning (``fit_readers``).
A state is kept small: each dataset state must pickle, and together they stay under ``MAX_STATE_BYTES``
pickled, or ``state_dict()`` refuses in one line.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...data.contract import epoch_setter
from ...errors import StateError
from .._runtime import batch_maker
from ..workers.messages import ErrorReport
from ..workers.serve import reader_state_or_error
from ..workers.torch_workers import is_iter_datapipe, pipe_seed

if TYPE_CHECKING:
    from .._options import Options
    from .ledger import EpochProgress

MAX_STATE_BYTES = 64 << 20  # the dataset states of one loader state, pickled: a checkpoint, not a data store
Entry = dict[str, Any] | None  # (an ErrorReport stands in for one whose state_dict() failed, until it is saved)
RestorePlan = dict[int, tuple[Any, int, int | None, int | None]]  # reader -> a ``messages.Restore``'s fields: its entry,
# batches to skip, the epoch to tell it, a torch IterDataPipe's shuffle seed


def reader_count(options: Options) -> int:
    """How many readers hold a state of their own: the workers, or one (the main process; threads sharing
    one map-style dataset)."""
    return 1 if options.num_workers == 0 or shared_reader(options) else options.num_workers


def shared_reader(options: Options) -> bool:
    """Do the workers read one dataset object (thread workers, map-style)? Their states are then reader 0's,
    restored in the main process. One process worker is not that: it reads its own copy, as two do."""
    return options.num_workers > 0 and options.worker_type == "thread" and options.sampling.style != "iterable"


def entry(batches: int, state: Any) -> Entry | ErrorReport:
    """A reader's entry from the ``BatchMaker.reader_state()`` it reported (None: nothing of its own); the
    error its ``state_dict()`` raised stays as it is, for ``check_saveable`` to raise when a state is saved."""
    if isinstance(state, ErrorReport):
        return state
    if state is None:
        return {"batches": batches, "dataset": None, "iterator": None, "ended": False} if batches else None
    return {"batches": batches, "dataset": state["dataset"], "iterator": state["iterator"], "ended": state["ended"]}


def where(options: Options, w: int) -> str:
    return "the main process" if options.num_workers == 0 else f"worker {w}"


def delivered(options: Options, progress: EpochProgress) -> tuple[list[Any], int | None]:
    """Each reader's entry as of its last delivered batch (as the epoch began for one that delivered none),
    and the worker that made the last one delivered."""
    per = _base(options, progress.readers)
    if progress.streams is None:
        return per, None
    states, counts, last = progress.streams
    for w in sorted(set(states) | set(counts)):
        old = per[w]
        per[w] = entry((old["batches"] if isinstance(old, dict) else 0) + counts[w], states.get(w))
    return per, last


def carried(options: Options, progress: EpochProgress | None) -> list[Any]:
    """The readers' entries an epoch that has not begun starts from: the main process's as they are now; each
    persistent worker's as it left the epoch before (the state it sent last); None for workers that start
    afresh from the dataset."""
    n = reader_count(options)
    if options.num_workers == 0:
        if progress is not None and progress.live is not None:
            return [entry(0, progress.live())]
        if options.sampling.style != "iterable":  # not iterated yet: the dataset as it is
            return [entry(0, reader_state_or_error(batch_maker(options)))]
        return [None]
    if progress is None or not options.persistent_workers:
        return [None] * n
    per = _base(options, progress.readers)
    for w, state in progress.latest.items():
        if w < n:
            per[w] = entry(0, state)
    return [_unbegun(p) for p in per]


def _unbegun(p: Any) -> Any:
    """An entry as a new epoch begins: no batch of it delivered yet (a worker that sent nothing in the epoch
    before still holds the count it started that one with); None where nothing else is left."""
    if not isinstance(p, dict):
        return p
    if p["dataset"] is None and p["iterator"] is None:
        return None
    return {**p, "batches": 0}


def _base(options: Options, readers: Any) -> list[Any]:
    n = reader_count(options)
    per = [dict(p) if isinstance(p, dict) else p for p in readers] if readers is not None else []
    return per + [None] * (n - len(per)) if len(per) < n else per


def restore_plan(options: Options, epoch: int, readers: Any) -> RestorePlan:
    """How each reader is prepared before its first sample: its entry (a stream without one fast-forwarded by
    its delivered batches), and the epoch for a stream whose dataset has ``set_epoch`` (every worker's copy:
    persistent workers' copies reshuffle too, as WebDataset's per-epoch shuffle expects), with a torch
    ``IterDataPipe``'s shuffle seed."""
    stream = options.sampling.style == "iterable"
    piped = stream and is_iter_datapipe(options.dataset)
    tell = epoch if stream and (epoch_setter(options.dataset) is not None or piped) else None
    shared = pipe_seed(options.seed, epoch, options.seed_drawn) if piped else None
    plan: RestorePlan = {w: (None, 0, tell, shared) for w in range(reader_count(options))} if tell is not None else {}
    for w, p in enumerate(readers or []):
        if not isinstance(p, dict):
            continue
        own = p["dataset"] is not None or p["iterator"] is not None
        plan[w] = (p if own else None, 0 if own or not stream else int(p["batches"]), tell, shared)
    return plan


def check_saveable(options: Options, readers: list[Any]) -> None:
    """Each reader's states pickle, and all of them together stay under ``MAX_STATE_BYTES``; else one line."""
    total = 0
    for w, p in enumerate(readers):
        if isinstance(p, ErrorReport):
            if p.exc_type == "PicklingError":  # state_dict() answered; what it gave could not leave the worker
                raise StateError(f"state_dict: the state of {where(options, w)} does not pickle, so no checkpoint "
                                 f"could hold it: {p.message} (iteration is unaffected)")
            raise StateError(f"state_dict: the dataset's state_dict() failed in {where(options, w)}: {p.exc_type}: "
                             f"{p.message} (iteration is unaffected)")
        for key in ("dataset", "iterator"):
            if p is None or p[key] is None:
                continue
            try:
                total += len(pickle.dumps(p[key], protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:  # noqa: BLE001 - any reason a checkpoint could not hold it
                raise StateError(f"state_dict: the {key} state of {where(options, w)} does not pickle, so no "
                                 f"checkpoint could hold it: {type(exc).__name__}: {exc}") from None
    if total > MAX_STATE_BYTES:
        raise StateError(f"state_dict: the dataset states take {total / 2**20:.1f} MiB pickled, over the "
                         f"{MAX_STATE_BYTES >> 20} MiB limit of a loader state: save a position and a seed, not data")


def fit_readers(options: Options, state: Mapping[str, Any]) -> dict[str, Any]:
    """A map-style state for this loader's readers: under another worker count, world size or rank its dataset
    states are dropped with a one-line warning (the sample order still resumes exactly: it does not depend on
    the workers); per-worker states cannot be merged."""
    out = dict(state)
    per = out.get("workers") or []
    n = reader_count(options)
    kept = [p for p in per if p is not None and (p["dataset"] is not None or p["iterator"] is not None)]
    same = len(per) == n and out.get("world_size") == options.world_size and out.get("rank") == options.rank
    if kept and not same:
        warnings.warn(f"load_state_dict: the state holds the dataset's own state_dict() of {len(per)} reader(s) of "
                      f"rank {out.get('rank')} of {out.get('world_size')}; this loader has {n} of rank {options.rank} "
                      f"of {options.world_size}: the sample order resumes exactly, each reader's dataset starts "
                      f"from its own state (per-worker states cannot be merged)", UserWarning, stacklevel=3)
    out["workers"] = per if same else [None] * n
    return out

