"""Iterable-style datasets: streams (tar shards, object stores, generators) read front to back.

A dataset is iterable-style when it derives from ``IterableDataset`` (this package's or PyTorch's:
the latter inherits a ``__getitem__`` that only raises, so its name decides, without importing
torch), or when it has ``__iter__`` and no ``__getitem__`` (nor ``__getitems__``); map-style when it
has ``__getitem__`` or ``__getitems__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T_co = TypeVar("T_co", covariant=True)


class IterableDataset(Generic[T_co]):
    """Base class of a dataset read as a stream: subclasses define ``__iter__``.

    As in PyTorch, with ``num_workers > 0`` every worker iterates its own copy, so ``__iter__``
    should use ``cupy_nwt.get_worker_info()`` (``id``, ``num_workers``, and beyond PyTorch ``rank``
    and ``world_size``) to read only its share; without that, each worker yields the whole stream.
    ``__len__`` is optional: ``len(loader)`` needs it.
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def dataset_kind(dataset: Any) -> str:
    """"iterable" or "map"; ValueError for an object that is neither."""
    if isinstance(dataset, IterableDataset) or any(
            c.__name__ == "IterableDataset" and c.__module__.startswith("torch.utils.data") for c in type(dataset).__mro__):
        return "iterable"
    if hasattr(dataset, "__getitem__") or hasattr(dataset, "__getitems__"):
        return "map"
    if hasattr(dataset, "__iter__"):
        return "iterable"
    raise ValueError(f"the dataset must be map-style (a length and __getitem__) or iterable-style (__iter__); "
                     f"{type(dataset).__name__} is neither")
