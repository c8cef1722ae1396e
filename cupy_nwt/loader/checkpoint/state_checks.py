"""Every field of a saved loader state checked before ``load_state_dict`` trusts it.

A state comes back from disk, a checkpoint or another rank: it may be damaged, edited by hand, of
another loader or another version. Used unchecked, a bad field surfaces later, deep inside, as the
wrong exception or as a silently wrong epoch (a negative count, a batch past the epoch's end, a
rank that does not exist). So each field is checked for its type (an int is an int, not a bool or
a string), its range against the dataset, the batch settings and the rank layout, and the keys
against the kind's exact set. The first bad field raises one ``StateError`` (a ``ValueError`` and a
``CupyNwtError``) naming the field and its value; nothing of the loader has changed by then.

What each field means: ``resume``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from numbers import Integral
from typing import TYPE_CHECKING, Any, NoReturn

from ...data.contract import map_length
from ...errors import StateError
from ...ranks import MAX_WORLD_SIZE
from ..plan.remainder import Session
from .sampler_randomness import check_randomness, warn_unrecorded

if TYPE_CHECKING:
    from .._options import Options

STATE_VERSION = 2  # 2: every kind saves its readers' own states (``workers``); a version 1 state is read too
_HEAD = ("version", "kind", "epoch", "seed", "rank", "world_size", "workers")
KEYS = {
    "map": frozenset((*_HEAD, "n", "batch_size", "shuffle", "drop_last", "base", "excluded", "delivered", "extra")),
    "sampler": frozenset((*_HEAD, "delivered", "extra", "sampler_state")),
    "iterable": frozenset((*_HEAD, "next_task", "next_worker")),
}
READER_KEYS = frozenset({"batches", "dataset", "iterator", "ended"})
_BATCHING = frozenset({"batch_size", "drop_last"})  # a user sampler's and a stream's: optional, states saved before
_OPTIONAL = {"map": frozenset({"ranks"}), "sampler": _BATCHING | {"sampler_resume", "sampler_randomness", "sampler_epoch"}, "iterable": _BATCHING}  # them load as they did


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refuse(field: str, value: Any, why: str) -> NoReturn:
    raise StateError(f"load_state_dict: {field}={_show(value)}: {why}", field, value)


def _int(field: str, value: Any, lo: int | None = 0, hi: int | None = None, why_hi: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        refuse(field, value, f"expected an integer, got {type(value).__name__}")
    v = int(value)
    if lo is not None and v < lo:
        refuse(field, value, f"must be >= {lo}")
    if hi is not None and v > hi:
        refuse(field, value, f"must be <= {hi}" + (f" ({why_hi})" if why_hi else ""))
    return v


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        refuse(field, value, f"expected true or false, got {type(value).__name__}")
    return value


def _ascending(field: str, value: Any, lo: int, hi: int, why: str) -> list[int]:
    """A list of distinct ints, ascending, each in [lo, hi)."""
    if not isinstance(value, list):
        refuse(field, value, f"expected a list of integers, got {type(value).__name__}")
    out: list[int] = []
    for i, x in enumerate(value):
        v = _int(f"{field}[{i}]", x, lo, hi - 1, why)
        if out and v <= out[-1]:
            refuse(f"{field}[{i}]", x, "the list must be ascending, without repeats")
        out.append(v)
    return out


def _mapping(field: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        refuse(field, value, f"expected a dict, got {type(value).__name__}")
    return value


def _keys(field: str, sd: Mapping[str, Any], required: frozenset[str], optional: frozenset[str] = frozenset()) -> None:
    missing = sorted(required - set(sd))
    if missing:
        refuse(f"{field}{missing[0]}" if field else missing[0], None, "missing")
    unknown = sorted((str(k) for k in set(sd) - required - optional), key=str)
    if unknown:
        refuse(f"{field}{unknown[0]}", sd[unknown[0]] if unknown[0] in sd else None,
               "not a field of this kind of state (a state of another loader or version?)")


def _head(sd: Mapping[str, Any], merged: bool = False) -> tuple[int, int | None]:
    """The fields every state has; (its world size, its rank)."""
    version = sd["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        refuse("version", version, f"not a cupy_nwt loader state of version {STATE_VERSION}")
    _readers(sd["workers"])
    _int("epoch", sd["epoch"])
    _int("seed", sd["seed"])
    world = _int("world_size", sd["world_size"], 1, MAX_WORLD_SIZE, "more ranks than any job runs")
    if merged and sd["rank"] is None:
        return world, None
    rank = _int("rank", sd["rank"], 0, world - 1, f"a rank of world_size {world}")
    return world, rank


def checked_state(options: Options, state: Any, kind: str) -> dict[str, Any]:
    """A copy of ``state`` that this loader (of ``kind``) can resume from; ``StateError`` naming the first bad field."""
    if not isinstance(state, Mapping):
        refuse("state", state, f"expected the dict state_dict() returned, got {type(state).__name__}")
    if not state:
        refuse("state", state, "empty, so not a loader state (a checkpoint without the loader's entry? then "
               "skip load_state_dict: a loader that loads nothing starts where it is)")
    state = _upgraded(state)
    if "version" not in state or isinstance(state["version"], bool) or state["version"] != STATE_VERSION:
        refuse("version", state.get("version"), f"not a cupy_nwt loader state of version {STATE_VERSION}")
    if state.get("kind") != kind:
        refuse("kind", state.get("kind"), f"the state is of a {state.get('kind')!r} loader, this one is {kind!r}")
    _keys("", state, KEYS[kind], _OPTIONAL[kind])
    if kind == "map":
        _check_map(options, state)
    elif kind == "sampler":
        _check_sampler(options, state)
    else:
        _check_stream(options, state)
    return copy.deepcopy(dict(state))


def _upgraded(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A version 1 state as version 2 says it: no readers' states (map and sampler kinds), a stream's per-worker
    ``state`` split into the dataset's and its iterator's. Anything else is returned as it is, to be checked."""
    if state.get("version") != 1 or isinstance(state.get("version"), bool) or state.get("kind") not in KEYS:
        return state
    out = {**state, "version": STATE_VERSION}
    if state.get("kind") != "iterable":
        out.setdefault("workers", [None])
        return out
    workers = state.get("workers")
    if isinstance(workers, list):
        out["workers"] = [_v1_reader(p) for p in workers]
    return out


