"""A user's ``sampler`` or ``batch_sampler`` across a save and a resume.

A sampler's own ``state_dict()`` says one of two things, and the loader resumes from either:

* how to draw the epoch again (a generator's state, an epoch count, a seed), which stays put while the
  epoch is drawn. It is saved as the epoch began; on resume it is loaded, the epoch drawn again and the
  delivered batches skipped.
* how far the epoch got (torchdata's ``StatefulDistributedSampler``, the iterator of its ``RandomSampler``,
  a generator keeping its position), which moves with every batch drawn. It is saved as it was just after
  the delivered batches were drawn; on resume it is loaded and the sampler goes on from there, as
  torchdata's ``StatefulDataLoader`` resumes it. As the epoch began such a state is no use: it still counts
  the previous epoch until the sampler's next iteration starts, and loaded it would skip the whole epoch.

Which of the two a sampler keeps is read off it: its state (and its iterator's, where that has one) after
the epoch's first batch is compared with the state after the second. To know that by the time the first
batch is delivered, a stateful sampler's second batch is drawn before its first is handed on (with
``num_workers=0`` it is one batch ahead until the second is delivered, as workers' prefetching is). A
state loaded as the epoch began (saved before its first batch was delivered) that leaves the sampler
nothing to give (a position at the end of the previous iteration) starts the sampler's next iteration:
that is the epoch. A state that moves without saying where the epoch stands (a random draw with
replacement, say) is taken for a position, as torchdata takes it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import StateError
from ..plan.order import PlanTask, SamplerPlan, as_keys, grouped
from .sampler_randomness import stateful

if TYPE_CHECKING:
    from .sampler_randomness import Randomness

_END = object()


def same_state(a: Any, b: Any) -> bool:
    """Whether two states a sampler returned are equal: containers item by item, arrays and tensors by value."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if hasattr(a, "__array__") or hasattr(b, "__array__"):
        try:
            return bool(np.array_equal(np.asarray(a), np.asarray(b)))
        except (TypeError, ValueError):
            return False
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return a is b


def copied(state: Any) -> Any:
    """A copy of a state the sampler may go on changing; one that cannot be copied is kept as returned (as
    torchdata keeps it): iterating must not fail for it, and saving it says what is wrong."""
    try:
        return copy.deepcopy(state)
    except Exception:  # noqa: BLE001 - any object of the user's
        return state


def load_into(obj: Any, saved: Any, field_name: str, what: str) -> None:
    """``obj.load_state_dict(saved)``: a refusal is the loaded state's fault, a ``StateError`` naming the field
    with the sampler's own words; a sampler that cannot load a state is refused likewise."""
    if not callable(getattr(obj, "load_state_dict", None)):
        raise StateError(f"load_state_dict: {field_name}: the state holds the {what}'s own state, and this "
                         f"{what} ({type(obj).__name__}) has no load_state_dict", field_name, saved)
    try:
        obj.load_state_dict(saved)
    except Exception as exc:  # noqa: BLE001 - any refusal by the user's code
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise StateError(f"load_state_dict: {field_name}: the {what}'s load_state_dict refused it: {text}",
                         field_name, saved) from exc


