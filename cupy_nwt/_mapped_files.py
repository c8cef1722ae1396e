"""A ``np.memmap`` pickled as the file it maps, so a worker maps the same file instead of copying its bytes.

NumPy pickles a memmap as its whole content. Sending the file's name and place instead lets a
forkserver or spawn worker share the file's pages, as a forked one would, but a name is only a name:
the file may have been replaced since the main process mapped it (a re-export renamed over it), and a
worker mapping the new one reads other samples than the main process, without a word; a memmap opened
``"w+"`` would be created again, empty, over the user's data. So the place records the file the main
process really maps (its device and inode, read from ``/proc/self/maps``), the worker maps the file it
opened only after checking it is that one and still holds the bytes, and a ``"w+"`` memmap is opened
``"r+"``. Mode ``"c"`` (copy-on-write: the main process's writes are in its own pages only) is not a
file's content, and travels as NumPy pickles it.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .errors import DataFileError

#: memmap modes whose pages are the file's; ``"w+"`` is reopened ``"r+"`` (``"w+"`` would truncate the file)
_FILE_MODES: dict[str, Literal["r", "r+"]] = {"r": "r", "r+": "r+", "w+": "r+"}


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
        """Map the file again, refusing in one :class:`DataFileError` a file that is not the one mapped
        before (replaced under its name) or that no longer holds the array's bytes (cut short)."""
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
            a = np.memmap(f, dtype=dtype, mode=self.mode, offset=self.offset, shape=self.shape, order=self.order)
        # the file as this process maps it, read where the main process's was read (on an overlay file
        # system /proc/self/maps names the layer's file, which stat does not): the same source on both sides
        mm = getattr(a, "_mmap", None)
        if not isinstance(mm, mmap.mmap) or _mapping_of(int(np.frombuffer(mm, np.uint8).ctypes.data)) != (
                self.device, self.inode):
            raise DataFileError(self.path, "was replaced by another file after the main process mapped it: a loader "
                                "worker would read other samples than the main process; open the dataset again")
        return a


def mapped_file(a: np.ndarray) -> MappedFile | None:
    """The file and place of memmap ``a``'s bytes, or None when they are not a file's content to map again
    (not a memmap, copy-on-write, not contiguous, empty, or its mapping not found)."""
    if not isinstance(a, np.memmap):
        return None
    mm, name, mode = getattr(a, "_mmap", None), getattr(a, "filename", None), getattr(a, "mode", None)
    path = os.fspath(name) if isinstance(name, (str, os.PathLike)) else None
    order: Literal["C", "F"] | None = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else None
    if (not isinstance(mm, mmap.mmap) or mm.closed or mode not in _FILE_MODES or order is None or a.size == 0
            or not isinstance(path, str) or a.dtype.hasobject):
        return None
    base = int(np.frombuffer(mm, np.uint8).ctypes.data)
    into = int(a.__array_interface__["data"][0]) - base
    if not 0 <= into <= len(mm) - a.nbytes:
        return None
    identity = _mapping_of(base)
    if identity is None:
        return None
    start = int(a.offset) - int(a.offset) % mmap.ALLOCATIONGRANULARITY  # where np.memmap began its mapping
    return MappedFile(path, identity[0], identity[1], _FILE_MODES[mode], start + into, a.dtype.str, tuple(a.shape),
                      order)


def open_mapped(place: MappedFile) -> np.memmap[Any, np.dtype[Any]]:
    """``place`` mapped again (a pickle's reconstructor: a module-level function)."""
    return place.open()


def _mapping_of(address: int) -> tuple[tuple[int, int], int] | None:
    """The (major, minor) device and inode of the file mapped at ``address`` in this process, from
    ``/proc/self/maps`` (None without it, or for anonymous memory)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                if int(low, 16) <= address < int(high, 16):
                    major, _, minor = fields[3].partition(":")
                    inode = int(fields[4])
                    return ((int(major, 16), int(minor, 16)), inode) if inode else None
    except (OSError, ValueError, IndexError):
        return None
    return None
