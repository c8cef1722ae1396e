"""The shared-memory ring the workers collate into: one mapping cut into equal slots.

One mapping (not one per batch) so that the whole ring can be page-locked once with
cudaHostRegister and every H2D copy starts straight from a slot. Each slot holds every field of a
batch at full ``batch_size`` rows; a short last batch uses a prefix of each field. Fields start on
256-byte boundaries and slots on 4 KiB pages.

The mapping is one of three kinds. Process workers share an anonymous file (``memory.RingFile``,
memfd): no name in /dev/shm, no bound but memory, nothing left behind whoever dies how. Where that
is missing, a named /dev/shm segment: workers attach by name with a plain ``mmap`` of
``/dev/shm/<name>`` rather than ``multiprocessing.shared_memory`` (Python 3.10/3.11 registers even an
attach with the resource tracker, which would then unlink or warn about a segment it does not own);
the owner registers the segment once (so a crashed main process still gets it removed) and unlinks
it exactly once. Thread workers and the main process alone use this process's own anonymous memory.
Every kind is checked against memory (``memory.check_room``) before it is made.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass
from functools import cached_property
from multiprocessing import resource_tracker
from typing import Any

import numpy as np

from ..._checks import check_int
from ...errors import ArgumentError, OutOfRangeError, ShmSpaceError
from .memory import NAME_PREFIX, RingFile, check_room, held_memfds
from .tree import Treedef, has_shell, leaf_kinds, leaf_paths, split

SHM_DIR = "/dev/shm"
PAGE = 4096
FIELD_ALIGN = 256
HEADER_BYTES = PAGE  # the first page holds the generation counter the workers read lock-free


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class FieldSpec:
    """One array field of a batch: its shape, dtype and byte offset inside a slot.

    A ``batched`` field has a leading row axis that scales with the batch (``shape`` is then the
    shape of one row, ``row_bytes`` its size); any other field has a fixed ``shape`` (``row_bytes``
    is then its whole size).
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    row_bytes: int
    batched: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "shape": list(self.shape), "dtype": self.dtype, "offset": self.offset,
                "row_bytes": self.row_bytes, "batched": self.batched}


@dataclass(frozen=True)
class SlotLayout:
    """Where each array of a batch lives inside a slot; learned from the first batch made.

    ``treedef`` is the batch's structure (``tree.split``): its arrays are the fields, its other
    leaves travel pickled beside the slot. ``rows`` is the row capacity of the batched fields.
    """

    treedef: Treedef
    fields: tuple[FieldSpec, ...]
    rows: int
    slot_bytes: int

    @classmethod
    def for_batch(cls, batch: Any, rows: int, batch_rows: int | None = None, *, unbatched: bool = False) -> SlotLayout:
        """The layout of ``batch`` (which has ``batch_rows`` rows) in slots of ``rows`` rows.

        An array whose leading axis has ``batch_rows`` entries is a batched field; ``batch_rows=None``
        takes the first array's leading axis; ``unbatched`` (``batch_size=None``) makes every field fixed.
        """
        treedef, arrays, _ = split(batch)
        if batch_rows is None and not unbatched:
            batch_rows = next((a.shape[0] for a in arrays if a.ndim), 0)
        return cls.from_parts(treedef, arrays, rows, None if unbatched else batch_rows)

    @classmethod
    def from_parts(cls, treedef: Treedef, arrays: list[np.ndarray], rows: int, batch_rows: int | None) -> SlotLayout:
        """The layout of a batch already split: ``batch_rows`` None when it has no row axis."""
        paths = [p for p, k in zip(leaf_paths(treedef), leaf_kinds(treedef)) if k == "leaf"]
        rows = max(rows, batch_rows or 0)
        fields = []
        offset = 0
        for path, arr in zip(paths, arrays):
            batched = batch_rows is not None and arr.ndim > 0 and arr.shape[0] == batch_rows
            shape = tuple(int(s) for s in (arr.shape[1:] if batched else arr.shape))
            size = int(np.prod(shape, dtype=np.int64)) * arr.dtype.itemsize
            fields.append(FieldSpec(path, shape, arr.dtype.str, offset, size, batched))
            offset = _align(offset + size * (rows if batched else 1), FIELD_ALIGN)
        return cls(treedef, tuple(fields), int(rows), _align(max(offset, 1), PAGE))

    def views(self, buf: np.ndarray, start: int, rows: int | None = None) -> list[np.ndarray]:
        """The fields of the slot beginning at byte ``start`` of ``buf`` (uint8), first ``rows`` rows."""
        rows = self.rows if rows is None else rows
        out = []
        for f in self.fields:
            n = rows if f.batched else 1
            a = buf[start + f.offset : start + f.offset + f.row_bytes * n].view(np.dtype(f.dtype))
            out.append(a.reshape((rows, *f.shape) if f.batched else f.shape))
        return out

    @cached_property
    def takes_samples(self) -> bool:
        """Whether samples can be collated straight into its slots (``collate.collate_into``): not when the
        batch holds a container whose attributes travel as its emptied copy, which only a made batch has."""
        return not has_shell(self.treedef)

    def fits(self, treedef: Treedef, arrays: list[np.ndarray], rows: int) -> bool:
        """Whether a batch of ``rows`` rows split into ``treedef`` and ``arrays`` goes into a slot."""
        if treedef != self.treedef or len(arrays) != len(self.fields) or rows > self.rows:
            return False
        for f, a in zip(self.fields, arrays):
            if a.dtype != np.dtype(f.dtype) or a.shape != ((rows, *f.shape) if f.batched else f.shape):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "slot_bytes": self.slot_bytes, "fields": [f.to_dict() for f in self.fields]}


