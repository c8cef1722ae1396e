"""Making one batch, in a worker or in the main process: fetch -> collate -> transform -> slot or whole.

A batch goes into a ring slot when it fits the ring's layout: default collation writes its samples
straight into the slot's views, anything else (a custom ``collate_fn``, a ``batch_transform``, batching
turned off) is made first and then copied in. A batch that does not fit (no ring yet, or its shapes
differ from the layout's) is handed back whole, to travel pickled; samples that disagree among
themselves are an error naming the first one that differs.
"""

from __future__ import annotations

import copy
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._worker_info import main_reader
from ...data.contract import batch_getter, epoch_setter
from ...errors import ArgumentError, BatchLayoutError, DataError, WorkerError, as_worker_error
from .._events import StageTimes
from ..ring.collate import collate, collate_into
from ..ring.ring import SlotLayout
from ..ring.tree import split
from .messages import BadSample, ErrorReport
from .torch_workers import prepare_datapipe

Keys = np.ndarray | Sequence[Any]  # a task's sample keys (``Indices`` without None)


class StreamEnd(Exception):
    """The dataset's iterator has no batch left this epoch."""


class AllBad(Exception):
    """Every sample of the task failed to read or decode (``on_bad_sample="skip"``): it has no batch."""


# What ``on_bad_sample="skip"`` leaves out: a sample whose read or decode failed (the datasets' own
# DataError: CorruptImageError, DataFileError, ...; OSError: a missing or unreadable file, Pillow's
# UnidentifiedImageError). Any other error is a bug in the dataset and still fails the batch.
BAD_SAMPLE_ERRORS = (DataError, OSError)


@dataclass(frozen=True)
class InSlot:
    """The batch is in the slot: ``rows`` rows; ``objects``, its leaves that are not ring arrays."""

    rows: int
    objects: list[Any]


def keeps_state(obj: Any) -> bool:
    """Does ``obj`` save and restore a state of its own (torchdata's ``Stateful``: both methods)?"""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


@dataclass(frozen=True)
class Loose:
    """The batch did not go into a slot: here it is, to travel pickled."""

    rows: int
    batch: Any


