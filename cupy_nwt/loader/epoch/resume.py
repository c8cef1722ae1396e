"""Mid-epoch state of a loader: what ``state_dict()`` saves, what ``load_state_dict()`` resumes from.

A state counts only batches *delivered to the caller* (the epoch iterator's turns, failed batches
included): batches the workers made ahead are not consumed. It is a small JSON-ready dict, by kind:

* ``"map"`` (the loader's own sampler): the epoch, the settings the order depends on, the session
  (``remainder``: ``world_size``, ``base``, ``excluded``), this ``rank`` and the batches it delivered
  (``delivered``, a prefix count, plus ``extra``: the few beyond it that ``in_order=False`` gave).
  No per-sample list. Worker count, prefetch and persistence play no part: the rest of the epoch
  is the same with any of them.
* ``"sampler"`` (a user's ``sampler`` or ``batch_sampler``): the batches delivered, and the
  sampler's own ``state_dict()`` as it was when the epoch began (if it has one). On resume that
  state is loaded, the epoch's batches are drawn again and the delivered ones skipped (a sampler
  without state must give the same order again, e.g. seeded by epoch).
* ``"iterable"``: per worker, the dataset copy's ``state_dict()`` as of the last batch delivered from
  it (or, for a dataset without one, how many batches it delivered, re-read and skipped on resume).
  It resumes with the same number of workers (0 and 1 count alike) and ranks only.

Elastic resume (map kind): a loader of another ``world_size`` takes the union of what every old
rank delivered and re-shards the rest over its own ranks (``Session.after``). Each new rank loads
either any old rank's state, when all old ranks delivered the same batches in order (a DDP loop in
lockstep), or the output of ``merge_states`` over every old rank's state. Each new rank plugs in
its own ``rank`` and ``world_size``. A re-sharded rest keeps every sample exactly once and the
ranks balanced; its transform seeds differ from the uninterrupted run's (only a same-world-size
resume is bitwise the uninterrupted run).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...data.contract import epoch_setter, map_length
from ...errors import ArgumentError, LoaderError
from ..workers.messages import ErrorReport
from ..workers.torch_workers import is_iter_datapipe, pipe_seed
from .order import Plan, PlanTask, StreamPlan
from .progress import EpochProgress, Ledger
from .remainder import Session, SessionPlan, join_done, split_done
from .state_checks import STATE_VERSION, checked_state

if TYPE_CHECKING:
    from .._options import Options

_MATCH = ("seed", "n", "batch_size", "shuffle", "drop_last")


@dataclass(frozen=True, eq=False)
class _SkipPlan:
    """A user's sampler plan with the batches already delivered left out (tasks renumbered 0..)."""

    inner: Plan
    done: frozenset[int]
    ids: list[int] = field(default_factory=list)  # task i is the epoch's batch ids[i]
    stream = False

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    def tasks(self) -> Iterator[PlanTask]:
        for b, indices, seed in self.inner.tasks():
            if b not in self.done:
                self.ids.append(b)
                yield len(self.ids) - 1, indices, seed


@dataclass(frozen=True, eq=False)
class _StreamRest(StreamPlan):
    """A stream's epoch from task ``first`` on (tasks renumbered 0..; seeds those of the original tasks)."""

    first: int = 0

    def transform_seed(self, b: int) -> int:
        return super().transform_seed(b + self.first)


def _sampler_of(options: Options) -> Any:
    s = options.sampling
    return s.batch_sampler if s.batch_sampler is not None else s.sampler


def kind_of(options: Options) -> str:
    """What a state of this loader holds: "map" (its own sampler), "sampler" (a user's) or "iterable"."""
    s = options.sampling
    return "iterable" if s.kind == "iterable" else "map" if s.own else "sampler"


