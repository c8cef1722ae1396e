"""What travels between the main process and its loader workers: one small frozen record per kind.

Main process -> worker: ``RingMsg`` (once per ring), ``Task`` (once per batch), ``Restore`` (a reader's
saved state or epoch, before its first sample), ``Stop``. Worker -> main process: ``Ok``, ``Whole``,
``Exhausted``, ``Skipped`` or ``Raised`` (once per task; preceded by a ``StreamState`` for a stream's task
or one of a dataset that keeps a state, and by a ``BadSamples`` for a batch that left bad samples out,
which is itself the answer when none was left), ``InitFailed`` (at most once, then the worker exits);
before all of them ``Started``, once the worker is unpickled and up. A batch's arrays are written into
the ring; only its other leaves travel, in ``Ok``. ``Whole`` carries a batch pickled: the first ones,
made before the ring exists, and any later one that does not fit the ring's layout.

A task and its answer cross a pipe per batch, so every record pickles as its class and the tuple of
its fields (``__reduce__``), not as a state dict: about the size of a tagged tuple,
and the same on every Python this package supports. On the wire, the two that cross per batch, ``Task``
and ``Ok``, travel between processes as plain tuples instead (``wire()``; ``Task.from_wire``, and the
pool reads an ``Ok``'s fields straight into the batch): a pickled class is imported by name on both
ends, which costs more instructions than the rest of the hand-over. Only a ``Task`` goes to a worker
and only an ``Ok`` comes back as a tuple, so a tuple says which it is.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._events import StageTimes
from ..ring.ring import SlotLayout


class _Record:
    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fields: tuple[str, ...] = self.__slots__  # a dataclass's slots are its fields, in order
        return type(self), tuple(getattr(self, name) for name in fields)


@dataclass(frozen=True, slots=True)
class ErrorReport(_Record):
    """An exception, made portable: its type's name, text and traceback, the exception if it pickles,
    and its class by reference if that pickles (the caller gets an error of that type)."""

    exc_type: str
    message: str
    traceback: str
    sample_index: Any
    pickled: bytes | None
    exc_class: bytes | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, sample_index: Any, *, keep_object: bool = True) -> ErrorReport:
        """``keep_object=False`` when the caller chains ``exc`` itself (no need to pickle it)."""
        blob = kind = None
        if keep_object:
            try:
                blob = pickle.dumps(exc)
            except Exception:  # noqa: BLE001 - an unpicklable exception still reports its text
                blob = None
            try:
                kind = pickle.dumps(type(exc))
            except Exception:  # noqa: BLE001 - a class defined in a function: a plain WorkerError then
                kind = None
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            message = str(exc)
        except Exception as failed:  # noqa: BLE001 - the user's __str__ raised: the error still reaches the caller
            message = f"<str() of the {type(exc).__qualname__} failed: {type(failed).__name__}>"
        return cls(type(exc).__qualname__, message, text, sample_index, blob, kind)

    def exception_class(self) -> type | None:
        """The original exception's class, where it pickled and unpickles here."""
        if self.exc_class is None:
            return None
        try:
            kind = pickle.loads(self.exc_class)
        except Exception:  # noqa: BLE001 - not importable here: a plain WorkerError then
            return None
        return kind if isinstance(kind, type) else None

    def to_dict(self) -> dict[str, Any]:
        return {"exc_type": self.exc_type, "message": self.message, "traceback": self.traceback,
                "sample_index": self.sample_index, "pickled": self.pickled}


# ---------------------------------------------------------------- main process -> worker


@dataclass(frozen=True, slots=True)
class RingMsg(_Record):
    """Attach to this ring (closing the previous one); its header holds the current generation.

    ``name``: the /dev/shm segment's; None: the anonymous ring memory the worker was started with.
    """

    name: str | None
    layout: SlotLayout
    slots: int


NO_SLOT = -1  # a task's slot when there is no ring yet: the batch comes back ``Whole``


@dataclass(frozen=True, slots=True)
class Task(_Record):
    """Make batch ``batch_index`` into ``slot`` (or ``NO_SLOT``), unless ``generation`` is stale.

    ``indices``: the keys of its samples (one key when batching is off), an int64 array or the
    sampler's own objects; None: the next batch of the worker's own stream (an iterable-style dataset).
    """

    generation: int
    batch_index: int
    slot: int
    indices: np.ndarray | Sequence[Any] | None  # any other iterable arrives as a list (``as_keys``)
    transform_seed: int

    def wire(self) -> tuple[Any, ...]:
        """This task as a plain tuple, int64 indices as their bytes (see the module docstring)."""
        return task_wire(self.generation, self.batch_index, self.slot, self.indices, self.transform_seed)

    @classmethod
    def from_wire(cls, t: tuple[Any, ...]) -> Task:
        generation, batch_index, slot, ix, seed = t
        return cls(generation, batch_index, slot, np.frombuffer(ix, _INDEX) if type(ix) is bytes else ix, seed)


_INDEX = np.dtype(np.int64)


