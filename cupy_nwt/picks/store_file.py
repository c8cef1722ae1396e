"""The file of saved picks: :class:`ResultStore`, one JSON object of records by key, read and written whole.

The file is ``num_workers.json`` in ``platformdirs.user_cache_dir("cupy_nwt")`` (or
``CUPY_NWT_CACHE_DIR``, or an explicit directory). Every update is read-modify-write under a
``filelock`` lock and lands by an atomic replace (``_files.atomic_open``), so concurrent savers never
lose each other's records. A reader takes no lock: it sees the old file or the new one whole, so a
store in a folder this user cannot write (a cache shared read-only) still reads. A store that is a
symlink is read and written where it points, so the link and the file it names stay one store; one
that is no regular file (a device, a pipe) is neither read nor renamed: saving into it is refused.

What is read back is checked before it is used (``schema.py``): a file that cannot be read or does
not validate is set aside, renamed ``num_workers.json.bad-<UTC time>``, with one warning naming it
and why, and the store starts empty; one that cannot be renamed (a folder shared read-only) is left in
place and read as empty, said once, and saving into it is refused. A folder the store cannot be saved
in is one ``ArgumentError`` naming it and ``CUPY_NWT_CACHE_DIR``. A save that would take the file past
what a reader takes (``schema.MAX_STORE_BYTES``) drops the picks saved longest ago to make room, and
says how many.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from .._files import atomic_open, make_folder, special_file, writable_base
from ..errors import ArgumentError, SavedPickError
from ..reporting.tables import to_json
from ..reporting.units import plural
from ..system import CACHE_ENV, cache_dir
from . import schema
from .fingerprint import Fingerprint
from .schema import parse_document

STORE_NAME = "num_workers.json"
STORE_FORMAT = "cupy_nwt.num_workers/1"
LOCK_TIMEOUT_S = 60.0
_log = logging.getLogger("cupy_nwt.tuner")


_SAID: set[Path] = set()  # stores left alone (or left damaged) already warned about in this process


class _LeftAlone(SavedPickError):
    """A store this version neither reads nor sets aside: a newer version's, or no regular file (a device, a pipe)."""


class _Stuck(SavedPickError):
    """A damaged store that cannot be set aside (a folder this user cannot write): read as empty, never saved into."""


def _newer(fmt: Any) -> bool:
    """Whether ``fmt`` names a later version of this store's format."""
    name, _, version = str(fmt).rpartition("/")
    mine, _, my_version = STORE_FORMAT.rpartition("/")
    return isinstance(fmt, str) and name == mine and version.isdigit() and int(version) > int(my_version)


def unwritable(folder: Path, why: str, named: bool) -> ArgumentError:
    """The one line for a store that cannot be saved in ``folder`` (``named``: by ``CUPY_NWT_CACHE_DIR``), and
    where to save it instead."""
    env = f" ({CACHE_ENV})" if named else ""
    return ArgumentError(f"the cache folder {folder}{env} cannot hold the saved picks: {why}; set {CACHE_ENV} "
                         "(or cache_dir=) to a folder you can write")


