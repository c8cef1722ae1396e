"""Tar shards: an index of the images in a .tar (.tar.gz, .tgz) that refuses damaged archives, the
dataset that reads members by offset, and the writer.

A partial download is the usual damage, and Python's ``tarfile`` reads past it without a word: it
stops at the first header it cannot read (cut, zeroed or garbled) as if the archive ended there, and
it yields a member whose data the file no longer holds. So the index checks what ``tarfile`` leaves
unchecked: every member's data lies inside the file, and where the members end the file holds the
end-of-archive marker (two zero 512-byte blocks, as POSIX requires and every tar writer writes).
"""

from __future__ import annotations

import functools
import gzip
import io
import logging
import os
import posixpath
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import check_path
from .._files import atomic_open
from ..errors import ArgumentError, ArgumentTypeError, DamagedArchiveError, DataError, MissingPathError
from ..system import cache_dir as default_cache_dir
from ._images import (
    IMAGE_EXTENSIONS,
    ImageDataset,
    Transform,
    encode_image,
    index_in,
    is_apple_double,
)
from ._tar_cache import gunzip_cached

BLOCK = tarfile.BLOCKSIZE
END_OF_ARCHIVE = 2 * BLOCK
MAX_LABEL = 2**63 - 1  # labels are kept as int64
MAX_LINK_HOPS = 40  # links followed from a link member to a file, as Linux follows symlinks
_log = logging.getLogger("cupy_nwt.data")
# A directory name a reader could take for a number ("-1", "+2", "1.5", "1e3"): never silently a class name.
_NUMBER_LIKE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def member_path(name: str) -> str:
    """Where member ``name`` lands when extracted: normalised, its leading ``/`` dropped as tar drops it, so
    ``/cat/a.png``, ``./cat/a.png`` and ``cat/a.png`` are one file (the last copy of which extraction keeps)."""
    return posixpath.normpath(name.lstrip("/") or ".")


def class_directory(name: str) -> str | None:
    """The class directory of member ``name`` (``<class>/<file>``, as both tar readers read it), or None for a
    member outside any: the name normalised first, so ``./preview.png`` (``tar -C root -cf x.tar .`` writes
    every name so) is the top-level file it is, not a member of a class ``"."``.

    Args:
        name: the member's name in the archive.
    """
    parts = member_path(name).split("/")
    return parts[-2] if len(parts) >= 2 and parts[-2] != ".." else None


def integer_label(cls: str, shown: str) -> int | None:
    """The label a class directory names, shared by both tar readers so they agree on every shard:
    ASCII digits are the integer label itself (``"3"`` -> 3, what ``write_tar_shard`` writes), any
    other number-like name is refused (no writer of ours makes one, and taking it as a name would
    shift every label), and ``None`` means a class name (``"cat"``) for the caller to number.

    Args:
        cls: the member's parent directory name.
        shown: the shard and member, for the error.
    """
    if cls.isascii() and cls.isdigit():
        digits = cls.lstrip("0") or "0"
        if len(digits) > len(str(MAX_LABEL)) or int(digits) > MAX_LABEL:
            raise DataError(f"{shown}: class directory {cls[:40]!r} is a label past {MAX_LABEL}, the largest one "
                            "an int64 holds (no writer of ours makes one)")
        return int(digits)
    if _NUMBER_LIKE.fullmatch(cls):
        raise DataError(f"{shown}: class directory {cls!r} is not a label (labels are non-negative integers, "
                        "as write_tar_shard writes them)")
    return None