@dataclass(eq=False)
class Draws:
    """The batches of ``source`` (a ``batch_sampler``, or a ``sampler`` cut into ``batch_size``), numbered from
    ``first``, with the sampler's states after each one drawn (only where the sampler or its iterator keeps
    one; those ``keep`` batches behind the first batch not yet handed on are let go, ``settle``).

    Args:
        source: The user's ``batch_sampler``, or their ``sampler``.
        cut: Whether ``source`` is a ``sampler``, whose indices are cut into batches here.
        batch_size: Indices a batch takes from a ``sampler`` (None: one each, unbatched).
        drop_last: Whether a ``sampler``'s last, short batch is dropped.
        first: The epoch's batch the first one drawn is (``k`` when resumed by position after ``k``).
        position: The states to load to go on after batch ``first - 1`` (``{"sampler": ..., "iterator": ...}``,
            each optional), or None.
        fresh_start: Whether a state loaded as the epoch began, saved before the epoch's first batch was
            delivered, may begin the sampler's next iteration when it leaves nothing to give (see the module);
            with a ``position`` and ``first == 0`` (the previous iteration's, saved between epochs), that
            iteration is loaded, then a new one begins.
        keep: How many states behind the first batch not yet handed on are kept (the batches handed on but
            not yet delivered to the caller, a device prefetcher's, are fewer).
        randomness: The torch generator state the epoch is drawn from, for a sampler drawn again without a
            state of its own (``sampler_randomness``), or None.
    """

    source: Any
    cut: bool
    batch_size: int | None
    drop_last: bool
    first: int = 0
    position: Mapping[str, Any] | None = None
    fresh_start: bool = False
    keep: int = 64
    randomness: Randomness | None = None
    moves: bool | None = field(default=None, init=False)  # whether the state moved between the first two draws
    states: dict[int, dict[str, Any]] = field(default_factory=dict, init=False)  # batch -> states after it
    _handed: set[int] = field(default_factory=set, init=False)  # handed on, beyond ``_low``, the first not yet
    _low: int | None = field(default=None, init=False)
    _kept_from: int = field(default=0, init=False)

    def __iter__(self) -> Iterator[Any]:
        if self.position is not None:
            self.moves = True
        with self.randomness.first_draw() if self.randomness is not None else nullcontext():
            it = self._begin()
            if self.position is not None and self.first == 0 and self.fresh_start:  # the previous iteration's
                it = iter(self.source)
            keeps = stateful(self.source) or stateful(it)
            batches = self._cut(it)
            b = self.first
            keys = self._draw(batches, it, b, keeps)
        if keys is _END and self.fresh_start:
            it = iter(self.source)
            batches = self._cut(it)
            keys = self._draw(batches, it, b, keeps)
        while keys is not _END:
            if keeps and self.moves is None:  # one ahead until the first two draws tell what the state is
                nxt = self._draw(batches, it, b + 1, keeps)
                yield keys
            else:
                yield keys
                nxt = self._draw(batches, it, b + 1, keeps)
            keys, b = nxt, b + 1

    def _begin(self) -> Iterator[Any]:
        if self.position is not None and "sampler" in self.position:
            load_into(self.source, self.position["sampler"], "sampler_resume", "sampler")
        it = iter(self.source)
        if self.position is not None and "iterator" in self.position:
            load_into(it, self.position["iterator"], "sampler_resume", "sampler's iterator")
        return it

    def _cut(self, it: Iterator[Any]) -> Iterator[Any]:
        return grouped(it, self.batch_size, self.drop_last) if self.cut else it

    def _draw(self, batches: Iterator[Any], it: Iterator[Any], b: int, keeps: bool) -> Any:
        keys = next(batches, _END)
        if keys is not _END and keeps:
            state = self._state(it)
            self.states[b] = state
            if self.position is None and b == self.first + 1:
                self.moves = not same_state(self.states[b - 1], state)
        return keys

    def _state(self, it: Any) -> dict[str, Any]:
        out = {}
        if stateful(self.source):
            out["sampler"] = copied(self.source.state_dict())
        if stateful(it):
            out["iterator"] = copied(it.state_dict())
        return out

    def settle(self, b: int, before: frozenset[int] = frozenset()) -> None:
        """Batch ``b`` was handed on (``before``: those delivered before a resume, skipped); the states that no
        save can need any more, ``keep`` behind the first batch not handed on, are let go. A batch stuck
        while later ones come out of order holds them, however many come."""
        if not self.states:  # a sampler without a state of its own: nothing is kept
            return
        if self._low is None:
            self._low, self._kept_from = self.first, self.first
            self._handed.update(before)
        self._handed.add(b)
        while self._low in self._handed:
            self._handed.discard(self._low)
            self._low += 1
        while self._kept_from < self._low - self.keep:
            self.states.pop(self._kept_from, None)
            self._kept_from += 1

    def last_position(self) -> Mapping[str, Any] | None:
        """The iterator's state after the last batch drawn, where only the iterator keeps one (torchdata's
        ``RandomSampler``: its generator advances with each iteration, and only the iterator's state says by
        how much): what the next iteration must follow. None otherwise."""
        if stateful(self.source) or not self.states:
            return None
        last = self.states[max(self.states)]
        return {"iterator": last["iterator"]} if "iterator" in last else None

    def position_after(self, k: int) -> Mapping[str, Any] | None:
        """The states to go on from after the epoch's first ``k`` batches, where the sampler keeps a position
        and they are known; None where it resumes by drawing the epoch again."""
        if k == self.first and self.position is not None:
            return self.position
        if not self.moves or k < 1:
            return None
        if k - 1 not in self.states:
            raise StateError(f"state_dict: the sampler's state after batch {k - 1} was let go: the caller is more "
                             f"than {self.keep} batches behind the loader's prefetch", "sampler_resume", None)
        return self.states[k - 1]


@dataclass(frozen=True, eq=False)
class UserSamplerPlan(SamplerPlan):
    """One epoch of a user's sampler as tasks (renumbered 0..): its ``Draws`` with the batches in ``done``
    (delivered before a resume) left out; task i is the epoch's batch ``ids[i]``, with that batch's seed."""

    done: frozenset[int] = frozenset()
    ids: list[int] = field(default_factory=list)
    sampler_epoch: int | None = None  # a ``DistributedSampler``'s epoch as this one began (``sampler_randomness``)

    @property
    def draws(self) -> Draws:
        assert isinstance(self.batches, Draws)
        return self.batches

    def number(self, task: int) -> int:
        return self.ids[task]

    def handed(self, task: int) -> None:
        """Task ``task`` was handed on (``Ledger.hand``)."""
        self.draws.settle(self.ids[task], self.done)

    def tasks(self) -> Iterator[PlanTask]:
        for b, keys in enumerate(self.draws, self.draws.first):
            if b not in self.done:
                self.ids.append(b)
                yield len(self.ids) - 1, as_keys(keys), self.task_seed(b)
