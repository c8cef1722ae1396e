"""Files written whole or not at all: the package's one atomic writer, used by every file it writes.

A result, a saved pick, a tar shard, an inflated cache: a reader (another process, a later run) must
see the old file or the whole new one, never half, and a crash must leave no partial file under the
final name. Each is written to a temporary file beside its target, flushed to disk, then renamed
over it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import ArgumentError

__all__ = ["atomic_open", "fsync_dir", "make_folder"]


def make_folder(path: Path, name: str) -> None:
    """Make folder ``path`` and its parents. A file where a folder must be is the caller's argument
    ``name`` at fault (``cache_dir``, ``path``): one ``ArgumentError`` says which file, not the
    ``FileExistsError`` / ``NotADirectoryError`` that ``mkdir`` raises for it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise ArgumentError(f"{name} {path}: {blocker} is a file, not a folder") from None


@contextmanager
def atomic_open(path: str | os.PathLike[str], name: str = "path") -> Iterator[IO[bytes]]:
    """A binary file that replaces ``path`` atomically when the block ends, and vanishes if it fails.

    A reader sees the old file or the whole new one, never half; a failed or interrupted write
    leaves nothing. Missing folders are created here, when there is something to write. The file
    gets the mode a plain ``open()`` would give (0666 less the umask): ``tempfile.mkstemp`` would
    make every result 0600, unreadable to the rest of a group that shares them. A folder at ``path``,
    or a file where one of its folders must be, is an ``ArgumentError`` naming the argument ``name``.
    """
    target = Path(path)
    if target.is_dir():
        raise ArgumentError(f"{name} {target} is a directory, not a file")
    make_folder(target.parent, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    """Make the renames into ``path`` durable (a no-op where folders cannot be opened, as on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
