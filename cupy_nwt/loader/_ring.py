"""The shared-memory ring the workers collate into: one /dev/shm segment cut into equal slots.

One segment (not one per batch) so that the whole ring can be page-locked once with
cudaHostRegister and every H2D copy starts straight from a slot. Each slot holds every field of a
batch at full ``batch_size`` rows; a short last batch uses a prefix of each field. Fields start on
256-byte boundaries and slots on 4 KiB pages.

Workers attach by name with a plain ``mmap`` of ``/dev/shm/<name>`` rather than
``multiprocessing.shared_memory``: Python 3.10/3.11 registers even an attach with the resource
tracker, which would then unlink or warn about a segment it does not own. The owner registers the
segment once (so a crashed main process still gets it removed) and unlinks it exactly once.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from .._checks import check_int
from ..errors import ShmSpaceError
from ._collate import BatchLayoutError, Treedef, as_leaf, flatten, leaf_paths

SHM_DIR = "/dev/shm"
NAME_PREFIX = "cupy_nwt_"
PAGE = 4096
FIELD_ALIGN = 256
HEADER_BYTES = PAGE  # the first page holds the generation counter the workers read lock-free


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class FieldSpec:
    """One array field of a batch: per-row shape, dtype and its byte offset inside a slot."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    row_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "shape": list(self.shape), "dtype": self.dtype, "offset": self.offset, "row_bytes": self.row_bytes}


@dataclass(frozen=True)
class SlotLayout:
    """Where each field of a batch lives inside a slot; derived from the first batch."""

    treedef: Treedef
    fields: tuple[FieldSpec, ...]
    rows: int
    slot_bytes: int

    @classmethod
    def for_batch(cls, batch: Any, rows: int) -> "SlotLayout":
        """The layout of ``batch`` (every field has one leading row axis) at ``rows`` rows per slot."""
        leaves, treedef = flatten(batch)
        paths = leaf_paths(treedef)
        arrays = [as_leaf(x) for x in leaves]
        n = None
        fields = []
        offset = 0
        for path, arr in zip(paths, arrays):
            if arr.ndim == 0:
                raise BatchLayoutError(f"batch field {path} is a scalar; every field needs a leading row axis")
            if n is None:
                n = arr.shape[0]
            if arr.shape[0] != n:
                raise BatchLayoutError(f"batch field {path} has {arr.shape[0]} rows, the first field has {n}")
            row_bytes = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
            fields.append(FieldSpec(path, tuple(int(s) for s in arr.shape[1:]), arr.dtype.str, offset, row_bytes))
            offset = _align(offset + row_bytes * rows, FIELD_ALIGN)
        if not fields:
            raise BatchLayoutError("a batch needs at least one array field")
        if n is not None and n > rows:
            raise BatchLayoutError(f"the batch has {n} rows, more than the {rows} a slot holds")
        return cls(treedef, tuple(fields), int(rows), _align(max(offset, 1), PAGE))

    def views(self, buf: np.ndarray, start: int, rows: int | None = None) -> list[np.ndarray]:
        """The fields of the slot beginning at byte ``start`` of ``buf`` (uint8), first ``rows`` rows."""
        rows = self.rows if rows is None else rows
        out = []
        for f in self.fields:
            a = buf[start + f.offset : start + f.offset + f.row_bytes * rows].view(np.dtype(f.dtype))
            out.append(a.reshape((rows, *f.shape)))
        return out

    def check(self, leaves: list[Any], treedef: Treedef, rows: int, batch_index: int) -> list[np.ndarray]:
        """Validate a collated (or transformed) batch against the layout; return its leaves as arrays."""
        if treedef != self.treedef:
            raise BatchLayoutError(f"batch {batch_index} has a different structure than the first batch")
        arrays = [as_leaf(x) for x in leaves]
        for f, a in zip(self.fields, arrays):
            want = (rows, *f.shape)
            if a.shape != want or a.dtype != np.dtype(f.dtype):
                raise BatchLayoutError(
                    f"batch {batch_index}, field {f.path}: expected shape {want} dtype {np.dtype(f.dtype)}, "
                    f"got shape {a.shape} dtype {a.dtype}"
                )
        return arrays

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "slot_bytes": self.slot_bytes, "fields": [f.to_dict() for f in self.fields]}


