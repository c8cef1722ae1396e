"""What a dataset must provide, written once, and the one place that asks a dataset what it provides.

Two styles, as in PyTorch (and Grain's ``RandomAccessDataSource`` for the first):

* ``MapDataset``: ``__len__`` and ``__getitem__(index)``; ``BatchedMapDataset`` adds the optional
  ``__getitems__(indices)``, which the loader then calls once per batch instead of ``__getitem__`` per
  sample (one read for many samples, as a database or a record file wants).
* ``StreamDataset``: ``__iter__`` (``__len__`` optional: ``len(loader)`` needs it). With workers every
  worker iterates its own copy and reads its share by ``cupy_nwt.get_worker_info()``. Optional:
  ``set_epoch(epoch)`` (reshuffle per epoch) and ``state_dict()`` / ``load_state_dict(state)`` (resume
  mid-epoch from where the stream stands rather than by skipping batches).

What crosses to a worker: under ``fork`` the dataset is inherited, never pickled; under
``forkserver`` and ``spawn`` it is pickled to every worker, together with ``collate_fn``,
``batch_transform`` and ``worker_init_fn``, so all of them must be picklable (defined at module level,
no lambdas, no open files or locks: reopen those lazily in the worker). ``pickling_advice`` says so
when it fails.

The loader (its sampling, its workers, resume) and the tuner call :func:`dataset_style`,
:func:`batch_getter`, :func:`epoch_setter`, :func:`stream_state_getter` and :func:`map_length`
rather than probing for methods themselves, so the contract above is checked in one place.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from ..errors import ArgumentError, ArgumentTypeError

T_co = TypeVar("T_co", covariant=True)
Style = Literal["map", "iterable"]

__all__ = ["BatchedMapDataset", "EpochAware", "IterableDataset", "MapDataset", "ResumableStream", "StreamDataset",
           "batch_getter", "dataset_style", "epoch_setter", "followed_epoch", "map_length", "own_epoch", "pickling_advice",
           "stream_state_getter"]


@runtime_checkable
class MapDataset(Protocol[T_co]):
    """Random access by index (any picklable key the sampler yields); a length for the loader's own sampler."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any, /) -> T_co: ...


@runtime_checkable
class BatchedMapDataset(MapDataset[T_co], Protocol[T_co]):
    """A map-style dataset that reads a whole batch's samples at once; returns one sample per index, in order."""

    def __getitems__(self, indices: Sequence[Any], /) -> Sequence[T_co]: ...


@runtime_checkable
class StreamDataset(Protocol[T_co]):
    """Read front to back; each worker's copy reads its share (``get_worker_info()``)."""

    def __iter__(self) -> Iterator[T_co]: ...


@runtime_checkable
class EpochAware(Protocol):
    """A stream that reshuffles per epoch: the loader calls ``set_epoch`` on every worker's copy."""

    def set_epoch(self, epoch: int, /) -> None: ...


@runtime_checkable
class ResumableStream(Protocol):
    """A stream that can say where it stands and go back there (``DataLoader.state_dict`` keeps it)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> None: ...


class IterableDataset(Generic[T_co]):
    """Base class of a dataset read as a stream: subclasses define ``__iter__``.

    As in PyTorch, with ``num_workers > 0`` every worker iterates its own copy, so ``__iter__``
    should use ``cupy_nwt.get_worker_info()`` (``id``, ``num_workers``, and beyond PyTorch ``rank``
    and ``world_size``) to read only its share; without that, each worker yields the whole stream.
    ``__len__`` is optional: ``len(loader)`` needs it.
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _is_torch_iterable(cls: type) -> bool:
    # torch's IterableDataset inherits a __getitem__ that only raises: its name decides, without importing torch
    return any(c.__name__ == "IterableDataset" and c.__module__.startswith("torch.utils.data") for c in cls.__mro__)