class Ring:
    """``slots`` slots of ``layout`` in one mapping: of ``file`` (anonymous shared memory), of a named
    /dev/shm segment (``shared`` without a file), or of this process's anonymous memory.

    ``Ring(...)`` creates and owns; ``Ring.attach(...)`` maps an existing ring (workers). ``name`` is
    the /dev/shm segment's (None for the other kinds); ``file`` is not the ring's to close.
    """

    def __init__(self, layout: SlotLayout, slots: int, *, shared: bool = True, file: RingFile | None = None,
                 _attach: str | RingFile | None = None) -> None:
        self.layout = layout
        self.slots = check_int("the ring's slot count", slots, ge=1)
        self.nbytes = HEADER_BYTES + self.slots * layout.slot_bytes
        self.owner = _attach is None
        self.name: str | None = None
        self.file = file if _attach is None else _attach if isinstance(_attach, RingFile) else None
        if isinstance(_attach, str):
            self.name = _attach
            self._mmap = _map(os.path.join(SHM_DIR, _attach), self.nbytes, create=False)
        elif self.file is not None:
            if self.owner:
                self.file.reserve(self.nbytes)
            self._mmap = self.file.map(self.nbytes)
        elif shared:
            check_room(self.nbytes)  # tmpfs pages are memory too, whatever /dev/shm's size says
            self.name = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
            self._mmap = _map(os.path.join(SHM_DIR, self.name), self.nbytes, create=True)
            resource_tracker.register("/" + self.name, "shared_memory")
        else:
            check_room(self.nbytes)
            self._mmap = mmap.mmap(-1, self.nbytes)
        self.buffer = np.frombuffer(self._mmap, dtype=np.uint8)
        self._generation = self.buffer[:8].view(np.int64)
        self._closed = False
        self._unlinked = False

    @classmethod
    def attach(cls, where: str | RingFile, layout: SlotLayout, slots: int) -> "Ring":
        """Map the ring the owner made: by its /dev/shm name, or the anonymous file this process was given."""
        if isinstance(where, str) and (not where.startswith(NAME_PREFIX) or "/" in where):
            raise ArgumentError(f"not a cupy_nwt ring name: {where!r}")
        return cls(layout, slots, _attach=where)

    @property
    def generation(self) -> int:
        """A counter the owner bumps to make workers skip tasks of an abandoned epoch."""
        return int(self._generation[0])

    @generation.setter
    def generation(self, value: int) -> None:
        self._generation[0] = value

    def slot_views(self, slot: int, rows: int | None = None) -> list[np.ndarray]:
        """The field views of ``slot``, first ``rows`` rows of the batched fields."""
        if not 0 <= slot < self.slots:
            raise OutOfRangeError(f"slot {slot} is outside the ring's {self.slots} slots")
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
        self.unlink()

    def unlink(self) -> None:
        """Remove the segment's name (the owner's, exactly once); mappings stay valid until closed."""
        if not self.owner or self.name is None or self._unlinked:
            return
        self._unlinked = True
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
    """The cupy_nwt rings still alive: /dev/shm segment names, and ``memfd:<name>`` for each anonymous
    ring file some process still holds or maps; all of them, or those created by process ``pid``."""
    prefix = NAME_PREFIX if pid is None else f"{NAME_PREFIX}{pid}_"
    try:
        named = {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}
    except FileNotFoundError:
        named = set()
    return named | set(held_memfds(pid))


def segment_bytes(name: str) -> int:
    """The size of a ring ``live_segments`` named (0 when it is gone)."""
    path = held_memfds().get(name) if name.startswith("memfd:") else os.path.join(SHM_DIR, name)
    try:
        return os.stat(path).st_size if path is not None else 0
    except OSError:
        return 0
