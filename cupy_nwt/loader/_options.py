"""The loader's process options, checked as PyTorch checks them: the multiprocessing context, the
worker count against the usable CPUs, ``timeout``, the seed a ``generator`` gives and ``pin_memory``.
"""

from __future__ import annotations

import multiprocessing as mp
import warnings
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from .._checks import check_int, check_number
from ..system import usable_cpus
from ._frameworks import generator_seed


def resolve_context(multiprocessing_context: Any, start_method: str | None, num_workers: int) -> BaseContext | None:
    """The context the workers start from: None for the loader's default, else a context object.

    ``multiprocessing_context`` takes a start method's name or a context, and only with workers (a
    ValueError otherwise, as in PyTorch); ``start_method`` is this package's older name for it.
    """
    if multiprocessing_context is not None and start_method is not None:
        raise ValueError("give multiprocessing_context or start_method, not both")
    if start_method is not None:
        if start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, got {start_method!r}")
        return mp.get_context(start_method)
    if multiprocessing_context is None:
        return None
    if num_workers == 0:
        raise ValueError("multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                         f"but got num_workers={num_workers}")
    if isinstance(multiprocessing_context, str):
        methods = mp.get_all_start_methods()
        if multiprocessing_context not in methods:
            raise ValueError(f"multiprocessing_context option should specify a valid start method in {methods!r}, "
                             f"but got multiprocessing_context={multiprocessing_context!r}")
        return mp.get_context(multiprocessing_context)
    if not isinstance(multiprocessing_context, BaseContext):
        raise TypeError("multiprocessing_context option should be a valid context object or a string specifying "
                        f"the start method, but got multiprocessing_context={multiprocessing_context!r}")
    return multiprocessing_context


def warn_if_too_many_workers(num_workers: int, stacklevel: int = 3) -> None:
    """A UserWarning, as PyTorch gives, when there are more workers than CPUs this process may use."""
    cpus = usable_cpus()
    if num_workers > cpus:
        warnings.warn(f"this DataLoader will start {num_workers} worker processes, more than the {cpus} CPUs this "
                      "process may use: the workers will share them, which is slower and may even stall; "
                      f"num_workers={cpus} or fewer avoids that", UserWarning, stacklevel=stacklevel)


def resolve_timeout(timeout: Any) -> float | None:
    """Seconds to wait for a batch, or None for no limit (``timeout=0``, PyTorch's default, or None)."""
    value = check_number("timeout", timeout, ge=0, optional=True, unit="seconds")
    return value or None


def seed_from(seed: Any, generator: Any) -> int | None:
    """The loader's seed from ``seed`` or ``generator``: an int, or a NumPy or torch Generator drawn from
    once, here (torch draws its base seed from it per iteration: the same generator state gives the
    same seed, so the same epochs; the epoch order itself is this loader's, not ``torch.randperm``'s)."""
    seed = check_int("seed", seed, ge=0, optional=True)
    if generator is None:
        return seed
    if seed is not None:
        raise ValueError("give seed or generator, not both")
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 2**63 - 1))
    drawn = generator_seed(generator)
    if drawn is not None:
        return drawn
    return check_int("generator", generator, ge=0, also="a numpy.random.Generator or a torch.Generator")


PIN_WITHOUT_GPU = ("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                   "won't be used.")  # torch's words, so a filter written for torch's warning catches ours


def check_pin_memory(pin_memory: Any, pin_memory_device: Any, device: str, stacklevel: int = 3) -> None:
    """``pin_memory`` and torch's ``pin_memory_device``, with torch's warnings: pinning without a GPU
    does nothing; ``pin_memory_device`` is ignored (the loader pins for its ``device``)."""
    if pin_memory not in (True, False, "staging"):
        raise ValueError(f"pin_memory must be True, False or 'staging', got {pin_memory!r}")
    if not isinstance(pin_memory_device, str):
        raise ValueError(f"pin_memory_device must be a str, got {type(pin_memory_device).__name__}")
    if pin_memory and pin_memory_device:
        warnings.warn(f"pin_memory_device is ignored (as torch now ignores it): memory is pinned for device={device!r}; "
                      f"ignore pin_memory_device={pin_memory_device!r}.", UserWarning, stacklevel=stacklevel)
    if pin_memory and device == "cpu":
        warnings.warn(PIN_WITHOUT_GPU, UserWarning, stacklevel=stacklevel)