def task_wire(generation: int, batch_index: int, slot: int, indices: Any, transform_seed: int) -> tuple[Any, ...]:
    """``Task(...).wire()`` without making the ``Task``: the process pool's per-batch hand-over sends this."""
    if type(indices) is np.ndarray and indices.dtype == _INDEX and indices.ndim == 1:
        indices = indices.tobytes()
    return generation, batch_index, slot, indices, transform_seed


@dataclass(frozen=True, slots=True)
class Restore(_Record):
    """Before the worker's first sample: ``set_epoch(epoch)`` on a stream's dataset (if not None and it has
    one), a torch ``IterDataPipe``'s shufflers seeded with ``pipe_seed`` (if not None), load the reader's
    saved ``state`` (``BatchMaker.restore``; if not None), then skip ``skip`` batches (a resumed stream
    whose dataset keeps no state)."""

    state: Any
    skip: int
    epoch: int | None = None
    pipe_seed: int | None = None


@dataclass(frozen=True, slots=True)
class Stop(_Record):
    """Exit the worker loop."""


# ---------------------------------------------------------------- worker -> main process


@dataclass(frozen=True, slots=True)
class Ok(_Record):
    """``slot`` now holds batch ``batch_index``: its first ``rows`` rows; ``objects``, its non-array leaves."""

    generation: int
    batch_index: int
    slot: int
    rows: int
    objects: list | None = None
    times: StageTimes | None = None  # seconds in each stage where it was made (``loader.stats()``)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fields = (self.generation, self.batch_index, self.slot, self.rows)  # the common case stays small
        return type(self), fields if self.objects is None and self.times is None else (*fields, self.objects, self.times)

    def wire(self) -> tuple[Any, ...]:
        """This answer as a plain tuple, its stage seconds as floats (see the module docstring)."""
        t = self.times
        return ((self.generation, self.batch_index, self.slot, self.rows, self.objects) if t is None else
                (self.generation, self.batch_index, self.slot, self.rows, self.objects, t.fetch_s, t.collate_s,
                 t.transform_s))


@dataclass(frozen=True, slots=True)
class Whole(_Record):
    """Batch ``batch_index`` itself (``rows`` rows), pickled; ``slot`` (or ``NO_SLOT``) is untouched. ``parts`` is
    the batch as ``ring.tree.split`` cuts it: its arrays pickle as NumPy's, whichever framework holds them
    (torch's own pickling fails for several dtypes, the unsigned and float8 ones among them)."""

    generation: int
    batch_index: int
    slot: int
    rows: int
    parts: tuple[Any, list[np.ndarray], list[Any]]
    times: StageTimes | None = None


@dataclass(frozen=True, slots=True)
class Exhausted(_Record):
    """The worker's stream has no batch left this epoch: task ``batch_index`` has none; ``slot`` is untouched."""

    generation: int
    batch_index: int
    slot: int


@dataclass(frozen=True, slots=True)
class StreamState(_Record):
    """Sent just before the answer to task ``batch_index`` of a stream, or of a map-style dataset that keeps a
    state: the reader's state after it (``BatchMaker.reader_state``; None when it keeps none), so the loader
    can save where each worker's dataset was as of the batches it delivered."""

    generation: int
    batch_index: int
    state: Any


BadSample = tuple[Any, str, str]  # a sample left out of its batch: its key, where it comes from, why


@dataclass(frozen=True, slots=True)
class BadSamples(_Record):
    """Samples of task ``batch_index`` that failed to read or decode and were left out of its batch
    (``on_bad_sample="skip"``). Sent just before the task's answer; or, when ``dropped`` (every sample
    was bad), it is the answer: the task has no batch, and ``slot`` is untouched."""

    generation: int
    batch_index: int
    slot: int
    bad: tuple[BadSample, ...]
    dropped: bool = False


@dataclass(frozen=True, slots=True)
class Skipped(_Record):
    """The task's generation was no longer current when the worker got to it; ``slot`` is untouched."""

    generation: int
    batch_index: int
    slot: int


@dataclass(frozen=True, slots=True)
class Raised(_Record):
    """Making batch ``batch_index`` raised (the worker's answer for a failed batch, which the pool turns into a
    ``FailedBatch``); ``slot`` holds nothing of use."""

    generation: int
    batch_index: int
    slot: int
    report: ErrorReport


@dataclass(frozen=True, slots=True)
class Started(_Record):
    """The worker is up (its modules imported, its dataset unpickled): the pool may start more (``start_wave``)."""


@dataclass(frozen=True, slots=True)
class InitFailed(_Record):
    """The worker could not start (``stage``: ``worker_init_fn`` raised, or its dataset could not be rebuilt);
    it exits right after sending this."""

    report: ErrorReport
    stage: str = "worker_init_fn"


ToWorker = RingMsg | Task | Restore | Stop
FromWorker = Ok | Whole | Exhausted | Skipped | Raised | InitFailed | StreamState | BadSamples  # and ``Started``, once, which the pool takes in itself


# Each record pickles with its module's name, once per message: the package's shorter name keeps a
# batch's answer about the size of a tagged tuple (the package re-exports them, so unpickling finds them).
for _cls in (ErrorReport, RingMsg, Task, Restore, Stop, Ok, Whole, Exhausted, StreamState, Skipped, Raised,
             InitFailed, BadSamples, Started):
    _cls.__module__ = __package__
