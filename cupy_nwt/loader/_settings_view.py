"""The loader's settings read back and set as PyTorch's DataLoader exposes them (``loader.num_workers``, ...).

A mixin of views over the frozen ``Options``: the loader owns the options and replaces them when a
settable attribute is set (checked as the constructor checks it), so each view reads the current ones
and holds nothing itself; the attributes PyTorch fixes at construction stay fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ArgumentError
from ..ranks import RankLayout
from ._options import Options, changed
from .ring.collate import default_collate, torch_default_collate
from .ring.frameworks import AUTO_TORCH

_FIXED = frozenset({"batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"})
_SETTABLE = frozenset({"num_workers", "worker_type", "prefetch_factor", "pin_memory", "collate_fn", "batch_transform",
                       "worker_init_fn", "timeout", "in_order", "zero_copy", "device", "device_id", "seed",
                       "stall_warning_s", "rank_layout", "output", "pin_memory_device", "generator"})


class SettingsView:
    """``DataLoader``'s attributes that mirror its arguments, each read from ``self._options`` and, where
    PyTorch lets it be set, set by replacing them."""

    _options: Options
    _runtime: Any  # the loader's ``Runtime``: its GPUs are what ``device`` is checked against

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and getattr(self, "_initialized", False):
            raise ArgumentError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        if name in _SETTABLE:  # as PyTorch allows; checked as the constructor checks it; the next iteration uses it
            # (device, pin_memory and output too: ``Runtime.follow``)
            object.__setattr__(self, "_options", changed(self._options, name, value, self._runtime.ops))
            return
        super().__setattr__(name, value)

    @property
    def multiprocessing_context(self) -> Any:
        return self._options.multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, value: Any) -> None:
        object.__setattr__(self, "_options", self._options.with_context(value))

    @property
    def options(self) -> Options:
        """The settings as resolved and checked at construction (frozen; setting an attribute replaces them)."""
        return self._options

    @property
    def dataset(self) -> Any:
        return self._options.dataset

    @property
    def num_workers(self) -> int:
        return self._options.num_workers

    @property
    def worker_type(self) -> str:
        return self._options.worker_type

    @property
    def prefetch_factor(self) -> int:
        return self._options.prefetch_factor

    @property
    def pin_memory(self) -> bool | str:
        return self._options.pin_memory

    @property
    def collate_fn(self) -> Callable | None:
        """What makes a batch of samples: yours, else ``default_collate`` (``torch_default_collate`` where the
        batches come as tensors: a program that uses torch, ``output="auto"``); None unbatched (``batch_size=None``),
        where a sample reaches you as ``__getitem__`` returned it."""
        if self._options.collate_fn is None and self._options.sampling.batched:
            return torch_default_collate if self._options.joined_output == AUTO_TORCH else default_collate
        return self._options.collate_fn

    @property
    def batch_transform(self) -> Callable | None:
        return self._options.batch_transform

    @property
    def worker_init_fn(self) -> Callable | None:
        return self._options.worker_init_fn

    @property
    def persistent_workers(self) -> bool:
        return self._options.persistent_workers

    @property
    def timeout(self) -> float:
        """Seconds each wait for a batch may take; 0: no limit (PyTorch's default, read back as it reads it)."""
        return self._options.timeout or 0

    @property
    def generator(self) -> Any:
        """The ``generator`` given, as given (the loader drew its seed from it once, when it was made)."""
        return self._options.generator

    @property
    def in_order(self) -> bool:
        return self._options.in_order

    @property
    def zero_copy(self) -> bool:
        return self._options.zero_copy

    @property
    def device(self) -> str:
        return self._options.device

    @property
    def output(self) -> str:
        return self._options.output

    @property
    def pin_memory_device(self) -> str:
        return self._options.pin_memory_device

    @property
    def device_id(self) -> int | None:
        return self._options.device_id

    @property
    def seed(self) -> int:
        return self._options.seed

    @property
    def stall_warning_s(self) -> float | None:
        return self._options.stall_warning_s

    @property
    def snapshot_every_n_steps(self) -> int | None:
        return self._options.snapshot_every_n_steps

    @property
    def rank_layout(self) -> RankLayout:
        return self._options.rank_layout

    @property
    def rank(self) -> int:
        return self._options.rank

    @property
    def world_size(self) -> int:
        return self._options.world_size

    @property
    def batch_size(self) -> int | None:
        return self._options.sampling.batch_size

    @property
    def drop_last(self) -> bool:
        return self._options.sampling.drop_last