class BatchMaker:
    """Fetch -> collate -> transform for one batch; remembers which sample it was fetching.

    ``batched=False`` (``batch_size=None``): a task has one index, its sample is the batch (passed
    through ``collate_fn`` if one is given). An iterable-style dataset is read through ``begin_stream``
    and tasks without indices; ``batch_size`` and ``drop_last`` then cut its stream into batches.
    """

    def __init__(self, dataset: Any, collate_fn: Callable | None, batch_transform: Callable | None, *,
                 batched: bool = True, batch_size: int | None = None, drop_last: bool = False,
                 pipe: tuple[int, int] | None = None, skip_bad: bool = False, ranks: tuple[int, int] = (0, 1)) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_transform = batch_transform
        self.batched = batched
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.pipe = pipe  # a torch IterDataPipe's (rank, world_size): sharded and seeded as each epoch opens
        self.ranks = ranks  # the loader's (rank, world_size): a stream read without workers takes its share by them
        self.current: Any = None  # the key being fetched
        self.skip_bad = skip_bad  # leave out samples that fail to read or decode (BAD_SAMPLE_ERRORS)
        self.bad: list[BadSample] = []  # the samples left out of the last batch
        self.kept: list[Any] = []  # with samples left out: the keys of those kept, in order
        self.times = StageTimes()  # the last batch's seconds in each stage
        self._stream: Iterator[Any] | None = None
        self._fresh = False  # the stream is to be opened by the next pull
        self._restore: tuple[Any, int, int | None, int | None] | None = None  # (state, skip, epoch, pipe seed)
        self._ended: Any = None  # the stream's iterator that ran out (its state is the reader's until the next opens)
        self._open_error: Exception | None = None  # an ``__iter__`` that failed when a state opened the stream early
        self.keeps_state = keeps_state(dataset)  # a map-style dataset's state travels only if it keeps one

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stream": None, "_ended": None, "current": None}  # a live iterator stays here

    # -- samples

    def fetch(self, indices: Keys) -> list[Any]:
        """The samples of ``indices``: an int64 array is read as Python ints; any other keys are passed as they are."""
        keys = indices.tolist() if isinstance(indices, np.ndarray) else indices
        if self._restore is not None:
            self._load_dataset()
        getitems = batch_getter(self.dataset)
        if getitems is not None:
            self.current = None
            try:
                samples = getitems(keys)
            except BAD_SAMPLE_ERRORS:
                if not self.skip_bad:
                    raise
                return self._skipping(keys)  # which of them failed, one by one
            if len(samples) != len(keys):
                raise ArgumentError(f"__getitems__ returned {len(samples)} samples for {len(keys)} indices")
            return list(samples)
        if self.skip_bad:
            return self._skipping(keys)
        dataset, out, i = self.dataset, [], None
        self.current = None
        try:  # the failing sample is named after the fact: nothing is written per sample
            for i in keys:
                out.append(dataset[i])
        except BaseException:
            self.current = i
            raise
        return out

    def _skipping(self, keys: Sequence[Any]) -> list[Any]:
        """The samples of ``keys`` that read and decode; the others noted in ``bad``, ``AllBad`` if none did."""
        out, kept = [], []
        for key in keys:
            self.current = key
            try:
                out.append(self.dataset[key])
            except BAD_SAMPLE_ERRORS as exc:
                self._note_bad(key, exc)
            else:
                kept.append(key)
        self.current = None
        if not out:
            raise AllBad
        self.kept = kept
        return out

    def _note_bad(self, key: Any, exc: BaseException) -> None:
        describe = getattr(self.dataset, "sample_source", None)
        try:
            where = str(describe(key)) if describe is not None else f"sample {key!r}"
        except Exception:  # noqa: BLE001 - a description only
            where = f"sample {key!r}"
        first = (str(exc).splitlines() or [""])[0]
        self.bad = [*self.bad, (key, where, f"{type(exc).__name__}: {first}")]  # a new list: thread workers' makers are copies

    def begin_stream(self) -> None:
        """An epoch of an iterable-style dataset starts: the next pull opens a fresh iterator.

        Opened lazily, so an ``__iter__`` that raises fails the first batch, like any sample would.
        """
        self._stream, self._ended, self._fresh, self._open_error = None, None, True, None

    def opened_state(self) -> dict[str, Any] | None:
        """``reader_state`` with the stream opened first if it is still to open (torchdata's iterator exists from
        ``iter(loader)`` on: a state asked for before the first batch holds it). The stream is then not opened
        again by the first pull; an ``__iter__`` that raises here fails the first batch instead."""
        try:
            with main_reader(*self.ranks):
                self._open_if_fresh()
        except Exception as exc:  # noqa: BLE001 - the first batch's failure, raised in its turn
            self._stream, self._open_error = None, exc
        return self.reader_state()

    def _open_if_fresh(self) -> None:
        """Open the stream if it is still to open (an exhausted one at once: nothing to pull)."""
        if self._fresh:
            self._fresh = False
            try:
                self._open()
            except StopIteration:
                self._stream = None

    def restore(self, state: Any, skip: int, epoch: int | None = None, pipe_seed: int | None = None) -> None:
        """Prepare this reader before its first sample: the dataset's ``set_epoch(epoch)`` (if given and it has one:
        this worker's copy reshuffles as the loader's epoch says; after the state when that holds no batch of this
        epoch), the saved reader ``state`` (``reader_state``'s dict, if given), then, a stream, skip ``skip`` batches. A map-style dataset's state is loaded before its first
        ``__getitem__``; a stream's at the next opening, in torchdata's order: the dataset's ``load_state_dict``,
        ``iter()``, then the iterator's ``load_state_dict`` (a state saved at the end of an epoch: then a fresh
        ``iter()`` for the epoch that follows). A torch ``IterDataPipe`` gets its share and its shufflers'
        seed (``pipe_seed``) as its stream opens."""
        self._restore = (state, skip, epoch, pipe_seed)

    def reader_state(self) -> dict[str, Any] | None:
        """This reader's state as of now, or None when neither the dataset nor its iterator keeps one: the
        ``state_dict()`` of the dataset (unless it is its own iterator) and of the stream's iterator (the one that
        ran out, after the end), and whether the stream ended. A copy: a dataset may keep updating the dict
        it returned while the worker runs ahead."""
        it: Any = self._stream if self._stream is not None else self._ended
        own = it is not None and it is self.dataset
        dataset = self.dataset.state_dict() if self.keeps_state and not own else None
        iterator = it.state_dict() if it is not None and keeps_state(it) else None
        if dataset is None and iterator is None:
            return None
        # The copy takes the pickle protocol (__reduce_ex__): what fails it here would fail a checkpoint too.
        try:
            return copy.deepcopy({"dataset": dataset, "iterator": iterator, "ended": self._ended is not None})
        except (TypeError, AttributeError, pickle.PicklingError, copy.Error) as exc:
            raise pickle.PicklingError(f"{type(exc).__name__}: {exc}") from exc

    def load_pending(self) -> None:
        """Load a map-style dataset's pending restore now (thread workers sharing it: before any of them reads)."""
        if self._restore is not None:
            self._load_dataset()

    def _load_dataset(self) -> tuple[dict[str, Any], int]:
        """The pending restore, taken: ``set_epoch``, a torch ``IterDataPipe``'s seed, then the dataset's saved
        state; what is left for a stream's opening: its saved state and the batches to skip.

        A state that holds no batch of this epoch (saved between epochs: its stream ran out, or the loader was set
        to another epoch after a ``break``) was taken before the epoch now told began, so the dataset gets it first
        and ``set_epoch`` after, the order the uninterrupted run had (a stream whose state holds its epoch, as
        ``ShardedTarStream``'s does, would otherwise go back to the epoch it was saved in)."""
        state, skip, epoch, pipe_seed = self._restore if self._restore is not None else (None, 0, None, None)
        self._restore = None
        saved = state if state is not None else {}
        set_epoch = epoch_setter(self.dataset)
        after = bool(saved.get("ended")) or not saved.get("batches")
        if epoch is not None and set_epoch is not None and not after:
            set_epoch(epoch)
        if pipe_seed is not None and self.pipe is not None:
            prepare_datapipe(self.dataset, pipe_seed, self.pipe[0], self.pipe[1])
        if saved.get("dataset") is not None:
            self.dataset.load_state_dict(saved["dataset"])
        if epoch is not None and set_epoch is not None and after:
            set_epoch(epoch)
        return saved, skip

    def _open(self) -> None:
        saved, skip = self._load_dataset()
        stream: Any = iter(self.dataset)
        if saved.get("iterator") is not None:
            stream.load_state_dict(saved["iterator"])
        if saved.get("ended") and saved.get("batches"):  # it ran out in this very epoch (on a short batch): done
            self._stream, self._ended = None, stream
            return
        if saved.get("ended") and saved.get("iterator") is not None:
            stream = iter(self.dataset)  # the saved epoch had ended: this one starts afresh, from that state
        self._stream = stream
        for _ in range(skip):  # the delivered turns again, one pull each: a turn that failed fails again, unraised
            try:
                self._pull_batch()
            except StreamEnd:
                break
            except Exception:  # noqa: BLE001 - its error reached the caller in the saved run
                pass

    def _pull(self) -> Any:
        if self._open_error is not None:
            error, self._open_error = self._open_error, None
            raise error
        self._open_if_fresh()
        if self._stream is None:
            raise StreamEnd
        try:
            return next(self._stream)
        except StopIteration:
            self._stream, self._ended = None, self._stream
            raise StreamEnd from None

    def pull(self) -> list[Any] | Any:
        """The samples of the stream's next batch (one sample when not batching); ``StreamEnd`` if none."""
        with main_reader(*self.ranks):
            return self._pull_batch()

    def _pull_batch(self) -> list[Any] | Any:
        if not self.batched:
            return self._pull()
        size = self.batch_size or 1
        out: list[Any] = []
        try:
            while len(out) < size:
                out.append(self._pull())
        except StreamEnd:
            if not out or self.drop_last:
                raise
        return out

    def samples(self, indices: Keys | None) -> Any:
        """A task's samples: by index, or the stream's next batch when ``indices`` is None."""
        if self.bad:
            self.bad = []
        if indices is None:
            return self.pull()
        if not self.batched:
            key = indices.tolist()[0] if isinstance(indices, np.ndarray) else indices[0]
            if self._restore is not None:
                self._load_dataset()
            self.current = key
            try:
                sample = self.dataset[key]
            except BAD_SAMPLE_ERRORS as exc:
                if not self.skip_bad:
                    raise
                self._note_bad(key, exc)
                self.current = None
                raise AllBad from None
            self.current = None
            return sample
        return self.fetch(indices)

    # -- batches

    def batch_of(self, samples: Any, indices: Keys | None, seed: int) -> Any:
        """Collate (or, unbatched, pass through ``collate_fn``) and transform."""
        return self._transform(self._collate(samples, indices), seed)

    def _collate(self, samples: Any, indices: Keys | None) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        return collate(samples, indices) if self.batched else samples

    def _transform(self, batch: Any, seed: int) -> Any:
        return self.batch_transform(batch, seed) if self.batch_transform is not None else batch

    def make(self, indices: Keys | None, seed: int) -> Any:
        """A new batch in fresh arrays."""
        samples = self.samples(indices)
        return self.batch_of(samples, self.kept if self.bad and self.batched else indices, seed)

    def produce(self, indices: Keys | None, seed: int, layout: SlotLayout | None,
                views: Callable[[int], list[np.ndarray]] | None) -> InSlot | Loose:
        """Make a task's batch into the slot whose field views ``views(rows)`` gives, if it fits there.

        ``times`` then holds the seconds it spent fetching, collating (copying into the slot
        included) and in ``batch_transform``: the per-stage figures of ``loader.stats()``.
        """
        t0 = time.perf_counter()
        samples = self.samples(indices)
        t1 = time.perf_counter()
        if self.bad and self.batched:
            indices = self.kept  # the batch is shorter by the samples left out
        rows = len(samples) if self.batched else 0
        if (views is not None and layout is not None and self.batched and self.collate_fn is None
                and self.batch_transform is None and 0 < rows <= layout.rows and layout.takes_samples):
            try:
                made = InSlot(rows, collate_into(samples, indices, layout.treedef, views(rows)))
                self.times = StageTimes(fetch_s=t1 - t0, collate_s=time.perf_counter() - t1)
                return made
            except BatchLayoutError:
                pass  # the samples may agree among themselves: collated below, or named there if not
        batch = self._collate(samples, indices)
        t2 = t3 = time.perf_counter()
        if self.batch_transform is not None:
            batch = self.batch_transform(batch, seed)
            t3 = time.perf_counter()
        out: InSlot | Loose = Loose(rows, batch)
        if views is not None and layout is not None:
            treedef, arrays, objects = split(batch)
            if layout.fits(treedef, arrays, rows):
                for dst, src in zip(views(rows), arrays):
                    np.copyto(dst, src)
                out = InSlot(rows, objects)
        transform_s = t3 - t2 if self.batch_transform is not None else 0.0
        self.times = StageTimes(fetch_s=t1 - t0, collate_s=t2 - t1 + time.perf_counter() - t3, transform_s=transform_s)
        return out

    def failed_index(self, exc: BaseException) -> Any:
        """The dataset key of the sample ``exc`` failed on: the one being read, else the one the error names (a
        batch read whole by ``__getitems__``, whose ``CorruptImageError`` says which of its samples)."""
        if isinstance(exc, BatchLayoutError) or self.current is None:
            return getattr(exc, "sample_index", None)
        return self.current


