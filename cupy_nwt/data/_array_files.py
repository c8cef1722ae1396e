""".npy and .npz files opened as datasets, with every header checked against the file before it is used.

NumPy's own ``np.load`` fails on a damaged file with errors that do not name it ("No data left in
file", "mmap length is greater than file size"), takes a file that is not a .npy at all for a pickle,
and for a .npz member allocates whatever shape its header claims before finding the data is not
there. So each array's header is read first (with NumPy's public reader) and checked: no Python
objects (they could only be unpickled), a shape whose bytes the file (or zip member) really holds,
and a first (sample) dimension; only then is it mapped or read. Every refusal is one
:class:`DataFileError` naming the file, and the member for a .npz.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from ..errors import ArgumentError, DataFileError
from ..system import memory_room

_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _checked_header(f: IO[bytes], size: int, path: Path, where: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data bytes of the .npy at ``f``, whose stream holds ``size`` bytes in all.

    ``where`` is "" for a .npy file, "member 'x.npy' " for a .npz member (it leads the problem).
    """
    if size == 0:
        raise DataFileError(path, f"{where}is empty (0 bytes), not a .npy array")
    try:
        version = np.lib.format.read_magic(f)
    except (ValueError, EOFError):
        raise DataFileError(path, f"{where}is not a .npy array (it does not start with NumPy's magic "
                            "string, \\x93NUMPY)") from None
    try:
        # a version 3.0 header differs from 2.0 only in being UTF-8 (field names), not in its layout
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ArgumentError(f"unknown .npy format version {version[0]}.{version[1]}")
        shape, _, dtype = read(f)
    except Exception as exc:  # noqa: BLE001 - NumPy parses the header's Python literal: ValueError, TokenError, ...
        raise DataFileError(path, f"{where}has an unreadable .npy header ({_reason(exc)})") from None
    if dtype.hasobject:
        raise DataFileError(path, f"{where}holds Python objects (dtype {dtype}): reading them means unpickling, "
                            "which cupy_nwt never does with a file")
    if any(d < 0 for d in shape):
        raise DataFileError(path, f"{where}has a .npy header with a negative dimension: shape {shape}")
    if not shape:
        raise DataFileError(path, f"{where}holds one {dtype} value (shape ()), not rows of samples")
    nbytes = math.prod(shape) * dtype.itemsize
    held = size - f.tell()
    if nbytes > held:
        raise DataFileError(path, f"{where}is cut short (or its header lies): it declares shape {shape} of {dtype}, "
                            f"{nbytes} bytes of data, but {held} bytes follow the header")
    return shape, dtype, nbytes


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """The .npy at ``path`` as a read-only memmap, after its header is checked against the file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            _checked_header(f, os.fstat(f.fileno()).st_size, path, "")
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except DataFileError:
        raise
    except _READ_ERRORS as exc:
        raise DataFileError(path, f"cannot be read as a .npy array ({_reason(exc)})") from exc


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of the .npz at ``path`` by name, in file order, after every member's header is checked.

    Every member must be a .npy array (``np.savez`` writes nothing else), and all of them together
    must fit in the memory now available, as they are read into memory.
    """
    path = Path(path)
    where = ""
    try:
        if os.stat(path).st_size == 0:
            raise DataFileError(path, "is empty (0 bytes), not a .npz archive")
        try:
            zf = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise DataFileError(path, f"is not a .npz archive (not a readable zip file: {exc})") from None
        with zf:
            infos = zf.infolist()
            if not infos:
                raise DataFileError(path, "holds no arrays (a zip archive with nothing in it)")
            total = 0
            for info in infos:
                where = f"member {info.filename!r} "
                if not info.filename.endswith(".npy"):
                    raise DataFileError(path, f"{where}is not a .npy array (a .npz holds only .npy members)")
                with zf.open(info) as f:
                    total += _checked_header(f, info.file_size, path, where)[2]
            room = memory_room()
            if total > room.bytes:
                raise DataFileError(path, f"holds {total} bytes of arrays, more than the {room.bytes} bytes free "
                                    f"{room.bound} to read them into")
            arrays = {}
            for info in infos:
                where = f"member {info.filename!r} "
                with zf.open(info) as f:
                    arrays[info.filename.removesuffix(".npy")] = np.lib.format.read_array(f, allow_pickle=False)
            return arrays
    except DataFileError:
        raise
    except (*_READ_ERRORS, MemoryError) as exc:
        raise DataFileError(path, f"{where}cannot be read ({_reason(exc)})") from exc


def as_columns(arrays: dict[str, np.ndarray], path: str | os.PathLike) -> list[np.ndarray]:
    """Arrays of one data file as a dataset's columns: they must agree on the number of samples."""
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in counts.items())
        raise DataFileError(path, f"its arrays differ in their number of samples (first dimension): {listed}")
    return list(arrays.values())
