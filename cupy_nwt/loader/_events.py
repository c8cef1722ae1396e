"""Named events on a loader's path, and the listeners that hear them.

Stats and online tuning watch the pipeline by listening, never by reading the loader (SPDL's task
hooks are the model). Each stage says what happened where it happens, on the main thread: the epoch
iterator the caller's wait, a worker's answer the ``StageTimes`` of the batch it made, the host
path or the prefetcher a copy, a worker source each ask, its blocked time and a stall. ``Events``
hands each event to the listeners that define it, in order. So a new figure is a new listener,
and a new per-stage timer is a field of ``StageTimes`` plus the code that measures it: the
messages carry the record whole and the recorder sums it field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from operator import attrgetter
from typing import Any


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Seconds one batch spent in each stage where it was made (a worker or the main process)."""

    fetch_s: float = 0.0
    collate_s: float = 0.0
    transform_s: float = 0.0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in self.__slots__)  # per batch: no dict

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def values(self) -> tuple[float, ...]:
        """The seconds of each stage, in the order of ``names()`` (read in C: a batch's answer sums them)."""
        return _stage_values(self)

    def total(self) -> float:
        """Seconds the batch kept its maker busy."""
        return sum(self.values())

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


_stage_values = attrgetter(*StageTimes.names())


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out of batch ``batch_index`` because it failed to read or decode (``on_bad_sample="skip"``):
    its key, where it comes from (its file when the dataset says), and why."""

    epoch: int
    batch_index: int
    key: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Stall:
    """One ``next()`` waited ``waited_s`` for batch ``batch_index`` (None: any, with ``in_order=False``)."""

    epoch: int
    batch_index: int | None
    worker_id: int | None  # None: no worker has it yet (no free slot or worker capacity)
    where: str
    waited_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Listener:
    """Every event, each a no-op here: a listener overrides the ones it needs.

    ``source`` in ``asked`` is the epoch's worker source (``epoch.sources.WorkerSource``): a
    listener may poll it and read its ``blocked_s`` and ``idle_workers()``.
    """

    def began(self, epoch: int) -> None:
        """An iteration of epoch ``epoch`` started; it is the newest."""

    def asked(self, epoch: int, source: Any) -> None:
        """The caller's ``next()`` asks a worker source for a batch."""

    def waited(self, epoch: int, seconds: float, delivered: bool) -> None:
        """One ``next()`` returned after ``seconds``; ``delivered``: it took a turn (a batch or a failed one)."""

    def blocked(self, seconds: float) -> None:
        """A source spent ``seconds`` blocked for batches the workers had not made yet."""

    def made(self, times: StageTimes) -> None:
        """A batch was made (its answer arrived, or the main process made it)."""

    def copied(self, seconds: float) -> None:
        """Host seconds copying one batch out of the ring or issuing its copy to the device."""

    def stalled(self, stall: Stall) -> None:
        """A ``next()`` has waited past the stall threshold (once per ``next()``)."""

    def skipped(self, sample: SkippedSample) -> None:
        """A sample failed to read or decode and was left out of its batch."""

    def ring_made(self, slot_bytes: int, pool: Any) -> None:
        """A ring of ``slot_bytes``-byte slots was made for ``pool`` (the workers; None: the main process)."""

    def first_batch(self, pids: Sequence[int]) -> None:
        """An iteration delivered its first batch; ``pids`` are the live worker processes."""

    def ended(self, pids: Sequence[int]) -> None:
        """An epoch ran to its end with these worker processes still up."""


_EVENTS = ("began", "asked", "waited", "blocked", "made", "copied", "stalled", "skipped", "ring_made", "first_batch",
           "ended")


class Events(Listener):
    """Fans each event out to the listeners that define it (resolved once, not per call)."""

    _began: tuple[Callable[[int], None], ...]
    _asked: tuple[Callable[[int, Any], None], ...]
    _waited: tuple[Callable[[int, float, bool], None], ...]
    _blocked: tuple[Callable[[float], None], ...]
    _made: tuple[Callable[[StageTimes], None], ...]
    _copied: tuple[Callable[[float], None], ...]
    _stalled: tuple[Callable[[Stall], None], ...]
    _skipped: tuple[Callable[[SkippedSample], None], ...]
    _ring_made: tuple[Callable[[int, Any], None], ...]
    _first_batch: tuple[Callable[[Sequence[int]], None], ...]
    _ended: tuple[Callable[[Sequence[int]], None], ...]

    def __init__(self, listeners: Iterable[Listener] = ()) -> None:
        self.listeners = tuple(listeners)
        for name in _EVENTS:
            base = getattr(Listener, name)
            hears = tuple(getattr(x, name) for x in self.listeners if getattr(type(x), name) is not base)
            setattr(self, f"_{name}", hears)
            if len(hears) == 1:  # the usual case on the hot path: call the one listener directly
                setattr(self, name, hears[0])

    def began(self, epoch: int) -> None:
        for f in self._began:
            f(epoch)

    def asked(self, epoch: int, source: Any) -> None:
        for f in self._asked:
            f(epoch, source)

    def waited(self, epoch: int, seconds: float, delivered: bool) -> None:
        for f in self._waited:
            f(epoch, seconds, delivered)

    def blocked(self, seconds: float) -> None:
        for f in self._blocked:
            f(seconds)

    def made(self, times: StageTimes) -> None:
        for f in self._made:
            f(times)

    def copied(self, seconds: float) -> None:
        for f in self._copied:
            f(seconds)

    def stalled(self, stall: Stall) -> None:
        for f in self._stalled:
            f(stall)

    def skipped(self, sample: SkippedSample) -> None:
        for f in self._skipped:
            f(sample)

    def ring_made(self, slot_bytes: int, pool: Any) -> None:
        for f in self._ring_made:
            f(slot_bytes, pool)

    def first_batch(self, pids: Sequence[int]) -> None:
        for f in self._first_batch:
            f(pids)

    def ended(self, pids: Sequence[int]) -> None:
        for f in self._ended:
            f(pids)

    @property
    def hears_asked(self) -> bool:
        """Whether anyone listens to ``asked`` (a source skips the call otherwise)."""
        return bool(self._asked)
