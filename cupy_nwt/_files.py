"""Files written whole or not at all: the package's one atomic writer, used by every file it writes.

A result, a saved pick, a tar shard, an inflated cache: a reader (another process, a later run) must
see the old file or the whole new one, never half, and a crash must leave no partial file under the
final name. Each is written to a temporary file beside its target, flushed to disk, then renamed
over it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import ArgumentError

__all__ = ["atomic_folder", "atomic_open", "check_writable", "fresh_folder", "fsync_dir", "make_folder", "same_file", "special_file",
           "writable_base"]


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
    A link is followed (the file it names is replaced, the link kept), and what is no regular file (a
    device such as /dev/null or /dev/stdout, a pipe) is written as it is: nothing to replace there.
    """
    target = Path(path)
    if target.is_dir():
        raise ArgumentError(f"{name} {target} is a directory, not a file")
    if special_file(target):  # /dev/null, /dev/stdout, a pipe: written as they are, never replaced
        with open(target, "wb") as stream:
            yield stream
        return
    if target.is_symlink():  # the file the link names is replaced; the link stays
        target = Path(os.path.realpath(target))
    make_folder(target.parent, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask
            break
        except FileExistsError:
            continue
        except OSError as exc:  # what ``check_writable`` could not foresee: said of the path, not of a temp name
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def special_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (its links followed) is something other than a regular file: a device, a pipe, a socket."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (through links too), existing or not."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet: the same name, links followed
        return os.path.realpath(a) == os.path.realpath(b)


def check_writable(path: str | os.PathLike[str], name: str, *, folder: bool = False) -> None:
    """Fail before a long run, not after it, when ``path`` (a file, or with ``folder`` a folder) cannot be
    written: it is the other kind, or its nearest existing parent is a file or not writable. One-line
    ``ArgumentError`` starting with ``name`` (the option or argument). Only checks: nothing is left here (a
    folder made and removed at once tells a read-only mount), so a command that then fails leaves no folder
    behind; the writers create missing folders when they write. A mount point (``--out``) must take files itself.
    """
    target = Path(path)
    if folder and target.exists() and not target.is_dir():
        raise ArgumentError(f"{name} {path} is a file, not a folder")
    if not folder and target.is_dir():
        raise ArgumentError(f"{name} {path} is a directory, not a file")
    if not folder and special_file(target):  # a device or a pipe is written as it is (``atomic_open``)
        if not os.access(target, os.W_OK):
            raise ArgumentError(f"{name} {path} is not writable")
        return
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    within = folder and target.is_dir() and os.path.ismount(target)  # a mount point is filled in place
    _, why = writable_base(target.absolute() if within else target.absolute().parent)
    if why is not None:
        raise ArgumentError(f"{name} {path}: {why}")


def writable_base(path: Path) -> tuple[Path, str | None]:
    """The nearest existing path at or above folder ``path``, and why new files cannot be made under it
    (None: they can): what every writer checks before a long run that would otherwise fail at its end."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return existing, f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return existing, f"{existing} is not writable"
    try:  # what permissions cannot tell: a read-only mount or /proc, even to root
        fresh_folder(existing, ".cupy-nwt-probe-").rmdir()
    except OSError as exc:
        return existing, f"nothing can be made in {existing} ({exc.strerror or exc})"
    return existing, None


@contextmanager
def atomic_folder(path: str | os.PathLike[str], name: str = "path") -> Iterator[Path]:
    """A new folder to fill that replaces ``path`` whole when the block ends, and vanishes if it fails.

    A folder of results read together (a report and the files it names) must not mix two runs or
    stop half-way: the block fills a staging folder beside ``path`` (one file system, so the rename
    is atomic), which then takes its place; an old folder there is moved aside first and removed
    after. A failed or interrupted block leaves the old folder (or nothing): no staging folder, and
    none of the missing parent folders it made. The folder's mode is what the umask gives.

    A mount point (a container's volume, ``-v $PWD/out:/out``) cannot be renamed: there the staging folder
    is made inside it and its entries take the place of the old ones, one rename each, at the end.
    """
    target = Path(path)
    if target.is_dir() and os.path.ismount(target):
        with _folder_in_place(target, name) as stage:
            yield stage
        return
    made = []
    parent = target.absolute().parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    try:
        for folder in reversed(made):
            folder.mkdir()
        stage = _new_beside(target, "tmp")
    except OSError as exc:  # what ``check_writable`` could not foresee (/proc, a full disk): the argument, not a temp name
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise ArgumentError(f"{name} {target}: cannot make a folder in {target.absolute().parent} "
                            f"({exc.strerror or exc})") from None
    old: Path | None = None
    try:
        yield stage
        if target.exists():
            old = _new_beside(target, "old")
            old.rmdir()
            os.rename(target, old)
        os.rename(stage, target)
        fsync_dir(target.absolute().parent)
    except BaseException:
        if old is not None and not target.exists():
            os.rename(old, target)
        shutil.rmtree(stage, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _folder_in_place(target: Path, name: str) -> Iterator[Path]:
    """``atomic_folder`` for a folder that cannot be renamed: staged inside it, its old entries moved aside (inside
    it too) and the new ones renamed in at the end; a failed block, or a failed swap, leaves the old entries."""
    try:
        stage = fresh_folder(target, ".", ".tmp")
    except OSError as exc:
        raise ArgumentError(f"{name} {target}: cannot make a folder in it ({exc.strerror or exc})") from None
    try:
        yield stage
        old = fresh_folder(target, ".", ".old")
        try:
            for entry in sorted(set(os.listdir(target)) - {stage.name, old.name}):
                os.rename(target / entry, old / entry)
            for entry in sorted(os.listdir(stage)):
                os.rename(stage / entry, target / entry)
            fsync_dir(target)
        except BaseException:
            for entry in sorted(set(os.listdir(target)) - {stage.name, old.name}):
                _remove(target / entry)
            for entry in sorted(os.listdir(old)):
                os.rename(old / entry, target / entry)
            old.rmdir()
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _new_beside(target: Path, kind: str) -> Path:
    """A new empty folder of an unused name beside ``target``."""
    return fresh_folder(target.parent, f".{target.name}.", f".{kind}")


def fresh_folder(parent: Path, prefix: str, suffix: str = "") -> Path:
    """A new empty folder in ``parent`` named ``prefix``, random hex and ``suffix``, with the mode the umask
    gives: ``tempfile.mkdtemp``'s 0700, renamed into a shared cache, would shut the rest of the group out."""
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


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