def tar_labels(labels: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    """``labels`` as int64 if each is a non-negative integer, the only labels a class directory
    gives back unchanged; else one-line ``ArgumentError`` (a ``-1`` or ``0.9`` would be read back
    as another label)."""
    arr = np.asarray(labels)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise ArgumentTypeError(f"write_tar_shard: labels must be non-negative integers, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if count != len(arr):
        raise ArgumentError(f"write_tar_shard: {count} images but {len(arr)} labels")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.floor(arr)) | (arr >= 2.0**63)
    else:
        bad = (arr < 0) | (arr > MAX_LABEL)
    if bad.any():
        i = int(np.argmax(bad))
        raise ArgumentError(f"write_tar_shard: labels must be non-negative integers up to {MAX_LABEL} (a class "
                            f"directory reads back no other), got {arr[i].item()!r} at index {i}")
    return arr.astype(np.int64)


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


@dataclass(frozen=True)
class TarMember:
    name: str
    offset: int
    size: int


def scan_tar(tar_path: Path, shown: str | os.PathLike) -> list[TarMember]:
    """Every file member of an uncompressed tar, after checking the archive is whole.

    A hard or symbolic link to a regular member is a member of its own (under its own name, with its
    target's bytes), as extraction makes it; a link that names nothing in the archive is left out with
    one warning naming it. ``shown`` is the name errors give (the .tar.gz the user named, not our
    decompressed copy). Raises :class:`DamagedArchiveError` naming the byte offset where the archive
    stops being whole.

    Args:
        tar_path: the uncompressed tar to read.
        shown: the name errors give.
    """
    length = tar_path.stat().st_size
    members: list[TarMember | tarfile.TarInfo] = []  # a link's TarInfo stands in its place until resolved
    with open(tar_path, "rb") as f:
        try:
            tf = tarfile.open(fileobj=f, mode="r:")  # noqa: SIM115 - entered just below, once open succeeded
        except tarfile.TarError as exc:
            raise DamagedArchiveError(shown, 0, f"not a readable tar archive ({exc})") from exc
        with tf:
            try:
                for m in tf:
                    padded_end = m.offset_data + -(-m.size // BLOCK) * BLOCK
                    if padded_end > length:
                        raise DamagedArchiveError(shown, length, f"the file ends inside member {m.name!r}, "
                                                  f"which spans bytes {m.offset}..{padded_end}")
                    if m.isfile():
                        members.append(TarMember(m.name, m.offset_data, m.size))
                    elif m.islnk() or m.issym():
                        members.append(m)
            except tarfile.TarError as exc:
                raise DamagedArchiveError(shown, tf.offset, f"unreadable member header ({exc})") from exc
            end = tf.offset  # the block tarfile stopped at: must be the end-of-archive marker
        f.seek(end)
        tail = f.read(END_OF_ARCHIVE)
    if len(tail) == END_OF_ARCHIVE and not any(tail):
        return _last_copies(_resolve_links(members, shown), shown)
    if any(tail):
        what = "a cut member header" if len(tail) < BLOCK else "a member header that cannot be read"
        raise DamagedArchiveError(shown, end, f"{what} where the next member or the end-of-archive marker "
                                  f"should be (the file is {length} bytes)")
    raise DamagedArchiveError(shown, end, f"the file ends there ({length} bytes) without the end-of-archive "
                              f"marker (two zero {BLOCK}-byte blocks): a truncated file?")


def _resolve_links(members: list[TarMember | tarfile.TarInfo], shown: str | os.PathLike) -> list[TarMember]:
    """Each link member as its target's bytes under its own name; those naming nothing left out, and said."""
    files = {member_path(m.name): m for m in members if isinstance(m, TarMember)}
    links = {member_path(m.name): m for m in members if isinstance(m, tarfile.TarInfo)}
    out: list[TarMember] = []
    dangling: list[str] = []
    for m in members:
        found = m if isinstance(m, TarMember) else _link_target(m, files, links)
        if found is None:
            dangling.append(m.name)
        else:
            out.append(TarMember(m.name, found.offset, found.size))
    if dangling:
        _log.warning("%s: %d link member(s) name nothing in the archive, left out: %s", shown, len(dangling),
                     ", ".join(dangling[:3]) + (" ..." if len(dangling) > 3 else ""))
    return out


def _last_copies(members: list[TarMember], shown: str | os.PathLike) -> list[TarMember]:
    """Each name once, its last copy where the archive holds it twice (``tar -r`` appends an updated file):
    extraction keeps the last; both would be a stale sample beside the new one. Said in one warning."""
    seen: dict[str, int] = {}
    for i, m in enumerate(members):
        seen[member_path(m.name)] = i
    if len(seen) == len(members):
        return members
    kept = sorted(seen.values())
    twice = sorted({member_path(m.name) for i, m in enumerate(members) if seen[member_path(m.name)] != i})
    _log.warning("%s: %d member name(s) appear more than once; each is read once, from its last copy, as extraction "
                 "keeps it: %s", shown, len(twice), ", ".join(twice[:3]) + (" ..." if len(twice) > 3 else ""))
    return [members[i] for i in kept]


def image_members(tar_path: Path, shown: str | os.PathLike) -> list[TarMember]:
    """The members of a tar that are images: named as one (``IMAGE_EXTENSIONS``) and not macOS metadata
    (``._photo.jpg`` AppleDouble members, which an archive made on a Mac carries beside each file: decoded,
    each would be a corrupt sample). Those left out are said in one warning.

    Args:
        tar_path: the uncompressed tar to read.
        shown: the name errors and the warning give.
    """
    members = [m for m in scan_tar(tar_path, shown) if m.name.lower().endswith(IMAGE_EXTENSIONS)]
    with open(tar_path, "rb") as f:
        metadata = {i for i, m in enumerate(members)
                    if is_apple_double(m.name, functools.partial(os.pread, f.fileno(), 4, m.offset))}
    if metadata:
        _log.warning("%s: %d macOS metadata member(s) (._ AppleDouble files, not images) left out, e.g. %s", shown,
                     len(metadata), members[min(metadata)].name)
    return [m for i, m in enumerate(members) if i not in metadata]


def _link_target(link: tarfile.TarInfo, files: dict[str, TarMember],
                 links: dict[str, tarfile.TarInfo]) -> TarMember | None:
    """The regular member ``link`` names, through links to links as extraction follows them; None if none."""
    for _ in range(MAX_LINK_HOPS):
        if link.islnk():  # a hard link names an archive path
            target = member_path(link.linkname)
        else:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(member_path(link.name)), link.linkname))
        if target in files:
            return files[target]
        if target not in links:
            return None
        link = links[target]
    return None


