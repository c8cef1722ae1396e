"""Mid-epoch state of a loader: what ``state_dict()`` saves, what ``load_state_dict()`` resumes from.

A state counts only batches *delivered to the caller* (the epoch iterator's turns, failed batches
included): batches the workers made ahead are not consumed. It is a small JSON-ready dict, by kind:

* ``"map"`` (the loader's own sampler): the epoch, the settings the order depends on, the session
  (``remainder``: ``world_size``, ``base``, ``excluded``), this ``rank`` and the batches it delivered
  (``delivered``, a prefix count, plus ``extra``: the few beyond it that ``in_order=False`` gave).
  No per-sample list. Worker count, prefetch and persistence play no part: the rest of the epoch
  is the same with any of them.
* ``"sampler"`` (a user's ``sampler`` or ``batch_sampler``): the batching (``batch_size``, ``drop_last``),
  the batches delivered, the sampler's own ``state_dict()`` as it was when the epoch began
  (``sampler_state``, if it has one) and, for a sampler whose state is its position, its state and its
  iterator's right after the delivered batches were drawn (``sampler_resume``, else None; between epochs, where
  only the iterator keeps a state, the previous iteration's, which the next follows). On resume the
  sampler goes on from its position, or its epoch is drawn again from ``sampler_state`` and the
  delivered batches are skipped (``user_sampler``; a sampler without state must give the same order
  again, e.g. seeded by epoch). It resumes on the same world size only: a rank's sampler deals that
  rank's batches.
* ``"iterable"``: the batching, where the next task goes (``next_task``, ``next_worker``); each worker's stream is in
  ``workers`` (below). It resumes with the same number of workers (0 and 1 count alike) and ranks only.

Every kind also saves ``workers``: per reader (a worker, or the main process), the state of its own that
the dataset and a stream's iterator keep (``state_dict()``), or, for a stream without one, how many
batches it delivered (re-read and skipped on resume); what each entry holds and when it is taken:
``readers``.

Elastic resume (map kind): a loader of another ``world_size`` takes the union of what every old
rank delivered and re-shards the rest over its own ranks (``Session.after``). Each new rank loads
either any old rank's state, when all old ranks delivered the same batches in order (a DDP loop in
lockstep), or the output of ``merge_states`` over every old rank's state. Each new rank plugs in
its own ``rank`` and ``world_size``. A re-sharded rest repeats no delivered sample and keeps the
ranks balanced by DistributedSampler's rules (padded with up to ``world_size - 1`` samples of the rest,
or with ``drop_last`` its tail left out); its transform seeds differ from the uninterrupted run's (only a
same-world-size resume is bitwise the uninterrupted run).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...data.contract import map_length
from ...errors import ArgumentError
from ..plan.order import StreamPlan
from ..plan.remainder import Session, SessionPlan, join_done, split_done
from .ledger import EpochProgress, Ledger
from .readers import check_saveable, delivered, entry, fit_readers, reader_count
from .sampler_randomness import Randomness, epoch_owner, stateful
from .state_checks import STATE_VERSION, checked_state
from .user_sampler import Draws, UserSamplerPlan, copied, load_into

if TYPE_CHECKING:
    from .._options import Options

_MATCH = ("seed", "n", "batch_size", "shuffle", "drop_last")


@dataclass(frozen=True, eq=False)
class _StreamRest(StreamPlan):
    """A stream's epoch from task ``first`` on (tasks renumbered 0..; seeds those of the original tasks)."""

    first: int = 0

    def transform_seed(self, b: int) -> int:
        return super().transform_seed(b + self.first)

    def number(self, task: int) -> int:
        return task + self.first


def _sampler_of(options: Options) -> Any:
    s = options.sampling
    return s.batch_sampler if s.batch_sampler is not None else s.sampler


def kind_of(options: Options) -> str:
    """What a state of this loader holds: "map" (its own sampler), "sampler" (a user's) or "iterable"."""
    s = options.sampling
    return "iterable" if s.style == "iterable" else "map" if s.own else "sampler"