class ResultStore:
    """The machine-wide file of tuned results, one record (a JSON object) per fingerprint key.

    ``check(record)`` validates each record when the file is read (raising ``SavedPickError``);
    the tuner's store checks them as tuning results (``store.pick_store``). A file that cannot be
    read, is not a store, or holds a record that fails the check is set aside (:meth:`set_aside`).

    Args:
        directory: the store's folder (default: ``CUPY_NWT_CACHE_DIR``, else the user cache dir).
        check: validates one record, raising ``SavedPickError``.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 check: Callable[[Any], Any] | None = None) -> None:
        self.path = cache_dir(directory) / STORE_NAME
        self.check = check
        self._by_env = directory is None and bool(os.environ.get(CACHE_ENV))

    @property
    def file(self) -> Path:
        """The file the store is kept in: ``path``, or the file a symlink there names."""
        return Path(os.path.realpath(self.path))

    def _lock(self) -> FileLock:
        return FileLock(str(self.file) + ".lock", timeout=LOCK_TIMEOUT_S)

    def check_writable(self) -> None:
        """Fail before a long search, not after it, when the pick could not be saved: a store this version leaves
        alone (a newer version's, no regular file), or a folder that cannot be written: one that exists by making
        and removing a file in it (the save replaces the store by a new file: a lock file left by an earlier save
        opens in a folder that takes no new one) and taking the store's lock once (a mode, a read-only mount, a
        lock that cannot be made), one to be made by its nearest existing parent (nothing is created)."""
        try:
            self._validated()
        except _LeftAlone as exc:
            raise ArgumentError(str(exc)) from None
        except SavedPickError:
            pass  # set aside when the pick is saved
        folder = self.file.parent
        if not folder.is_dir():
            _, why = writable_base(folder)
            if why is not None:
                raise unwritable(folder, why, self._by_env)
            return
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{self.file.name}.", suffix=".probe", dir=folder)
        except OSError as exc:
            raise unwritable(folder, f"no new file can be made in it ({exc.strerror or exc})", self._by_env) from None
        os.close(fd)
        os.unlink(probe)
        lock = FileLock(str(self.file) + ".lock", timeout=0)
        try:
            with lock:
                pass
        except Timeout:
            return  # another process holds it, so it can be made
        except OSError as exc:
            raise unwritable(folder, _why(exc), self._by_env) from None

    def _validated(self) -> dict[str, dict[str, Any]]:
        """The records, or ``SavedPickError`` saying why the file is unusable."""
        if special_file(self.file):  # never read (a pipe blocks) nor renamed (a device is the system's)
            raise _LeftAlone(f"{self.path} is no regular file: it is left as it is; remove it, or set {CACHE_ENV} to "
                             "another folder")
        try:
            with open(self.file, "rb") as f:
                data = f.read(schema.MAX_STORE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SavedPickError(f"cannot be read ({exc.strerror or exc})") from None
        doc = parse_document(data)
        if isinstance(doc, dict) and _newer(doc.get("format")):
            raise _LeftAlone(f"{self.file} was written by a newer cupy_nwt ({doc['format']}, this one reads "
                              f"{STORE_FORMAT}): it is left as it is; set {CACHE_ENV} to another folder to keep "
                              "this version's picks apart")
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
        """The records (call under the lock); an unusable file is set aside and counts as empty. A newer
        version's store raises: neither renamed nor overwritten, its picks are that version's."""
        try:
            return self._validated()
        except _LeftAlone:
            raise
        except SavedPickError as exc:
            aside = self.set_aside(str(exc))
            if strict:
                raise SavedPickError(f"{self.path} {exc}; set aside as {self._named(aside)}") from None
            return {}

    def _named(self, aside: Path) -> str:
        return aside.name if aside.parent == self.path.parent else str(aside)

    def set_aside(self, why: str) -> Path:
        """Rename the store to ``<name>.bad-<UTC time>`` and say so once; the next write starts a new one."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        aside = self.file.with_name(f"{self.file.name}.bad-{stamp}")
        try:
            os.replace(self.file, aside)
        except OSError as exc:
            raise self._stuck(why, exc) from None
        _log.warning("saved picks %s %s: set aside as %s; a fresh search will run", self.path, why, self._named(aside))
        return aside

    def _busy(self, done: str) -> SavedPickError:
        """The lock stayed taken past ``LOCK_TIMEOUT_S``: a live process holds it (the kernel frees a dead one's)."""
        return SavedPickError(f"{self.file}.lock stayed held by another process for {LOCK_TIMEOUT_S:g} s (a tuner "
                              f"saving a pick, or a process stopped while saving): the picks were not {done}; try "
                              "again once it ends")

    def _stuck(self, why: str, exc: OSError) -> _Stuck:
        return _Stuck(f"{self.path} {why}, and it cannot be set aside ({exc.strerror or exc}): "
                      f"remove it by hand, or set {CACHE_ENV} to another folder")

    def records(self, strict: bool = False) -> dict[str, dict[str, Any]]:
        """Every saved record by key (a consistent snapshot); ``strict``: a bad file raises after it is set aside.

        A bad file that cannot be set aside (a folder shared read-only) reads as empty too, said once: a reader
        must not fail where a store it cannot change is damaged; ``strict`` raises, and saving into it is refused.
        """
        if not self.path.is_file() and not special_file(self.path):
            return {}
        try:
            return self._validated()
        except _LeftAlone as exc:
            return self._left(exc, strict)
        except SavedPickError as exc:
            why = str(exc)
        lock = self._lock()
        try:
            lock.acquire()
        except Timeout:
            raise self._busy("read") from None
        except OSError as exc:  # no lock file can be made here: neither can the bad file be set aside
            return self._left(self._stuck(why, exc), strict)
        try:
            return self._load(strict)  # again under the lock: another process may have replaced it meanwhile
        except _Stuck as exc:
            return self._left(exc, strict)
        finally:
            lock.release()

    def _left(self, exc: SavedPickError, strict: bool) -> dict[str, dict[str, Any]]:
        """A store read as empty because it is left as it is: raised with ``strict``, else said once."""
        if strict:
            raise SavedPickError(str(exc)) from None
        if self.file not in _SAID:
            _SAID.add(self.file)
            _log.warning("saved picks: %s%s", exc, "; meanwhile it reads as empty" if isinstance(exc, _Stuck) else "")
        return {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records().get(key)

    def put(self, key: str, record: Mapping[str, Any], keep: Callable[[dict[str, Any]], bool] | None = None) -> Path:
        """Add or replace one record; other processes' concurrent puts are kept.

        ``keep(saved_record)``, asked under the lock when ``key`` already has a record, may keep that
        record instead (nothing is written then).
        """
        return self._update(lambda results: _put(results, key, record, keep), newest=key)

    def remove(self, key: str) -> bool:
        if not self.path.is_file():
            return False
        removed = False

        def change(results: dict[str, dict[str, Any]]) -> bool:
            nonlocal removed
            removed = results.pop(key, None) is not None
            return removed

        self._update(change)
        return removed

    def _update(self, change: Callable[[dict[str, dict[str, Any]]], bool], newest: str | None = None) -> Path:
        """Read, ``change`` (True: write the records back) and write, under the lock; within the size a reader
        takes (:meth:`_text`), the record ``newest`` kept."""
        folder = self.file.parent
        try:
            make_folder(folder, "cache_dir")
            with self._lock():
                results = self._load()
                if change(results):
                    text = self._text(results, newest)
                    with atomic_open(self.file) as f:
                        f.write(text.encode("utf-8"))
        except Timeout:
            raise self._busy("saved") from None
        except OSError as exc:
            raise unwritable(folder, _why(exc), self._by_env) from None
        return self.path

    def _text(self, results: dict[str, dict[str, Any]], newest: str | None) -> str:
        """The store's JSON, at most ``schema.MAX_STORE_BYTES`` (what a reader refuses past): where the records
        would take more, the oldest (by ``created``, the time each was saved) are dropped, said in one line."""
        limit = schema.MAX_STORE_BYTES
        text = _document(results)
        if len(text) <= limit:
            return text
        empty = len(_document({}))
        sizes = {k: len(_document({k: rec})) - empty for k, rec in results.items()}
        oldest = sorted((k for k in results if k != newest), key=lambda k: str(results[k].get("created", "")))
        dropped = 0
        while len(text) > limit and oldest:  # sizes are each record's alone: measured again until it fits
            over = len(text) - limit
            while over > 0 and oldest:
                key = oldest.pop(0)
                over -= sizes[key]
                del results[key]
                dropped += 1
            text = _document(results)
        if len(text) > limit:
            raise SavedPickError(f"{self.path}: a pick of {len(text)} bytes is more than the {limit} a store may hold")
        _log.info("saved picks %s: dropped the oldest %s to stay within the %d bytes a store may hold",
                  self.path, plural(dropped, "pick"), limit)
        return text

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


def _document(results: dict[str, dict[str, Any]]) -> str:
    return to_json({"format": STORE_FORMAT, "results": results}) + "\n"


def _why(exc: OSError) -> str:
    return f"{exc.strerror} ({exc.filename})" if exc.filename else str(exc)


def _put(results: dict[str, dict[str, Any]], key: str, record: Mapping[str, Any],
         keep: Callable[[dict[str, Any]], bool] | None) -> bool:
    if key in results and keep is not None and keep(results[key]):
        return False
    results[key] = dict(record)
    return True