def _v1_reader(p: Any) -> Any:
    if not isinstance(p, Mapping) or set(p) != {"batches", "state"}:
        return p
    saved = p["state"]
    tagged = isinstance(saved, Mapping) and set(saved) == {"cupy_nwt.iterator_state"}
    return {"batches": p["batches"], "dataset": None if tagged else saved,
            "iterator": saved["cupy_nwt.iterator_state"] if tagged else None, "ended": False}


def _readers(workers: Any) -> None:
    """The per-reader entries: a non-empty list of None or ``{"batches", "dataset", "iterator", "ended"}``."""
    if not isinstance(workers, list) or not workers:
        refuse("workers", workers, "expected a non-empty list, one entry (or null) per reader")
    for w, p in enumerate(workers):
        if p is None:
            continue
        p = _mapping(f"workers[{w}]", p)
        _keys(f"workers[{w}].", p, READER_KEYS)
        _int(f"workers[{w}].batches", p["batches"])
        _bool(f"workers[{w}].ended", p["ended"])


def _check_map(options: Options, sd: Mapping[str, Any]) -> None:
    merged = sd.get("ranks") is not None
    world, rank = _head(sd, merged)
    s = options.sampling
    mine = {"seed": options.seed, "n": map_length(options.dataset, "load_state_dict"), "batch_size": s.batch_size or 1,
            "shuffle": s.shuffle, "drop_last": s.drop_last}
    for key in ("n", "batch_size"):
        _int(key, sd[key], 1 if key == "batch_size" else 0)
    for key in ("shuffle", "drop_last"):
        _bool(key, sd[key])
    for key, value in mine.items():
        if sd[key] != value:
            refuse(key, sd[key], f"the state was saved with other settings (this loader: {key}={value!r})")
    n = int(sd["n"])
    base = _int("base", sd["base"], 0, n, "the dataset's length")
    excluded = _ascending("excluded", sd["excluded"], base, n, "positions past base, inside the dataset")
    session = Session(n, int(sd["batch_size"]), sd["shuffle"], int(sd["seed"]), int(sd["epoch"]), sd["drop_last"],
                      world, base, tuple(excluded))
    if merged:
        ranks = sd["ranks"]
        if not isinstance(ranks, list) or len(ranks) != world:
            refuse("ranks", ranks, f"expected a list of {world} per-rank progress dicts (one per rank)")
        for r, p in enumerate(ranks):
            p = _mapping(f"ranks[{r}]", p)
            _keys(f"ranks[{r}].", p, frozenset({"delivered", "extra"}))
            _progress(f"ranks[{r}].", p["delivered"], p["extra"], session.batches(r))
        _int("delivered", sd["delivered"], 0, session.batches(0))
        if sd["extra"] != []:
            refuse("extra", sd["extra"], "a merged state keeps its progress in ranks")
        return
    assert rank is not None
    _progress("", sd["delivered"], sd["extra"], session.batches(rank))
    if sd["extra"] and (options.world_size != world or options.rank != rank):
        refuse("extra", sd["extra"], "this rank's state has batches delivered out of order, so the other ranks' "
               "progress cannot be inferred from it: pass merge_states([...every rank's state])")


