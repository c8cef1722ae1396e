"""What a tuned worker count depends on: the fingerprint a saved pick is keyed by.

The NWT paper treats its pick as a system-wide parameter: the same machine loading similar data
should not search again. So a result is keyed by a fingerprint of

* the machine: CPU model, usable cores, memory (whole GiB), GPU name and its PCIe link
  (maximum generation and width: the current link drops to Gen1 when the GPU idles, so it would
  change the key from one run to the next);
* the work: the dataset (its type's qualified name, and the folder or file it reads where it names one:
  ``dataset_name``), bytes of one sample as the dataset returns it, batch size, the batch transform's and
  the dataset's per-sample transform's qualified names, prefetch factor, pin_memory, the device the
  batches go to, how many ranks share this node's CPUs (the local world size: each rank tunes within
  its share), and the training step the pick was tuned beside, where one was.

"Similar data" (the paper: re-use "if the transmitted size is similar") is a lookup that accepts
the same machine and the same work except a sample size within ``SIMILAR_RATIO`` of the saved one.

Sizing a sample is the only dataset read the fingerprint makes, in the calling (main) process:
``dataset[0]``, once. A sample that cannot be read there (a corrupt first image the loader would
skip with ``on_bad_sample="skip"``) must not stop a loader whose workers would pass it over, so the
next samples are tried, up to ``SIZING_TRIES`` in all; ``sized_by`` records which one sized it
(``"sample 3"``), or, when none of them can be read, that none did, with the dataset's type and
length, and ``sample_bytes`` is 0. ``sized_by`` is ``None`` when sample 0 sized it, and then left out
of the key (``_digest``); a key with it stays the same for as long as the same samples are unreadable,
and similar-work lookups ignore it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import psutil

from .. import cuda, system
from ..data.contract import map_length
from ..errors import ArgumentError, SavedPickError
from .schema import build, check_fingerprint

SIMILAR_RATIO = 1.25
SIZING_TRIES = 8
WRAPS = "cupy_nwt_wraps"  # the attribute by which a wrapper of ours names the user's callable inside it
MAX_BOUND_CHARS = 200  # a partial's bound arguments kept in its name; the schema takes names of 1000
_log = logging.getLogger("cupy_nwt.tuner")


@dataclass(frozen=True)
class MachineFingerprint:
    cpu_model: str
    usable_cpus: int
    memory_gib: int
    gpu_name: str | None
    pcie: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WorkFingerprint:
    sample_bytes: int
    batch_size: int
    transform: str | None
    prefetch_factor: int
    pin_memory: bool | str
    device: str
    local_world_size: int = 1
    sample_transform: str | None = None
    step: str | None = None
    sized_by: str | None = None
    dataset: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Fingerprint:
    machine: MachineFingerprint
    work: WorkFingerprint

    @property
    def key(self) -> str:
        """A short stable hash of every field: the exact-match key in the store."""
        return _digest(self.to_dict())

    def similar_to(self, other: "Fingerprint", ratio: float = SIMILAR_RATIO) -> bool:
        """Same machine, same work except a sample size within ``ratio`` either way."""
        if self.machine != other.machine:
            return False
        a, b = self.work, other.work
        rest = [f.name for f in fields(WorkFingerprint) if f.name not in ("sample_bytes", "sized_by")]
        if any(getattr(a, n) != getattr(b, n) for n in rest):
            return False
        lo, hi = sorted((a.sample_bytes, b.sample_bytes))
        return lo > 0 and hi / lo <= ratio

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine.to_dict(), "work": self.work.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Fingerprint":
        try:
            check_fingerprint(d)
            return cls(build(MachineFingerprint, d["machine"]), build(WorkFingerprint, d["work"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SavedPickError(f"not a cupy_nwt fingerprint: {exc}") from None


_KEYED_WHEN_SET = ("sample_transform", "step", "sized_by", "dataset")


def _digest(obj: Any) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("work"), dict):
        # these fields are keyed only when set: work that leaves them unset has the key of its other fields
        obj = {**obj, "work": {k: v for k, v in obj["work"].items() if not (k in _KEYED_WHEN_SET and v is None)}}
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_fingerprint() -> MachineFingerprint:
    """This machine as the tuner sees it; the GPU part is empty without a usable GPU."""
    gpu_name = pcie = None
    if cuda.gpu_status().available:
        info = cuda.device_info(0)
        gpu_name = info.name
        if info.link is not None and info.link.max_gen is not None:
            pcie = f"Gen{info.link.max_gen} x{info.link.max_width}"
    return MachineFingerprint(
        cpu_model=system.cpu_model(),
        usable_cpus=system.usable_cpus(),
        memory_gib=round(psutil.virtual_memory().total / 2**30),
        gpu_name=gpu_name,
        pcie=pcie,
    )


def device_kind(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is usable, else 'cpu'; 'cuda:N' -> 'cuda' (same machine, same work)."""
    if device == "auto":
        return "cuda" if cuda.gpu_status().available else "cpu"
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return "cuda"
    if device not in ("cuda", "cpu"):
        raise ArgumentError(f"device must be 'cuda', 'cuda:N', 'cpu' or 'auto', got {device!r}")
    return device