def make_worker_error(report: ErrorReport, *, worker_id: int | None, pid: int, batch_index: int | None,
                      original: type | None = None, stage: str = "worker_init_fn", where: str | None = None) -> WorkerError:
    """The error the caller sees for a failed batch: where, which batch and sample, the original type and
    traceback. It is an instance of the original type too (``original``, else the report's class) where
    that type can be built from a message, so ``except KeyError`` around the loop catches it, as with PyTorch."""
    if where is None:  # a pool names its workers itself: a thread's pid is the main process's
        where = f"the main process (pid {pid})" if worker_id is None else f"loader worker {worker_id} (pid {pid})"
    what = f"batch {batch_index}" if batch_index is not None else stage
    index = report.sample_index
    at = f" at sample index {index if isinstance(index, (int, np.integer)) else repr(index)}" if index is not None else ""
    msg = (f"{where} failed on {what}{at}: {report.exc_type}: {report.message}\n\n"
           f"Original traceback:\n{report.traceback}")
    err = as_worker_error(original if original is not None else report.exception_class(), msg,
                          worker_id=worker_id, pid=pid, batch_index=batch_index, sample_index=report.sample_index,
                          exc_type=report.exc_type, traceback_text=report.traceback)
    if report.pickled is not None:
        try:
            err.__cause__ = pickle.loads(report.pickled)
        except Exception:  # noqa: BLE001 - the text above is the contract, the object a bonus
            pass
    return err