def make_plan(options: Options, epoch: int, start: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """The epoch's plan (the whole epoch, or what is left of it after ``start``) and a user sampler's state
    as the epoch begins (what a ``"sampler"`` state saves)."""
    s, kind = options.sampling, kind_of(options)
    plan: SessionPlan | _SkipPlan | _StreamRest
    sampler_state = None
    if kind == "map":
        plan = _map_plan(options, start, epoch)
    elif kind == "sampler":
        sampler = _sampler_of(options)
        if start is not None and start.get("sampler_state") is not None and hasattr(sampler, "load_state_dict"):
            sampler.load_state_dict(start["sampler_state"])
        sampler_state = sampler.state_dict() if hasattr(sampler, "state_dict") else None
        done = frozenset(join_done(start["delivered"], start["extra"])) if start is not None else frozenset()
        plan = _SkipPlan(s.plan(options.dataset, epoch), done)
    else:
        first = int(start["next_task"]) if start is not None else 0
        plan = _StreamRest(s.seed, epoch, s.rank, s.world_size, first)
    return plan, sampler_state


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


def ledger_for(options: Options) -> Ledger:
    """An epoch's ledger, keeping states as far back as the prefetch can be ahead of the caller."""
    return Ledger(keep=64 + options.num_workers * options.prefetch_factor)


def stream_restore(options: Options, epoch: int, start: Mapping[str, Any] | None,
                   ) -> tuple[dict[int, tuple[Any, int, int | None, int | None]], int | None]:
    """How each reader of a stream is prepared before it begins, by worker (the main process is worker 0):
    the epoch for a dataset with ``set_epoch`` (every worker's copy: persistent workers' copies reshuffle
    too, as WebDataset's per-epoch shuffle expects), a torch ``IterDataPipe``'s shuffle seed, and the
    saved position of a resumed stream (its dataset state, or batches to skip); and the worker a resumed
    stream's next task goes to."""
    if kind_of(options) != "iterable":
        return {}, None
    piped = is_iter_datapipe(options.dataset)
    tell = epoch if epoch_setter(options.dataset) is not None or piped else None
    shared = pipe_seed(options.seed, epoch, options.seed_drawn) if piped else None
    per = start["workers"] if start is not None else []
    restore: dict[int, tuple[Any, int, int | None, int | None]] = (
        {w: (None, 0, tell, shared) for w in range(max(1, options.num_workers))} if tell is not None else {})
    restore.update({w: (p.get("state"), 0 if p.get("state") is not None else int(p.get("batches", 0)), tell, shared)
                    for w, p in enumerate(per) if p is not None})
    nxt = start.get("next_worker") if start is not None else None
    return restore, int(nxt) if nxt is not None else None


def state_of(options: Options, progress: EpochProgress) -> dict[str, Any]:
    """The state of an epoch that has not finished: where its caller stands (after a loop left by
    ``break``, an exception or Ctrl-C too: the rest of that epoch is still to come)."""
    if progress.plan is None:  # iterated but not begun: still where it started
        return dict(progress.start) if progress.start is not None else fresh(options, progress.epoch)
    if progress.kind == "map":
        return _map_state(options, progress)
    if progress.kind == "sampler":
        start = progress.start
        prior = join_done(start["delivered"], start["extra"]) if start is not None else []
        k, extra = split_done([*prior, *(progress.plan.ids[i] for i in progress.handed)])
        return {**_head(options, "sampler", progress.epoch), "delivered": k, "extra": extra,
                "sampler_state": progress.sampler_state}
    return _stream_state(options, progress)


def _head(options: Options, kind: str, epoch: int) -> dict[str, Any]:
    return {"version": STATE_VERSION, "kind": kind, "epoch": epoch, "seed": options.seed,
            "rank": options.rank, "world_size": options.world_size}


def fresh(options: Options, epoch: int) -> dict[str, Any]:
    """The state at the start of epoch ``epoch``."""
    kind = kind_of(options)
    head = _head(options, kind, epoch)
    if kind == "map":
        s = options.sampling
        return {**head, "n": map_length(options.dataset, "state_dict"), "batch_size": s.batch_size or 1, "shuffle": s.shuffle,
                "drop_last": s.drop_last, "base": 0, "excluded": [], "delivered": 0, "extra": []}
    if kind == "sampler":
        return {**head, "delivered": 0, "extra": [], "sampler_state": None}
    return {**head, "workers": [None] * max(1, options.num_workers), "next_task": 0, "next_worker": None}


def _map_state(options: Options, progress: EpochProgress) -> dict[str, Any]:
    plan: SessionPlan = progress.plan
    se = plan.session
    done = set(range(plan.session.batches(plan.rank))) - set(plan.todo.tolist())
    done.update(int(plan.todo[i]) for i in progress.handed)
    k, extra = split_done(done)
    return {**_head(options, "map", progress.epoch), "world_size": se.world_size, "n": se.n,
            "batch_size": se.batch_size, "shuffle": se.shuffle, "drop_last": se.drop_last, "seed": se.seed,
            "base": se.base, "excluded": list(se.excluded), "delivered": k, "extra": extra}


def _stream_state(options: Options, progress: EpochProgress) -> dict[str, Any]:
    assert progress.streams is not None
    states, counts, last = progress.streams
    handed = progress.handed
    start = progress.start or fresh(options, progress.epoch)
    per: list[dict[str, Any] | None] = [dict(p) if p is not None else None for p in start["workers"]]
    for w, state in states.items():
        if isinstance(state, ErrorReport):
            raise LoaderError(f"state_dict: the dataset's state_dict() failed in worker {w}: {state.exc_type}: "
                              f"{state.message} (iteration is unaffected; without state_dict() a resumed "
                              f"stream is fast-forwarded instead)")
    for w in set(states) | set(counts):
        old = per[w]
        per[w] = {"batches": (old["batches"] if old is not None else 0) + counts[w], "state": states.get(w)}
    first = int(start["next_task"])
    nxt = first + max(handed) + 1 if handed else first
    n = len(per)
    return {**_head(options, "iterable", progress.epoch), "workers": per, "next_task": nxt,
            "next_worker": (last + 1) % n if last is not None else start["next_worker"]}


def check_state(options: Options, state: Any) -> dict[str, Any]:
    """A copy of ``state`` this loader can resume from, every field checked (``state_checks``)."""
    return checked_state(options, state, kind_of(options))


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state from every rank's state of a map-style loader (its own sampler), for an elastic resume.

    Needed when the ranks delivered different batches (a rank ahead of the others, ``in_order=False``);
    every new rank then loads the merged state. All ranks of one session must be given, once each.
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
    return {**first, "rank": None, "delivered": min(p["delivered"] for p in ranks if p is not None),
            "extra": [], "ranks": ranks}


def _progress(sd: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    if sd.get("ranks") is not None:
        return [(r, dict(p)) for r, p in enumerate(sd["ranks"])]
    return [(int(sd["rank"]), {"delivered": int(sd["delivered"]), "extra": list(sd["extra"])})]