class Ring:
    """``slots`` slots of ``layout`` in one mapping: a named /dev/shm segment or anonymous memory.

    ``Ring(...)`` creates and owns; ``Ring.attach(...)`` maps an existing named ring (workers).
    """

    def __init__(self, layout: SlotLayout, slots: int, *, shared: bool = True, _attach_name: str | None = None) -> None:
        self.layout = layout
        self.slots = check_int("the ring's slot count", slots, ge=1)
        self.nbytes = HEADER_BYTES + self.slots * layout.slot_bytes
        self.owner = _attach_name is None
        self.name: str | None = None
        if _attach_name is not None:
            self.name = _attach_name
            self._mmap = _map(os.path.join(SHM_DIR, _attach_name), self.nbytes, create=False)
        elif shared:
            self.name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
            self._mmap = _map(os.path.join(SHM_DIR, self.name), self.nbytes, create=True)
            resource_tracker.register("/" + self.name, "shared_memory")
        else:
            self._mmap = mmap.mmap(-1, self.nbytes)
        self.buffer = np.frombuffer(self._mmap, dtype=np.uint8)
        self._generation = self.buffer[:8].view(np.int64)
        self._closed = False

    @classmethod
    def attach(cls, name: str, layout: SlotLayout, slots: int) -> "Ring":
        if not name.startswith(NAME_PREFIX) or "/" in name:
            raise ValueError(f"not a cupy_nwt ring name: {name!r}")
        return cls(layout, slots, _attach_name=name)

    @property
    def generation(self) -> int:
        """A counter the owner bumps to make workers skip tasks of an abandoned epoch."""
        return int(self._generation[0])

    @generation.setter
    def generation(self, value: int) -> None:
        self._generation[0] = value

    def slot_views(self, slot: int, rows: int | None = None) -> list[np.ndarray]:
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} is outside the ring's {self.slots} slots")
        return self.layout.views(self.buffer, HEADER_BYTES + slot * self.layout.slot_bytes, rows)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unmap (and, for the owner, unlink exactly once). Idempotent.

        If someone still holds a view into the ring, the mapping stays until that view is gone, but
        the name is unlinked now, so nothing is left in /dev/shm either way.
        """
        if self._closed:
            return
        self._closed = True
        del self.buffer, self._generation  # views into the mapping must not outlive it here
        try:
            self._mmap.close()
        except BufferError:
            pass  # views are still alive; the mapping goes with the last of them
        if self.owner and self.name is not None:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map(path: str, nbytes: int, *, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if create:  # a VM or a minimal container without a /dev/shm mount, or one we may not write to
            raise _space_error(nbytes, exc) from None
        raise
    try:
        if create:
            # Reserve the pages now: on a full /dev/shm (Docker's default is 64 MiB) a worker would
            # otherwise die of SIGBUS on its first write instead of the caller getting a reason.
            os.posix_fallocate(fd, 0, nbytes)
        return mmap.mmap(fd, nbytes)
    except OSError as exc:
        if create:
            os.unlink(path)
            raise _space_error(nbytes, exc) from None
        raise
    finally:
        os.close(fd)


def _space_error(nbytes: int, exc: OSError) -> ShmSpaceError:
    """One line: /dev/shm, its free bytes, the bytes the ring needs, and what to change."""
    need = f"the loader's ring needs {nbytes / 2**20:.1f} MiB of {SHM_DIR} ({nbytes} bytes)"
    if not os.path.isdir(SHM_DIR):
        return ShmSpaceError(
            f"{need}, but {SHM_DIR} does not exist (0 bytes free): mount a tmpfs there "
            f"(mount -t tmpfs -o size=1g tmpfs {SHM_DIR}) or use num_workers=0")
    free = _shm_free()
    return ShmSpaceError(
        f"{need} but only {free / 2**20:.1f} MiB ({free} bytes) are free ({exc.strerror}); lower batch_size, "
        "num_workers or prefetch_factor, or give the container a larger /dev/shm (docker --shm-size)")


def _shm_free() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def live_segments(pid: int | None = None) -> set[str]:
    """Names of cupy_nwt ring segments in /dev/shm: all of them, or those created by process ``pid``."""
    prefix = NAME_PREFIX if pid is None else f"{NAME_PREFIX}{pid}_"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}
    except FileNotFoundError:
        return set()
