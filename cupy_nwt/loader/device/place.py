"""Where a loader's batches land: the device it resolves to, and running its GPU steps on that device."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Generator, Iterator
from typing import Any, Protocol

import numpy as np

from ... import cuda
from ...errors import ArgumentError
from ...ranks import RankLayout, device_for_rank

_DEVICES = ("auto", "cuda", "cpu", "cuda:N")


class _Scopes(Protocol):
    def device_scope(self, device_id: int) -> contextlib.AbstractContextManager[Any]: ...


def device_scope(device_id: int | None, ops: _Scopes | None = None) -> contextlib.AbstractContextManager:
    """``device_id`` current inside the block (through ``ops``, else ``cupy_nwt.cuda``); nothing to switch
    for a loader without a GPU of its own."""
    if device_id is None:
        return contextlib.nullcontext()
    return ops.device_scope(device_id) if ops is not None else cuda.device_scope(device_id)


def on_device(batches: Generator[Any, None, None], device_id: int | None, ops: _Scopes | None = None) -> Iterator[Any]:
    """Run each step of ``batches`` with this loader's GPU current; hand each batch out outside it.

    So a rank's streams, events, copies and batch allocations all live on its device, while the
    caller's code between batches runs on whatever device the caller made current.
    """
    try:
        while True:
            with device_scope(device_id, ops):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
            yield batch
    finally:
        with device_scope(device_id, ops):
            batches.close()


class _Counts(Protocol):
    def device_count(self) -> int: ...


def resolve_device(device: Any, layout: RankLayout, gpus: _Counts | None = None) -> tuple[str, int | None]:
    """``("cuda", index)`` or ``("cpu", None)`` from "auto", "cuda", "cuda:N" or "cpu".

    ``gpus`` (a loader's own CUDA ops) stands for the machine's GPUs: "auto" then means "cuda".
    """
    m = re.fullmatch(r"cuda:(\d+)", device) if isinstance(device, str) else None
    if not (m or device in ("auto", "cuda", "cpu")):
        raise ArgumentError(f"device must be one of {', '.join(_DEVICES)}; got {device!r}")
    if device == "cpu" or (device == "auto" and gpus is None and not cuda.gpu_status().available):
        return "cpu", None
    if gpus is None:
        cuda.require_gpu()
    count = gpus.device_count() if gpus is not None else cuda.device_count()
    if m is None:
        return "cuda", device_for_rank(layout, count)
    index = int(m.group(1))
    if index >= count:
        raise ArgumentError(f"device={device!r}, but this process sees {count} CUDA device(s): 0..{count - 1} "
                         "(CUDA_VISIBLE_DEVICES renumbers them)")
    return "cuda", index


def readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v