class TarImageDataset(ImageDataset):
    """Labeled images inside a .tar (or .tar.gz / .tgz) archive, read by offset without extracting.

    Label convention: the name of the member's parent directory (``cat/0001.png`` -> class "cat").
    If every class name is a non-negative integer the label is that integer (``3/x.png`` -> 3, what
    ``write_tar_shard`` writes, and what ``ShardedTarStream`` reads); otherwise class names sorted
    alphabetically give 0, 1, ... A directory that looks like another number (``-1``, ``1.5``) or a
    mix of integer and named directories is refused with ``DataError``: either reading would shift labels.
    Members that are not images (by extension) are ignored. A damaged archive (see ``scan_tar``)
    is refused at construction.

    Gzip archives are decompressed once into ``cache_dir`` (see ``default_cache_dir``), because a
    gzip stream cannot be read at an offset; that copy is checked against its record before it is
    used (see ``_tar_cache``). The archive is indexed once at construction; every
    process (each forked or spawned worker) opens its own file descriptor on first read and
    reads with ``os.pread``, so no file position is shared.

    Args:
        path: the .tar, .tar.gz or .tgz archive.
        transform: applied to each decoded image (HWC uint8).
        cache_dir: where a gzip archive is decompressed once.
    """

    def __init__(self, path: str | os.PathLike, transform: Transform | None = None,
                 cache_dir: str | os.PathLike | None = None) -> None:
        self.path = check_path("path", path)
        self.transform = transform
        if not self.path.is_file():
            raise MissingPathError(f"TarImageDataset: no such file: {self.path}")
        self.tar_path = (gunzip_cached(self.path, default_cache_dir(cache_dir))
                         if is_gzip(self.path) else self.path)
        names, offsets, sizes, parents = [], [], [], []
        for m in image_members(self.tar_path, self.path):
            parent = class_directory(m.name)
            if parent is None:
                raise DataError(f"TarImageDataset: member {m.name!r} of {self.path} is not inside a "
                                 "class directory, so it has no label (expected <class>/<file>)")
            names.append(os.fsencode(m.name))
            offsets.append(m.offset)
            sizes.append(m.size)
            parents.append(parent)
        if not names:
            raise ArgumentError(f"TarImageDataset: {self.path} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        first = dict(zip(reversed(parents), reversed(names)))  # each class directory's first member
        named = {p: integer_label(p, f"{self.path} member {os.fsdecode(n)!r}") for p, n in first.items()}
        numbered = sorted((p for p, v in named.items() if v is not None), key=int)
        words = sorted(p for p, v in named.items() if v is None)
        if numbered and words:
            raise DataError(f"TarImageDataset: {self.path} mixes integer label directories ({numbered[0]!r}) with "
                            f"class names ({words[0]!r}), so its labels would be ambiguous")
        if numbered:
            self.classes = numbered
            labels = [int(p) for p in parents]
        else:
            self.classes = words
            idx = {c: i for i, c in enumerate(self.classes)}
            labels = [idx[p] for p in parents]
        self._names = np.array(names, dtype=bytes)
        self._offsets = np.array(offsets, dtype=np.int64)
        self._sizes = np.array(sizes, dtype=np.int64)
        self.labels = np.array(labels, dtype=np.int64)
        self._fd: int | None = None
        self._fd_pid: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def member_name(self, i: int) -> str:
        return os.fsdecode(self._names[index_in(i, len(self))])

    def sample_source(self, i: int) -> str:
        return f"{self.path} member {self.member_name(i)!r}"

    def _file(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._fd_pid != pid:
            self._fd = os.open(self.tar_path, os.O_RDONLY)
            self._fd_pid = pid
        return self._fd

    def read_bytes(self, i: int) -> bytes:
        """The encoded bytes of sample ``i``, exactly as stored in the archive."""
        i = index_in(i, len(self))
        size = int(self._sizes[i])
        data = os.pread(self._file(), size, int(self._offsets[i]))
        if len(data) != size:
            copy = "" if self.tar_path == self.path else f", the decompressed copy of {self.path},"
            raise DamagedArchiveError(self.tar_path, int(self._offsets[i]) + len(data),
                                      f"member {self.member_name(i)!r} (sample {i}) is cut: {len(data)} of "
                                      f"{size} bytes (the file{copy} shrank after it was indexed?)")
        return data

    def _encoded(self, i: int) -> tuple[bytes, str]:
        return self.read_bytes(i), self.sample_source(i)

    def _label(self, i: int) -> int:
        return int(self.labels[i])

    def close(self) -> None:
        """Close this process's descriptor (a descriptor inherited from another process is left alone)."""
        if self._fd is not None and self._fd_pid == os.getpid():
            os.close(self._fd)
        self._fd = self._fd_pid = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down os
            pass

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fd"] = state["_fd_pid"] = None
        return state

    def __repr__(self) -> str:
        return f"TarImageDataset({str(self.path)!r}, {len(self)} images, {len(self.classes)} classes)"


def write_tar_shard(path: str | os.PathLike, images: Sequence[np.ndarray] | np.ndarray,
                    labels: Sequence[int] | np.ndarray, fmt: str = "png",
                    class_names: Sequence[str] | None = None) -> Path:
    """Write images as ``<label or class name>/<index>.<ext>`` members of a tar (gzip if the name ends .gz/.tgz).

    The archive is reproducible (fixed mtimes and owners) and appears atomically.

    Args:
        path: the archive to write (gzip when it ends .gz or .tgz).
        images: uint8 H x W x C images.
        labels: one non-negative integer label per image, up to 2**63-1 (the only labels a directory name reads
            back as, kept as int64).
        fmt: "png" or "jpeg".
        class_names: name members' directories by these names instead of the integer labels.
    """
    path = Path(path)
    labels = tar_labels(labels, len(images))
    if class_names is not None and labels.size and (labels.min() < 0 or labels.max() >= len(class_names)):
        raise ArgumentError(f"write_tar_shard: labels span {labels.min()}..{labels.max()} but there are "
                         f"{len(class_names)} class names")
    ext = {"png": "png", "jpeg": "jpg", "jpg": "jpg"}.get(fmt.lower())
    if ext is None:
        raise ArgumentError(f"unknown image format {fmt!r}: use 'png' or 'jpeg'")
    gz = path.name.endswith((".gz", ".tgz"))
    with atomic_open(path) as raw:  # the umask's mode, not mkstemp's 0600
        zf = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if gz else None
        with tarfile.open(fileobj=zf or raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for i, (img, label) in enumerate(zip(images, labels)):
                cls = class_names[int(label)] if class_names is not None else str(int(label))
                data = encode_image(img, fmt)
                info = tarfile.TarInfo(f"{cls}/{i:06d}.{ext}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tf.addfile(info, io.BytesIO(data))
        if zf is not None:
            zf.close()
    return path