def sample_nbytes(sample: Any) -> int:
    """Bytes of one sample: arrays by size, Python scalars as the 8-byte values collate makes."""
    if isinstance(sample, Mapping):
        return sum(sample_nbytes(v) for v in sample.values())
    if isinstance(sample, (tuple, list)):
        return sum(sample_nbytes(v) for v in sample)
    if isinstance(sample, (bytes, bytearray, memoryview)):
        return len(sample)
    return int(np.asarray(sample).nbytes)


def transform_name(transform: Any) -> str | None:
    """Qualified name of a transform's class (or of a function): its identity across processes.

    A ``functools.partial`` is its function's name with the arguments it binds (``f(seconds=0.05)``), and a
    lambda's name carries its first line (``__main__.<lambda>:12``): every partial, and every lambda of a
    module, would otherwise share one name, and a pick tuned for one be reused for another.
    """
    if transform is None:
        return None
    wrapped = getattr(transform, WRAPS, None)
    if wrapped is not None:  # a wrapper of this package's around the user's callable: named as that callable
        return transform_name(wrapped)
    if isinstance(transform, functools.partial):
        return f"{transform_name(transform.func)}({_bound_arguments(transform)})"
    target = transform if isinstance(transform, type) or inspect.isroutine(transform) else type(transform)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    if inspect.isfunction(target) and target.__name__ == "<lambda>":
        name += f":{target.__code__.co_firstlineno}"
    return name


def _bound_arguments(p: functools.partial[Any]) -> str:
    """A partial's bound arguments as their reprs, less the memory addresses that differ from run to run; past
    ``MAX_BOUND_CHARS`` cut short, with a digest of the whole so that long ones still differ."""
    text = ", ".join([*map(repr, p.args), *(f"{k}={v!r}" for k, v in p.keywords.items())])
    text = re.sub(r" at 0x[0-9A-Fa-f]+", "", text)
    if len(text) > MAX_BOUND_CHARS:
        text = f"{text[:MAX_BOUND_CHARS]}... #{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    return text


def work_fingerprint(dataset: Any, *, batch_size: int, batch_transform: Any = None, prefetch_factor: int = 2,
                     pin_memory: bool | str = True, device: str = "auto",
                     local_world_size: int = 1, step: Any = None) -> WorkFingerprint:
    """The work a worker count is tuned for; reads ``dataset[0]`` once to size a sample (the next
    ones where it cannot be read: see the module docstring).

    A dataset that applies a per-sample transform says so by a ``transform`` attribute (the
    datasets of ``cupy_nwt.data`` and torchvision's do): its qualified name is recorded, so a
    pick tuned on raw samples is not reused for a decoded-and-augmented pipeline, or the reverse.
    ``step`` (the training step a pick was tuned beside, ``tune_num_workers(step=...)``) is recorded
    as its time ("0.005 s") or its qualified name: a count that feeds a 50-ms step may starve a 5-ms one.
    The dataset itself is recorded too (:func:`dataset_name`): an in-memory array's pick of 0 workers would
    starve a dataset that reads a file per sample, though both return samples of one size.
    """
    n = map_length(dataset, "fingerprinting the work")
    if n == 0:
        raise ArgumentError("cannot fingerprint an empty dataset")
    sample_bytes, sized_by = _sample_size(dataset, n)
    return WorkFingerprint(
        sample_bytes=sample_bytes,
        sized_by=sized_by,
        batch_size=int(batch_size),
        transform=transform_name(batch_transform),
        prefetch_factor=int(prefetch_factor),
        pin_memory=pin_memory if isinstance(pin_memory, str) else bool(pin_memory),
        device=device_kind(device),
        local_world_size=int(local_world_size),
        sample_transform=transform_name(getattr(dataset, "transform", None)),
        step=step_name(step),
        dataset=dataset_name(dataset),
    )


def dataset_name(dataset: Any) -> str:
    """The dataset as a pick is keyed by: its type's qualified name, and where it names the folder or file it
    reads (``root``, else ``path``: the datasets of ``cupy_nwt.data``, torchvision's), that path made absolute,
    so a script run from another folder finds the pick (a URL is kept as it is)."""
    name = transform_name(dataset) or "?"
    for attr in ("root", "path"):
        source = getattr(dataset, attr, None)
        if isinstance(source, (str, os.PathLike)):
            text = os.fsdecode(source)
            return f"{name} of {text if '://' in text else os.path.abspath(text)}"
    return name


def _sample_size(dataset: Any, n: int) -> tuple[int, str | None]:
    """Bytes of the first readable of samples 0..SIZING_TRIES-1, and ``sized_by`` (None for sample 0)."""
    tries = min(n, SIZING_TRIES)
    first: Exception | None = None
    for i in range(tries):
        try:
            size = sample_nbytes(dataset[i])
        except Exception as exc:  # noqa: BLE001 - a bad sample the workers may skip; said below, not raised
            first = first or exc
            continue
        if i:
            _log.info("fingerprint: samples 0..%d could not be read (%s: %s); sample %d sized the work",
                      i - 1, type(first).__name__, first, i)
        return size, None if i == 0 else f"sample {i}"
    _log.info("fingerprint: none of samples 0..%d could be read (%s: %s); keyed by the dataset's type and length",
              tries - 1, type(first).__name__, first)
    return 0, f"no sample (0..{tries - 1} unreadable): {transform_name(dataset)} of {n}"


def step_name(step: Any) -> str | None:
    """How a step is recorded in a fingerprint: its time in seconds, or the callable's qualified name."""
    if step is None:
        return None
    if callable(step):
        return transform_name(step)
    return f"{float(step):g} s"
