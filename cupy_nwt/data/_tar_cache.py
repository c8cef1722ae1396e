"""The decompressed copy of a .tar.gz in the cache dir, and the record that lets a later process trust it.

A gzip stream has no random access, so reading member k would mean inflating everything before it,
per sample. One sequential pass into an uncompressed copy makes every later read a single pread.

That copy is read back by other processes, possibly after a crash, so it is not trusted on sight.
A file renamed into place before its data reached the disk can come back after a power loss at its
full length with zeros where the data was; a copy can also be cut or overwritten by anyone. So:

- beside the copy ``<stem>-<key>.tar`` a record ``<stem>-<key>.tar.json`` says what it was made
  from (the source's resolved path, size and mtime_ns, and the key derived from them) and its own
  length and BLAKE2b digest, computed while it was written;
- both are fsynced before their atomic renames (the record first, so a writer that dies between the
  two leaves a record without a copy, which is simply built), and the folder after;
- the first open in a process checks the copy against its record: the length, then the digest over
  every byte (about 0.1 s per 100 MB; the pages it reads are the ones the loader reads next). A later
  open of the same unchanged file (same inode, size and mtime) in that process trusts that check;
- a copy that fails is rebuilt from the source under the same file lock that makes concurrent
  first uses build once, with one ``CacheRebuiltWarning`` naming the copy and what was wrong.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import warnings
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .._files import atomic_open, fsync_dir, make_folder, writable_base
from ..errors import ArgumentError, DamagedArchiveError
from ..system import CACHE_ENV

RECORD_SUFFIX = ".json"
RECORD_MAX_BYTES = 4096  # a record is ~300 bytes; anything much larger is not one of ours
CHUNK = 1 << 20
_DIGEST_HEX = re.compile(r"[0-9a-f]{128}")


class CacheRebuiltWarning(UserWarning):
    """A cached copy (a decompressed archive, a synthetic dataset) failed its check and was rebuilt."""


@dataclass(frozen=True)
class CacheRecord:
    """What a cached copy was made from, and its length and BLAKE2b digest (hex) when written."""

    format: int
    source: str
    source_size: int
    source_mtime_ns: int
    key: str
    length: int
    blake2b: str


FORMAT = 1

# cache path -> (st_dev, st_ino, st_size, st_mtime_ns, digest) of the copy this process last checked
_checked: dict[str, tuple[int, int, int, int, str]] = {}


def gunzip_cached(path: Path, cache_dir: Path) -> Path:
    """Decompress a .tar.gz once into ``cache_dir/tar`` (keyed by path, size and mtime); reuse it while it checks.

    A truncated or corrupt gzip stream raises :class:`DamagedArchiveError` naming ``path`` and
    leaves nothing in the cache.
    """
    from filelock import FileLock  # noqa: PLC0415

    st = path.stat()
    source = str(path.resolve())
    key = hashlib.sha256(f"{source}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out_dir = cache_dir / "tar"
    stem = path.name.removesuffix(".gz").removesuffix(".tgz").removesuffix(".tar")
    target = out_dir / f"{stem}-{key}.tar"
    made_from = {"source": source, "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns, "key": key}
    if _problem(target, made_from) is None:  # the usual case: no lock, so readers never queue
        return target
    _, why = writable_base(out_dir)  # a shared, read-only cache serves the copies it holds, and says so for others
    if why is not None:
        raise ArgumentError(f"the cache folder {cache_dir} cannot hold the decompressed copy of {path}: {why}; set "
                            f"{CACHE_ENV} (or cache_dir=) to a folder you can write, or pass the .tar that gunzip makes")
    make_folder(out_dir, "cache_dir")
    with FileLock(str(target) + ".lock"):
        problem = _problem(target, made_from)  # again: another process may have built it meanwhile
        if problem is None:
            return target
        if target.exists():
            warnings.warn(f"{target}: {problem}; rebuilding it from {path}", CacheRebuiltWarning, stacklevel=3)
        _build(path, target, made_from)
    return target


def record_path(target: Path) -> Path:
    """Where the record of cached copy ``target`` lives."""
    return target.with_name(target.name + RECORD_SUFFIX)


def _problem(target: Path, made_from: dict[str, Any]) -> str | None:
    """Why the copy at ``target`` cannot be trusted (None: it can)."""
    try:
        fd = os.open(target, os.O_RDONLY)
    except FileNotFoundError:
        return "missing"
    try:
        record = _read_record(record_path(target))
        if isinstance(record, str):
            return record
        claimed = {k: getattr(record, k) for k in made_from}
        if claimed != made_from:
            return (f"its record says it was made from {record.source} ({record.source_size} bytes, "
                    f"mtime_ns {record.source_mtime_ns}, key {record.key}), not from this source")
        st = os.fstat(fd)
        if st.st_size != record.length:
            return f"it is {st.st_size} bytes but was written as {record.length} (cut short or grown since)"
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, record.blake2b)
        if _checked.get(str(target)) == seen:
            return None
        if _digest(lambda n: os.read(fd, n)) != record.blake2b:
            return ("its bytes do not match the BLAKE2b digest recorded when it was written "
                    "(zeroed or overwritten since: a crash before its data reached the disk?)")
        _checked[str(target)] = seen
        return None
    finally:
        os.close(fd)


def _read_record(path: Path) -> CacheRecord | str:
    """The record at ``path``, or why it cannot be used."""
    try:
        with open(path, "rb") as f:
            raw = f.read(RECORD_MAX_BYTES + 1)
    except FileNotFoundError:
        return f"it has no record {path.name} of what it was made from (an older cupy_nwt, or a writer that died)"
    except OSError as exc:
        return f"its record {path.name} cannot be read ({exc.strerror or exc})"
    if len(raw) > RECORD_MAX_BYTES:
        return f"its record {path.name} is over {RECORD_MAX_BYTES} bytes, not one this library writes"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"its record {path.name} is not valid JSON ({type(exc).__name__})"
    names = [f.name for f in fields(CacheRecord)]
    if not isinstance(data, dict) or sorted(data) != sorted(names):
        return f"its record {path.name} does not hold exactly the fields {', '.join(names)}"
    for name in names:
        value = data[name]
        if name in ("source", "key", "blake2b"):
            if type(value) is not str:
                return f"its record {path.name} has {name} = {value!r:.60}, not a string"
        elif type(value) is not int or value < 0:
            return f"its record {path.name} has {name} = {value!r:.60}, not a count"
    if data["format"] != FORMAT:
        return f"its record {path.name} is of format {data['format']}, not {FORMAT}"
    if not _DIGEST_HEX.fullmatch(data["blake2b"]):
        return f"its record {path.name} has a blake2b that is not 128 hex digits"
    return CacheRecord(**data)


def _digest(read: Callable[[int], bytes]) -> str:
    h = hashlib.blake2b()
    while chunk := read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _build(path: Path, target: Path, made_from: dict[str, Any]) -> None:
    """Inflate ``path`` into ``target`` with its record; both reach the disk before they are renamed into place
    (the record first: its target is renamed in as the outer block ends).

    Runs under the target's lock, so a leftover temporary file of this target is a dead writer's.
    """
    out_dir = target.parent
    for stale in out_dir.glob(f".{target.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    h, length = hashlib.blake2b(), 0
    with atomic_open(target) as dst:
        with open(path, "rb") as raw, gzip.open(raw, "rb") as src:
            try:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    h.update(chunk)
                    length += len(chunk)
            except EOFError:
                raise DamagedArchiveError(path, made_from["source_size"], "the gzip stream ends before its "
                                          "end marker (a truncated file?)") from None
            except (gzip.BadGzipFile, zlib.error) as exc:
                raise DamagedArchiveError(path, raw.tell(), f"corrupt gzip data ({exc})") from exc
        record = CacheRecord(format=FORMAT, **made_from, length=length, blake2b=h.hexdigest())
        with atomic_open(record_path(target)) as f:
            f.write(json.dumps(asdict(record)).encode("utf-8"))
    fsync_dir(out_dir)
    st = target.stat()
    _checked[str(target)] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, record.blake2b)
