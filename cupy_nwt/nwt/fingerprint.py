"""What a tuned worker count depends on, and the machine-wide store that keeps it.

The NWT paper treats its pick as a system-wide parameter: the same machine loading similar data
should not search again. So a result is keyed by a fingerprint of

* the machine: CPU model, usable cores, memory (whole GiB), GPU name and its PCIe link
  (maximum generation and width: the current link drops to Gen1 when the GPU idles, so it would
  change the key from one run to the next);
* the work: bytes of one sample as the dataset returns it, batch size, the batch transform's
  qualified name, prefetch factor, pin_memory, the device the batches go to, and how many ranks
  share this node's CPUs (the local world size: each rank tunes within its share).

"Similar data" (the paper: re-use "if the transmitted size is similar") is a lookup that accepts
the same machine and the same work except a sample size within ``SIMILAR_RATIO`` of the saved one.

The store is one JSON file in ``platformdirs.user_cache_dir("cupy_nwt")`` (or ``CUPY_NWT_CACHE_DIR``,
or an explicit directory). Every update is read-modify-write under a ``filelock`` lock and lands by
``os.replace`` of a fully written temporary file, so concurrent tuners never lose each other's
results and a reader never sees half a file. What is read back is checked before it is used
(``schema.py``): a file that cannot be read or does not validate is set aside, renamed
``num_workers.json.bad-<UTC time>``, with one warning naming it and why, and the store starts empty.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from filelock import FileLock

from .. import cuda, system
from .._reporting.tables import atomic_open
from ..data.contract import map_length
from ..errors import ArgumentError, MissingPathError
from ..system import cache_dir
from .schema import MAX_STORE_BYTES, SavedPickError, check_fingerprint, parse_document

STORE_NAME = "num_workers.json"
STORE_FORMAT = "cupy_nwt.num_workers/1"
SIMILAR_RATIO = 1.25
LOCK_TIMEOUT_S = 60.0
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
        rest = [f.name for f in fields(WorkFingerprint) if f.name != "sample_bytes"]
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
            return cls(MachineFingerprint(**d["machine"]), WorkFingerprint(**d["work"]))
        except (KeyError, TypeError, SavedPickError) as exc:
            raise SavedPickError(f"not a cupy_nwt fingerprint: {exc}") from None


def _digest(obj: Any) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("work"), dict) and obj["work"].get("sample_transform") is None:
        # keys made before sample transforms were recorded stay the same for work without one
        obj = {**obj, "work": {k: v for k, v in obj["work"].items() if k != "sample_transform"}}
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
    """Qualified name of a transform's class (or of a function): its identity across processes."""
    if transform is None:
        return None
    target = transform if isinstance(transform, type) or inspect.isroutine(transform) else type(transform)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def work_fingerprint(dataset: Any, *, batch_size: int, batch_transform: Any = None, prefetch_factor: int = 2,
                     pin_memory: bool | str = True, device: str = "auto",
                     local_world_size: int = 1) -> WorkFingerprint:
    """The work a worker count is tuned for; reads ``dataset[0]`` once to size a sample.

    A dataset that applies a per-sample transform says so by a ``transform`` attribute (the
    datasets of ``cupy_nwt.data`` and torchvision's do): its qualified name is recorded, so a
    pick tuned on raw samples is not reused for a decoded-and-augmented pipeline, or the reverse.
    """
    if map_length(dataset, "fingerprinting the work") == 0:
        raise ArgumentError("cannot fingerprint an empty dataset")
    return WorkFingerprint(
        sample_bytes=sample_nbytes(dataset[0]),
        batch_size=int(batch_size),
        transform=transform_name(batch_transform),
        prefetch_factor=int(prefetch_factor),
        pin_memory=pin_memory if isinstance(pin_memory, str) else bool(pin_memory),
        device=device_kind(device),
        local_world_size=int(local_world_size),
        sample_transform=transform_name(getattr(dataset, "transform", None)),
    )


def _lock(path: Path) -> FileLock:
    return FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)


def _write_atomic(path: Path, obj: Any) -> None:
    with atomic_open(path) as f:
        f.write((json.dumps(obj, indent=2) + "\n").encode("utf-8"))


def _read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        data = f.read(MAX_STORE_BYTES + 1)
    try:
        return parse_document(data)
    except SavedPickError as exc:
        raise SavedPickError(f"{path}: {exc}") from None


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write one JSON document by atomic replace: a reader sees the old or the new file, never half.

    No lock (and no lock file beside it): a single document has no read-modify-write to protect.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(p, obj)
    return p