def _progress(prefix: str, delivered: Any, extra: Any, batches: int) -> None:
    """``delivered`` (a prefix count) and ``extra`` (batches beyond it) within ``batches`` batches."""
    k = _int(f"{prefix}delivered", delivered, 0, batches, f"this epoch's rest has {batches} batches")
    if k == batches and isinstance(extra, list) and extra:
        refuse(f"{prefix}extra", extra, "every batch is already counted as delivered")
    _ascending(f"{prefix}extra", extra, k + 1, batches, f"batches after delivered={k} of {batches}")


def _batching(options: Options, sd: Mapping[str, Any]) -> None:
    """A user sampler's or a stream's delivered batches count in its batch size: under another they would
    skip or repeat samples, so another batching is refused (as a map state's is)."""
    if "batch_size" in sd and sd["batch_size"] is not None:
        _int("batch_size", sd["batch_size"], 1)
    if "drop_last" in sd:
        _bool("drop_last", sd["drop_last"])
    s = options.sampling
    for key, value in (("batch_size", s.batch_size), ("drop_last", s.drop_last)):
        if key in sd and sd[key] != value:
            refuse(key, sd[key], f"the state was saved with other settings (this loader: {key}={value!r}); its "
                   "delivered batches were counted in those")


def _check_sampler(options: Options, sd: Mapping[str, Any]) -> None:
    """A user sampler's delivered batches are of that rank's sampler (a ``DistributedSampler`` shards by the
    ranks): on another world size the same count would skip other samples, so it is refused, as a stream's is;
    batches delivered out of order are that rank's own."""
    world, rank = _head(sd)
    if world != options.world_size:
        refuse("world_size", world, f"a user sampler's delivered batches were counted on {world} rank(s), this "
               f"loader runs on {options.world_size}: its sampler deals other batches, so the same count would "
               "skip other samples (resume on the same ranks, or leave sampler= out: the loader's own order "
               "re-shards its rest)")
    _batching(options, sd)
    try:
        batches: int | None = options.sampling.length(options.dataset)
    except TypeError:  # a sampler without a length: only the lower bounds hold
        batches = None
    limit = batches if batches is not None else 1 << 62
    why = f"the sampler gives {batches} batches" if batches is not None else ""
    k = _int("delivered", sd["delivered"], 0, limit, why)
    _ascending("extra", sd["extra"], k + 1, limit, why or f"batches after delivered={k}")
    if sd["extra"] and rank != options.rank:
        refuse("extra", sd["extra"], f"rank {rank}'s batches delivered out of order (this loader is rank "
               f"{options.rank}): load each rank's own state")
    position = sd.get("sampler_resume")
    if position is not None:
        if not isinstance(position, Mapping) or not position or set(position) - {"sampler", "iterator"}:
            refuse("sampler_resume", position, 'expected null or a dict of "sampler" and/or "iterator" states')
        if k == 0 and set(position) != {"iterator"}:
            refuse("sampler_resume", position, "before a delivered batch (delivered=0) a sampler's position is "
                   "its previous iteration's iterator state only")
    check_randomness(options.sampling.batch_sampler or options.sampling.sampler, sd.get("sampler_randomness"))
    if sd.get("sampler_epoch") is not None:
        _int("sampler_epoch", sd["sampler_epoch"], 0, None)
    if (k or sd["extra"]) and position is None and "sampler_randomness" not in sd:
        warn_unrecorded(options.sampling.batch_sampler or options.sampling.sampler)


def _check_stream(options: Options, sd: Mapping[str, Any]) -> None:
    world, rank = _head(sd)
    _batching(options, sd)
    workers = sd["workers"]
    total = sum(int(p["batches"]) for p in workers if p is not None)
    readers = max(1, options.num_workers)
    if any(p is not None for p in workers):
        if len(workers) != readers:
            refuse("workers", f"{len(workers)} worker(s)", f"an iterable dataset resumes only with the same layout "
                   f"of workers and ranks (this loader: {readers} worker(s))")
        if world != options.world_size:
            refuse("world_size", world, f"an iterable dataset resumes only with the same layout of workers and "
                   f"ranks (this loader: {options.world_size} rank(s))")
        if rank != options.rank:
            refuse("rank", rank, f"this is another rank's stream state (this loader is rank {options.rank})")
    _int("next_task", sd["next_task"], total, None)
    if sd["next_worker"] is not None:
        _int("next_worker", sd["next_worker"], 0, len(workers) - 1, f"{len(workers)} worker(s)")