def dataset_style(dataset: Any) -> Style:
    """"iterable" (derives from an ``IterableDataset``, or has ``__iter__`` and no ``__getitem__``/``__getitems__``)
    or "map" (has either); ``ArgumentError`` (a ``ValueError``) for an object that is neither.

    Args:
        dataset: any object offered as a dataset.
    """
    if isinstance(dataset, IterableDataset) or _is_torch_iterable(type(dataset)):
        return "iterable"
    if hasattr(dataset, "__getitem__") or hasattr(dataset, "__getitems__"):
        return "map"
    if hasattr(dataset, "__iter__"):
        return "iterable"
    raise ArgumentError(f"the dataset must be map-style (a length and __getitem__) or iterable-style "
                        f"(__iter__); {type(dataset).__name__} is neither")


def batch_getter(dataset: Any) -> Callable[[Sequence[Any]], Sequence[Any]] | None:
    """The dataset's ``__getitems__`` (one call per batch), or None: the loader calls ``__getitem__`` per sample."""
    return getattr(dataset, "__getitems__", None)


def epoch_setter(dataset: Any) -> Callable[[int], None] | None:
    """The dataset's ``set_epoch``, or None when it has none."""
    set_epoch = getattr(dataset, "set_epoch", None)
    return set_epoch if callable(set_epoch) else None


def own_epoch(dataset: Any) -> int | None:
    """The epoch a dataset with ``set_epoch`` reads back as ``epoch`` (Hugging Face's ``IterableDataset``,
    ``ShardedTarStream``, most written by hand): what a training loop's own ``set_epoch`` left there. None
    where there is none to read."""
    if epoch_setter(dataset) is None:
        return None
    value = getattr(dataset, "epoch", None)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return None
    return int(value) if int(value) >= 0 else None


def followed_epoch(dataset: Any, epoch: int, left: int | None) -> int:
    """The epoch a stream's next iteration runs: the loader's ``epoch``, unless the dataset reads back another
    than ``left`` (what the last iteration left there; None before the first, when 0 is a fresh dataset's): the
    caller's own ``set_epoch`` put it there, and it wins.

    The dataset (the main process's) is told that epoch here, before any worker's copy is: an epoch kept in
    memory the workers share (Hugging Face's ``IterableDataset``) then reads back what the loader left, not a
    change of the caller's, and the workers' own ``set_epoch`` finds it set, where several at once would race
    its read-modify-write into epochs that differ between them (samples repeated, others lost). A
    ``set_epoch`` that raises leaves the loader where it was: the next iteration tries that epoch again."""
    told = own_epoch(dataset)
    chosen = told if told is not None and told != (left or 0) else epoch
    set_epoch = epoch_setter(dataset)
    if set_epoch is not None and told != chosen:
        set_epoch(chosen)
    return chosen


def stream_state_getter(dataset: Any) -> Callable[[], Any] | None:
    """The dataset's ``state_dict``, or None: a resumed stream is then skipped forward batch by batch."""
    get = getattr(dataset, "state_dict", None)
    return get if callable(get) else None


def map_length(dataset: Any, needed_by: str) -> int:
    """``len(dataset)`` of a map-style dataset, for what needs it (the tuner, a resume); a one-line error if
    the dataset is a stream or has no length."""
    if dataset_style(dataset) != "map":
        raise ArgumentError(f"{needed_by} needs a map-style dataset (a length and __getitem__); "
                            f"{type(dataset).__name__} is iterable-style")
    try:
        return len(dataset)
    except TypeError:
        raise ArgumentTypeError(f"{needed_by} needs the dataset's length; {type(dataset).__name__} has no "
                                "__len__") from None


def pickling_advice(method: str, exc: BaseException) -> str:
    """Why a worker could not start under ``forkserver``/``spawn``, and what to do about it."""
    return (f"start method {method!r} sends the dataset, collate_fn, batch_transform and worker_init_fn to each "
            f"worker by pickling, and that failed: {exc}. Define them at module level, or use "
            "multiprocessing_context='fork' where CUDA is not initialised in this process")