def read_json(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    if not p.is_file():
        raise MissingPathError(f"no saved result at {p}")
    return _read_json(p)


class ResultStore:
    """The machine-wide file of tuned results, one record (a JSON object) per fingerprint key.

    ``check(record)`` validates each record when the file is read (raising ``SavedPickError``);
    the tuner's store checks them as tuning results (``store.pick_store``). A file that cannot be
    read, is not a store, or holds a record that fails the check is set aside (:meth:`set_aside`).
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 check: Callable[[Any], Any] | None = None) -> None:
        self.path = cache_dir(directory) / STORE_NAME
        self.check = check

    def _validated(self) -> dict[str, dict[str, Any]]:
        """The records, or ``SavedPickError`` saying why the file is unusable (call under the lock)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_STORE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SavedPickError(f"cannot be read ({exc.strerror or exc})") from None
        doc = parse_document(data)
        if not isinstance(doc, dict) or doc.get("format") != STORE_FORMAT or not isinstance(doc.get("results"), dict):
            raise SavedPickError(f"not a {STORE_FORMAT} file")
        for key, rec in doc["results"].items():
            if not isinstance(rec, dict):
                raise SavedPickError(f"record {key[:40]!r} is a {type(rec).__name__}, not an object")
            if self.check is not None:
                try:
                    self.check(rec)
                except SavedPickError as exc:
                    raise SavedPickError(f"record {key[:40]!r}: {exc}") from None
        return doc["results"]

    def _load(self, strict: bool = False) -> dict[str, dict[str, Any]]:
        """The records (call under the lock); an unusable file is set aside and counts as empty."""
        try:
            return self._validated()
        except SavedPickError as exc:
            aside = self.set_aside(str(exc))
            if strict:
                raise SavedPickError(f"{self.path} {exc}; set aside as {aside.name}") from None
            return {}

    def set_aside(self, why: str) -> Path:
        """Rename the store to ``<name>.bad-<UTC time>`` and say so once; the next write starts a new one."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        aside = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            raise SavedPickError(f"{self.path} {why}, and it cannot be set aside ({exc.strerror or exc}): "
                                 "remove it by hand") from None
        _log.warning("saved picks %s %s: set aside as %s; a fresh search will run", self.path, why, aside.name)
        return aside

    def records(self, strict: bool = False) -> dict[str, dict[str, Any]]:
        """Every saved record by key (a consistent snapshot); ``strict``: a bad file raises after it is set aside."""
        if not self.path.is_file():
            return {}
        with _lock(self.path):
            return self._load(strict)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records().get(key)

    def put(self, key: str, record: Mapping[str, Any], keep: Callable[[dict[str, Any]], bool] | None = None) -> Path:
        """Add or replace one record; other processes' concurrent puts are kept.

        ``keep(saved_record)``, asked under the lock when ``key`` already has a record, may keep that
        record instead (nothing is written then).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(self.path):
            results = self._load()
            if key in results and keep is not None and keep(results[key]):
                return self.path
            results[key] = dict(record)
            _write_atomic(self.path, {"format": STORE_FORMAT, "results": results})
        return self.path

    def remove(self, key: str) -> bool:
        if not self.path.is_file():
            return False
        with _lock(self.path):
            results = self._load()
            if results.pop(key, None) is None:
                return False
            _write_atomic(self.path, {"format": STORE_FORMAT, "results": results})
        return True

    def find(self, fp: Fingerprint, similar: bool = True, strict: bool = False) -> dict[str, Any] | None:
        """The record for ``fp`` exactly, else (``similar``) the one with the nearest sample size."""
        records = self.records(strict)
        if fp.key in records:
            return records[fp.key]
        if not similar:
            return None
        best, best_gap = None, None
        for rec in records.values():
            try:
                other = Fingerprint.from_dict(rec.get("fingerprint") or {})
            except ValueError:
                continue
            if fp.similar_to(other):
                gap = abs(np.log(other.work.sample_bytes / fp.work.sample_bytes))
                if best_gap is None or gap < best_gap:
                    best, best_gap = rec, gap
        return best

    def why_missing(self, fp: Fingerprint) -> str:
        """Why ``find(fp)`` has nothing: an empty store, only other machines, or which work settings differ."""
        saved = []
        for rec in self.records().values():
            try:
                saved.append(Fingerprint.from_dict(rec.get("fingerprint") or {}))
            except ValueError:
                continue
        if not saved:
            return f"nothing saved in {self.path}"
        works = [other.work.to_dict() for other in saved if other.machine == fp.machine]
        if not works:
            return f"{len(saved)} saved pick(s), none for this machine"
        mine = fp.work.to_dict()
        closest = min(([f"{k} {v!r} saved, {mine[k]!r} here" for k, v in w.items() if v != mine[k]] for w in works),
                      key=len)
        return f"the closest saved work differs in {'; '.join(closest)}"