def make_plan(options: Options, epoch: int, start: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """The epoch's plan (the whole epoch, or what is left of it after ``start``) and a user sampler's state
    as the epoch begins (what a ``"sampler"`` state saves)."""
    s, kind = options.sampling, kind_of(options)
    plan: SessionPlan | UserSamplerPlan | _StreamRest
    sampler_state = None
    if kind == "map":
        plan = _map_plan(options, start, epoch)
    elif kind == "sampler":
        plan, sampler_state = _user_sampler_plan(options, epoch, start)
    else:
        first = int(start["next_task"]) if start is not None else 0
        plan = _StreamRest(s.seed, epoch, s.rank, s.world_size, seeded=options.batch_transform is not None, first=first)
    return plan, sampler_state


def _user_sampler_plan(options: Options, epoch: int, start: Mapping[str, Any] | None) -> tuple[UserSamplerPlan, Any]:
    """A user sampler's epoch (``user_sampler``): from its start, its delivered batches skipped, or, where the
    state holds the sampler's position (``sampler_resume``), on from there; and its state as the epoch began."""
    s, sampler = options.sampling, _sampler_of(options)
    position = start.get("sampler_resume") if start is not None else None
    if start is not None and position is not None:
        first, done, began = int(start["delivered"]), frozenset(start["extra"]), start["sampler_state"]
        fresh_start = first == 0  # the previous iteration's position, saved between epochs: the epoch follows it
    else:
        loaded = start is not None and start.get("sampler_state") is not None and hasattr(sampler, "load_state_dict")
        if start is not None and loaded:
            load_into(sampler, start["sampler_state"], "sampler_state", "sampler")
        began = copied(sampler.state_dict()) if hasattr(sampler, "state_dict") else None
        done = frozenset(join_done(start["delivered"], start["extra"])) if start is not None else frozenset()
        first, fresh_start = 0, loaded and start is not None and start["delivered"] == 0
    saved = start.get("sampler_randomness") if start is not None else None
    randomness = Randomness.of(sampler, saved) if position is None else None
    owner = epoch_owner(sampler) if not stateful(sampler) else None
    mid_epoch = start is not None and (int(start["delivered"]) > 0 or bool(start["extra"]))
    saved_epoch = start.get("sampler_epoch") if start is not None and mid_epoch else None
    if owner is not None and saved_epoch is not None and owner.epoch != saved_epoch:  # mid-epoch: that epoch's order
        owner.set_epoch(saved_epoch)
    draws = Draws(sampler, s.batch_sampler is None, s.batch_size, s.drop_last, first, position, fresh_start,
                  _keep(options), randomness)
    return UserSamplerPlan(draws, s.seed, epoch, s.rank, s.world_size, seeded=options.batch_transform is not None, done=done,
                           sampler_epoch=owner.epoch if owner is not None else None), began


def _map_plan(options: Options, start: Mapping[str, Any] | None, epoch: int) -> SessionPlan:
    s, rank, world = options.sampling, options.rank, options.world_size
    n = map_length(options.dataset, "the loader's own sampler")
    seeded = options.batch_transform is not None
    if start is None:
        return SessionPlan.make(Session(n, s.batch_size or 1, s.shuffle, s.seed, epoch, s.drop_last, world), rank,
                                seeded=seeded)
    if start["n"] != n:
        raise ArgumentError(f"load_state_dict: the state was saved for a dataset of {start['n']} samples; this one has {n}")
    old = Session(n, start["batch_size"], start["shuffle"], start["seed"], epoch, start["drop_last"],
                  start["world_size"], start["base"], tuple(start["excluded"]))
    ranks = start.get("ranks")
    if ranks is None:  # one rank's state: the others delivered the same batches (one with extras: checked ours)
        ranks = [{"delivered": start["delivered"], "extra": start["extra"] if r == start["rank"] else []}
                 for r in range(old.world_size)]
    done = {r: join_done(p["delivered"], p["extra"]) for r, p in enumerate(ranks)}
    if world == old.world_size:
        return SessionPlan.make(old, rank, done[rank], seeded=seeded)
    return SessionPlan.make(old.after(done, world), rank, seeded=seeded)


def dealer(plan: Any) -> Callable[[int], int] | None:
    """For a map-style plan, which batch of the epoch each task is: a resumed task then goes to the worker that
    made that batch in the uninterrupted run (batch b to worker b % workers), whose dataset state it resumes.
    None where task b is batch b (nothing delivered before: a fresh epoch), so a task goes to its own worker."""
    if isinstance(plan, SessionPlan):
        todo = plan.todo  # ascending batches of 0..: the last is len - 1 only when none is left out
        if not len(todo) or todo[-1] == len(todo) - 1:
            return None
        return lambda b: int(todo[b])
    if isinstance(plan, UserSamplerPlan):
        ids = plan.ids
        return lambda b: ids[b]
    return None


def ledger_for(options: Options, plan: Any = None) -> Ledger:
    """An epoch's ledger, keeping states as far back as the prefetch can be ahead of the caller; a user
    sampler's plan hears of each batch handed on (``UserSamplerPlan.handed``)."""
    keep = _keep(options)
    return _SamplerLedger(keep, plan) if isinstance(plan, UserSamplerPlan) else Ledger(keep)


def _keep(options: Options) -> int:
    return 64 + options.num_workers * options.prefetch_factor


class _SamplerLedger(Ledger):
    """The ledger of a user sampler's epoch: each batch handed on also tells its plan, which lets go of the
    sampler's states that no save can need any more."""

    def __init__(self, keep: int, plan: UserSamplerPlan) -> None:
        super().__init__(keep)
        self.plan = plan

    def hand(self, b: int) -> None:
        super().hand(b)
        self.plan.handed(b)


def stream_cursor(start: Mapping[str, Any] | None) -> int | None:
    """The worker a resumed stream's next task goes to (None: the first)."""
    nxt = start.get("next_worker") if start is not None else None
    return int(nxt) if nxt is not None else None


def previous_position(progress: EpochProgress | None) -> Mapping[str, Any] | None:
    """The position a user sampler's last iteration left (``Draws.last_position``), for a state between epochs."""
    if progress is None or progress.kind != "sampler":
        return None
    position: Mapping[str, Any] | None = progress.plan.draws.last_position() if progress.plan is not None else None
    return position if position is not None else progress.previous


def state_of(options: Options, progress: EpochProgress) -> dict[str, Any]:
    """The state of an epoch that has not finished: where its caller stands (after a loop left by
    ``break``, an exception or Ctrl-C too: the rest of that epoch is still to come)."""
    if progress.plan is None:  # iterated but not begun: still where it started
        if progress.start is not None:
            return dict(progress.start)
        readers = progress.readers
        if progress.live is not None:
            readers = [entry(0, progress.live())]
        return fresh(options, progress.epoch, readers, progress.previous)
    per, last = delivered(options, progress)
    check_saveable(options, per)
    if progress.kind == "map":
        return {**_map_state(options, progress), "workers": per}
    if progress.kind == "sampler":
        start = progress.start
        prior = join_done(start["delivered"], start["extra"]) if start is not None else []
        k, extra = split_done([*prior, *(progress.plan.ids[i] for i in progress.handed)])
        position = progress.plan.draws.position_after(k)
        if position is None and k == 0 and start is None:  # drawn ahead, none delivered: where the iteration began
            position = progress.previous
        randomness = progress.plan.draws.randomness
        drawn_from = None if randomness is None else randomness.began if randomness.began is not None else randomness.now()
        return {**_head(options, "sampler", progress.epoch), "delivered": k, "extra": extra,
                "sampler_state": progress.sampler_state, "sampler_resume": copy.deepcopy(position),
                "sampler_randomness": drawn_from, "sampler_epoch": progress.plan.sampler_epoch, "workers": per}
    start = progress.start or fresh(options, progress.epoch)
    first = int(start["next_task"])
    nxt = first + max(progress.handed) + 1 if progress.handed else first
    return {**_head(options, "iterable", progress.epoch), "workers": per, "next_task": nxt,
            "next_worker": (last + 1) % len(per) if last is not None else start["next_worker"]}


def _head(options: Options, kind: str, epoch: int) -> dict[str, Any]:
    """The fields of every kind; a user sampler's and a stream's batching too (a map state keeps its own), as
    their delivered batches are counted in batches of it."""
    head = {"version": STATE_VERSION, "kind": kind, "epoch": epoch, "seed": options.seed,
            "rank": options.rank, "world_size": options.world_size}
    if kind != "map":
        head.update(batch_size=options.sampling.batch_size, drop_last=options.sampling.drop_last)
    return head


def fresh(options: Options, epoch: int, readers: list[Any] | None = None,
          previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The state at the start of epoch ``epoch``, each reader starting from its entry in ``readers``
    (``readers.carried``; None: every reader from the dataset as the loader has it); ``previous``: a user
    sampler's previous iteration's position (``Draws.last_position``), which the epoch's iteration follows."""
    kind = kind_of(options)
    head = _head(options, kind, epoch)
    per = list(readers) if readers is not None else [None] * reader_count(options)
    check_saveable(options, per)
    if kind == "map":
        s = options.sampling
        return {**head, "n": map_length(options.dataset, "state_dict"), "batch_size": s.batch_size or 1, "shuffle": s.shuffle,
                "drop_last": s.drop_last, "base": 0, "excluded": [], "delivered": 0, "extra": [], "workers": per}
    if kind == "sampler":  # the sampler's own state as it is now: it starts the epoch from there
        sampler = _sampler_of(options)
        live = sampler.state_dict() if callable(getattr(sampler, "state_dict", None)) else None
        randomness = Randomness.of(sampler)
        return {**head, "delivered": 0, "extra": [], "sampler_state": copied(live),
                "sampler_resume": copy.deepcopy(previous) if live is None else None,
                "sampler_randomness": randomness.now() if randomness is not None else None, "workers": per}
    return {**head, "workers": per, "next_task": 0, "next_worker": None}


def _map_state(options: Options, progress: EpochProgress) -> dict[str, Any]:
    plan: SessionPlan = progress.plan
    se = plan.session
    done = plan.done_before()
    done.update(int(plan.todo[i]) for i in progress.handed)
    k, extra = split_done(done)
    return {**_head(options, "map", progress.epoch), "world_size": se.world_size, "n": se.n,
            "batch_size": se.batch_size, "shuffle": se.shuffle, "drop_last": se.drop_last, "seed": se.seed,
            "base": se.base, "excluded": list(se.excluded), "delivered": k, "extra": extra}


def check_state(options: Options, state: Any) -> dict[str, Any]:
    """A copy of ``state`` this loader can resume from, every field checked (``state_checks``); a map-style
    state's dataset states dropped, with a warning, under another layout of readers (``readers.fit_readers``)."""
    kind = kind_of(options)
    checked = checked_state(options, state, kind)
    return checked if kind == "iterable" else fit_readers(options, checked)


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state from every rank's state of a map-style loader (its own sampler), for an elastic resume.

    Needed when the ranks delivered different batches (a rank ahead of the others, ``in_order=False``);
    every new rank then loads the merged state. All ranks of one session must be given, once each. The
    dataset states of each rank's workers cannot be merged: they are left out, with a one-line warning.
    """
    if not states:
        raise ArgumentError("merge_states: no states given")
    first = dict(states[0])
    if first.get("kind") != "map":
        raise ArgumentError("merge_states: only the states of a map-style loader with its own sampler merge")
    keys = ("version", "epoch", "world_size", "base", "excluded", *_MATCH)
    for sd in states[1:]:
        differ = [k for k in keys if sd.get(k) != first.get(k)]
        if differ:
            raise ArgumentError(f"merge_states: the states are of different sessions (they differ in {', '.join(differ)})")
    world = int(first["world_size"])
    ranks: list[dict[str, Any] | None] = [None] * world
    for sd in states:
        for r, p in _progress(sd):
            if ranks[r] is not None and ranks[r] != p:
                raise ArgumentError(f"merge_states: two different states for rank {r}")
            ranks[r] = p
    missing = [r for r, p in enumerate(ranks) if p is None]
    if missing:
        raise ArgumentError(f"merge_states: no state for rank(s) {missing} of {world}")
    if any(p is not None for sd in states for p in sd.get("workers") or []):
        warnings.warn("merge_states: the ranks' dataset states (their state_dict()) cannot be merged and are left "
                      "out: the sample order resumes exactly, each reader's dataset from its own state",
                      UserWarning, stacklevel=2)
    return {**first, "rank": None, "delivered": min(p["delivered"] for p in ranks if p is not None),
            "extra": [], "ranks": ranks, "workers": [None]}


def _progress(sd: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    if sd.get("ranks") is not None:
        return [(r, dict(p)) for r, p in enumerate(sd["ranks"])]
    return [(int(sd["rank"]), {"delivered": int(sd["delivered"]), "extra": list(sd["extra"])})]
