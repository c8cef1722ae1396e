"""Where an epoch stands: the ledger its batch source writes (what it handed out, in order) and the
frozen ``EpochProgress`` record the epoch gives to whoever asks (``state_dict()``, ``stats()``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Ledger:
    """What a batch source handed out, in order: batch (task) indexes, and for a stream (or a dataset that
    keeps a state) the worker and its dataset state after each. Only the last ``keep`` entries keep their state (the prefetcher is
    never that far ahead of the caller); older ones fold into a per-worker summary."""

    def __init__(self, keep: int = 64) -> None:
        self.handed: list[int] = []
        self.keep = keep
        self._notes: dict[int, tuple[int, Any]] = {}
        self._recent: deque[tuple[int, int, Any]] = deque()
        self._states: dict[int, Any] = {}
        self._counts: Counter[int] = Counter()
        self._latest: dict[int, Any] = {}  # per worker, the state it sent last (delivered or not, its end included)

    def note(self, b: int, worker: int, state: Any) -> None:
        """Task ``b`` was made by ``worker``, whose dataset state is now ``state``."""
        self._notes[b] = (worker, state)
        self._latest[worker] = state

    def end(self, b: int) -> None:
        """Task ``b`` found its worker's stream at its end: nothing to hand out (its state stays the latest)."""
        self._notes.pop(b, None)

    def latest(self) -> dict[int, Any]:
        """Per worker, the state it sent last: where a persistent worker's reader stands, batches made ahead and
        a stream's end included (a state saved between epochs carries it to the next)."""
        return dict(self._latest)

    def hand(self, b: int) -> None:
        i = len(self.handed)
        self.handed.append(b)
        note = self._notes.pop(b, None)
        if note is None:
            return
        self._recent.append((i, *note))
        while len(self._recent) > self.keep:
            _, w, state = self._recent.popleft()
            self._states[w], self._counts[w] = state, self._counts[w] + 1

    def workers(self, delivered: int) -> tuple[dict[int, Any], Counter[int], int | None]:
        """Per worker, the state after its last delivered batch and its delivered count; the last worker."""
        states, counts, last = dict(self._states), Counter(self._counts), None
        for i, w, state in self._recent:
            if i < delivered:
                states[w], counts[w], last = state, counts[w] + 1, w
        return states, counts, last


@dataclass(frozen=True)
class EpochProgress:
    """One epoch as its caller has consumed it so far.

    ``plan`` is None until the first ``next()`` makes it; ``handed`` are the plan's tasks handed to the
    caller, in turn order (a failed batch takes its turn too); ``streams`` (an iterable dataset) is,
    per worker, its dataset state after its last delivered batch, its delivered count, and the worker
    that made the last one. ``finished``: the epoch ran to its end. ``readers``: each reader's entry as the
    epoch began (``readers``); ``latest``: per worker, the state it sent last; ``live``: with ``num_workers=0``,
    the main process's reader state as of now; ``previous``: a user sampler's position its last iteration left.
    """

    kind: str
    epoch: int
    start: Mapping[str, Any] | None  # the loaded state this epoch resumed from
    plan: Any
    handed: tuple[int, ...]
    sampler_state: Any
    streams: tuple[dict[int, Any], Counter[int], int | None] | None
    delivered: int
    waited_s: float
    finished: bool
    readers: list[Any] | None = None
    latest: dict[int, Any] = field(default_factory=dict)
    live: Callable[[], Any] | None = None
    previous: Mapping[str, Any] | None = None
