"""A ``np.memmap`` pickled as the file it maps, so a worker maps the same file instead of copying its bytes.

NumPy pickles a memmap as its whole content. Sending the file's name and place instead lets a
forkserver or spawn worker share the file's pages, as a forked one would, but a name is only a name:
the file may have been replaced since the main process mapped it (a re-export renamed over it), and a
worker mapping the new one reads other samples than the main process, without a word; a memmap opened
``"w+"`` would be created again, empty, over the user's data. So the place records the file the main
process really maps (its device and inode, read from ``/proc/self/maps``), the worker maps the file
and keeps it only if it is that one and still holds the bytes, and a ``"w+"`` memmap is opened ``"r+"``.
Each side reads its mappings once for all the memmaps of one pickle: a dataset of a thousand memmaps
would otherwise read a thousand-line file a thousand times. Mode ``"c"`` (copy-on-write: the main process's writes are in its own pages only) is not a
file's content, and travels as NumPy pickles it.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .errors import DataFileError

#: memmap modes whose pages are the file's; ``"w+"`` is reopened ``"r+"`` (``"w+"`` would truncate the file)
_FILE_MODES: dict[str, Literal["r", "r+"]] = {"r": "r", "r+": "r+", "w+": "r+"}
_batch = threading.local()  # the memmaps rebuilt inside ``checked_together``, waiting for their check


@dataclass(frozen=True)
class MappedFile:
    """Where a memmap's bytes lie: the file (``path``, and the ``device``/``inode`` it had when mapped),
    the byte ``offset`` and the array's layout."""

    path: str
    device: tuple[int, int]  # (major, minor)
    inode: int
    mode: Literal["r", "r+"]
    offset: int
    dtype: str
    shape: tuple[int, ...]
    order: Literal["C", "F"]

    def open(self) -> np.memmap[Any, np.dtype[Any]]:
        """Map the file again (see :func:`open_all`)."""
        return open_all([self])[0]

    def _map(self) -> np.memmap[Any, np.dtype[Any]]:
        """The file mapped, refused in one :class:`DataFileError` if it no longer holds the array's bytes."""
        dtype = np.dtype(self.dtype)
        try:
            f = open(self.path, "r+b" if self.mode == "r+" else "rb")  # noqa: SIM115 - closed below, the map outlives it
        except OSError as exc:
            raise DataFileError(self.path, f"cannot be opened again in a loader worker ({exc.strerror or exc})") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            end = self.offset + int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
            if size < end:
                raise DataFileError(self.path, f"was cut to {size} bytes after the main process mapped it; the "
                                    f"array needs {end}")
            return np.memmap(f, dtype=dtype, mode=self.mode, offset=self.offset, shape=self.shape, order=self.order)

    def _check(self, a: np.memmap[Any, np.dtype[Any]], maps: ProcessMaps) -> None:
        """Refuse a file that is not the one the main process mapped (replaced under its name).

        The file is identified as this process maps it, read where the main process's was read: on an
        overlay file system ``/proc/self/maps`` names the layer's file, which ``stat`` does not.
        """
        mm = getattr(a, "_mmap", None)
        if not isinstance(mm, mmap.mmap) or maps.identity(_start(mm)) != (self.device, self.inode):
            raise DataFileError(self.path, "was replaced by another file after the main process mapped it: a loader "
                                "worker would read other samples than the main process; open the dataset again")


def open_all(places: list[MappedFile]) -> list[np.memmap[Any, np.dtype[Any]]]:
    """Every place mapped again, then checked against one reading of this process's mappings: each must be
    the file the main process mapped and still hold its bytes, else one :class:`DataFileError` names it."""
    arrays = [p._map() for p in places]
    maps = ProcessMaps()
    for place, a in zip(places, arrays):
        place._check(a, maps)
    return arrays


class ProcessMaps:
    """This process's file mappings, read from ``/proc/self/maps`` once, when first asked.

    One reading serves every memmap pickled in one pass (a dataset of a thousand memmaps would read a
    file of a thousand lines a thousand times); it holds for mappings that existed when it was read,
    which every memmap of the object being pickled does.
    """

    def __init__(self) -> None:
        self._starts: list[int] | None = None
        self._rows: list[tuple[int, int, tuple[tuple[int, int], int] | None]] = []  # start, end, identity

    def identity(self, address: int) -> tuple[tuple[int, int], int] | None:
        """The (major, minor) device and inode of the file mapped at ``address`` (None: anonymous, or no maps)."""
        if self._starts is None:
            self._rows = _read_maps()
            self._starts = [row[0] for row in self._rows]
        k = bisect.bisect_right(self._starts, address) - 1
        return self._rows[k][2] if k >= 0 and address < self._rows[k][1] else None


def mapped_file(a: np.ndarray, maps: ProcessMaps | None = None) -> MappedFile | None:
    """The file and place of memmap ``a``'s bytes, or None when they are not a file's content to map again
    (not a memmap, copy-on-write, not contiguous, empty, or its mapping not found).

    Args:
        a: the array.
        maps: the pass's reading of this process's mappings (default: read for this array alone).
    """
    if not isinstance(a, np.memmap):
        return None
    mm, name, mode = getattr(a, "_mmap", None), getattr(a, "filename", None), getattr(a, "mode", None)
    path = os.fspath(name) if isinstance(name, (str, os.PathLike)) else None
    order: Literal["C", "F"] | None = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else None
    if (not isinstance(mm, mmap.mmap) or mm.closed or mode not in _FILE_MODES or order is None or a.size == 0
            or not isinstance(path, str) or a.dtype.hasobject):
        return None
    base = _start(mm)
    into = int(a.__array_interface__["data"][0]) - base
    if not 0 <= into <= len(mm) - a.nbytes:
        return None
    identity = (maps or ProcessMaps()).identity(base)
    if identity is None:
        return None
    start = int(a.offset) - int(a.offset) % mmap.ALLOCATIONGRANULARITY  # where np.memmap began its mapping
    return MappedFile(path, identity[0], identity[1], _FILE_MODES[mode], start + into, a.dtype.str, tuple(a.shape),
                      order)


def open_mapped(place: MappedFile) -> np.memmap[Any, np.dtype[Any]]:
    """``place`` mapped again, as a pickle's reconstructor; inside :func:`checked_together` its check waits
    for the others', so that one reading of the mappings serves them all."""
    pending: list[tuple[MappedFile, np.memmap[Any, np.dtype[Any]]]] | None = getattr(_batch, "pending", None)
    if pending is None:
        return place.open()
    a = place._map()
    pending.append((place, a))
    return a


@contextmanager
def checked_together() -> Iterator[None]:
    """Unpickle inside this block: the memmaps that :func:`open_mapped` rebuilds are checked as it ends."""
    pending: list[tuple[MappedFile, np.memmap[Any, np.dtype[Any]]]] = []
    _batch.pending = pending
    try:
        yield
    finally:
        _batch.pending = None
    maps = ProcessMaps()
    for place, a in pending:
        place._check(a, maps)


def _start(mm: mmap.mmap) -> int:
    return int(np.frombuffer(mm, np.uint8).ctypes.data)


def _read_maps() -> list[tuple[int, int, tuple[tuple[int, int], int] | None]]:
    """(start, end, identity) of each mapping in ``/proc/self/maps``, by address; [] without it."""
    rows = []
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                major, _, minor = fields[3].partition(":")
                inode = int(fields[4])
                rows.append((int(low, 16), int(high, 16), ((int(major, 16), int(minor, 16)), inode) if inode else None))
    except (OSError, ValueError, IndexError):
        return []
    return rows
