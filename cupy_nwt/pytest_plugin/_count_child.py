"""Run under callgrind by :mod:`cupy_nwt.pytest_plugin._count`: make the planned batches, counted.

Run by path (``python child.py PLAN``), from a copy beside the plan in the count's own folder under
``/tmp``, so that importing it pulls in neither pytest nor the plugin, and the folder Python puts first
on ``sys.path`` (the script's, resolved) is as long wherever the package is installed. The plan is a pickle of ``(maker, batches)``: a loader's ``BatchMaker`` and ``[(indices, seed),
...]``. The first batch is made once, uncounted, so lazy imports and first-use caches stay out of the
count; then the garbage collector runs, so every run enters the counted region in the same state.

Only the region is counted. On x86-64 (:func:`requests_work`) callgrind starts with instrumentation
off (``--instr-atstart=no``: the interpreter's start-up and imports run some 2.5x faster than
instrumented) and this process switches it on, and collection on and off around the region, with
valgrind's client requests: the same few instructions ``callgrind.h`` emits, called through ctypes.
Elsewhere everything is instrumented and callgrind collects only inside ``PyRun_SimpleStringFlags``,
through which the region is run (``--toggle-collect``); nothing else in the process calls it.

The region is also bracketed by a ``stat`` of each of two marker paths (:data:`MARKERS`), so that
valgrind's system-call log can be cut to it. Run natively (``--native RESULT``), the same region is
made without valgrind and its minor and major page faults (``getrusage``) and CPU seconds are written
to RESULT as JSON: page faults are the kernel's work, and valgrind's own memory management would
swamp them in a process it runs.
"""

from __future__ import annotations

import ctypes
import gc
import json
import marshal
import mmap
import os
import pickle
import platform
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

#: callgrind's requests (callgrind.h): its tool base ('C', 'T') plus the request's place in its enum
_BASE = (ord("C") << 24) | (ord("T") << 16)
TOGGLE_COLLECT, START_INSTRUMENTATION = _BASE + 2, _BASE + 4
#: x86-64: rax = the request's six words (rdi), rdx = 0, the four rotations of rdi by 128 bits in all
#: (no change natively) and ``xchg rbx, rbx``, which valgrind reads as a request; returns rdx.
_X86_64_REQUEST = bytes.fromhex("4889f8" "31d2" "48c1c703" "48c1c70d" "48c1c73d" "48c1c733" "4887db" "4889d0" "c3")

#: paths that never exist, ``stat``ed just before and just after the region
MARKERS = ("/nonexistent/cupy-nwt-count-region-begin", "/nonexistent/cupy-nwt-count-region-end")

#: the link to the checkout in this process's working folder (``_count_view.LINK``)
LINK = ".nwt-checkout"

_plan: tuple[Any, list[tuple[Any, int]]] | None = None
failed: list[BaseException] = []


def requests_work() -> bool:
    """Whether this machine's client requests are known here (else the ``--toggle-collect`` way)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def requester() -> Callable[[int], int]:
    """A function issuing one callgrind request (a no-op when not under valgrind)."""
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(_X86_64_REQUEST)
    call = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))

    def request(code: int) -> int:
        words = (ctypes.c_uint64 * 6)(code, 0, 0, 0, 0, 0)
        return int(call(ctypes.addressof(words)))

    request.keep = (buf, call)  # type: ignore[attr-defined]
    return request


def region() -> None:
    """Make every planned batch: what callgrind counts."""
    assert _plan is not None
    maker, batches = _plan
    try:
        for indices, seed in batches:
            maker.make(indices, seed)
    except BaseException as exc:  # noqa: BLE001 - carried out of the counted region, reported below
        failed.append(exc)


def mark(path: str) -> None:
    try:
        os.stat(path)
    except OSError:
        pass


def native(result: str) -> None:
    """The region without valgrind: its page faults and CPU seconds, written to ``result``."""
    gc.collect()
    mark(MARKERS[0])
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    region()
    t1, r1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    mark(MARKERS[1])
    with open(result, "w") as f:
        json.dump({"minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt,
                   "cpu_s": t1 - t0, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}, f)


class _Anything:
    """A folder's listing that holds every name: :class:`Unlisted` then asks the file system for each file."""

    def __contains__(self, name: object) -> bool:
        return True


ANYTHING = _Anything()


def unlisted(finder: Any) -> Any:
    """``FileFinder`` that never lists its folder: each import asks for its candidate files by name instead.

    A ``FileFinder`` keeps its folder's listing, a set of every name in it, in memory: the names of the
    checkout's folders (a baseline saved beside the test, pytest's ``__pycache__`` and cache, the
    user's own files) and of an editable install's root then moved where the counted region's memory
    landed, and its cost with it (0.02% to 0.09% for one file more beside the README's test). Unlisted,
    what the import system holds depends only on which modules it looked for and found.
    """
    if not callable(getattr(finder, "_fill_cache", None)):
        return finder  # another interpreter's finder: listed as it lists

    class Unlisted(finder):
        def _fill_cache(self) -> None:
            self._path_cache = ANYTHING
            self._relaxed_path_cache = ANYTHING

    return Unlisted


def checkout_code(pyc: str) -> None:
    """Import the checkout's modules from ``pyc`` (compiled for this count under their names here), else
    from their source: never from the checkout's ``__pycache__``; and find every module without listing
    a folder (:func:`unlisted`), so that what else lies in a folder on ``sys.path`` does not count.

    A module's cached code holds the path it was compiled at (the caller's checkout, or the base
    revision's worktree); reading it allocates that string, whose length moved the cost.
    """
    from importlib.machinery import (  # noqa: PLC0415
        BYTECODE_SUFFIXES,
        EXTENSION_SUFFIXES,
        SOURCE_SUFFIXES,
        ExtensionFileLoader,
        FileFinder,
        SourceFileLoader,
        SourcelessFileLoader,
    )

    views = tuple(os.path.join(top, LINK) for top in ("/proc/self/cwd", os.getcwd()))

    class Compiled(SourceFileLoader):
        def get_code(self, fullname: str) -> Any:
            rel = next((self.path[len(v) + 1:] for v in views if self.path.startswith(v + "/")), None)
            try:
                if rel is not None:
                    with open(os.path.join(pyc, f"{rel}c"), "rb") as f:
                        return marshal.loads(f.read()[16:])
            except (OSError, ValueError):
                pass
            return self.source_to_code(self.get_data(self.path), self.path)

    finder = unlisted(FileFinder)
    checkout = finder.path_hook((ExtensionFileLoader, EXTENSION_SUFFIXES), (Compiled, SOURCE_SUFFIXES),
                                (SourcelessFileLoader, BYTECODE_SUFFIXES))
    elsewhere = finder.path_hook((ExtensionFileLoader, EXTENSION_SUFFIXES), (SourceFileLoader, SOURCE_SUFFIXES),
                                 (SourcelessFileLoader, BYTECODE_SUFFIXES))

    def hook(path: str) -> Any:
        if path in views or path.startswith(tuple(v + "/" for v in views)):
            return checkout(path)
        if path and os.path.isdir(path):
            return elsewhere(path)
        raise ImportError("not a folder")  # a zip file's or another hook's

    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()
    with open(os.path.join(os.path.dirname(pyc), "path.json"), encoding="utf-8") as f:
        given = json.load(f)
    unlisted_metadata(given["metadata"])
    sys.path[0:0] = given["path"]
    sys.path.extend(p for p in given.get("after", []) if p not in sys.path)


def unlisted_metadata(listed: dict[str, list[str]]) -> None:
    """``importlib.metadata`` reads the names of distributions' metadata in each ``sys.path`` folder it
    searches (NumPy's testing module asks for NumPy's): for the folders given, from ``listed`` (their
    metadata's names, read by the caller), so that the rest of a checkout folder's listing (a saved
    baseline, pytest's caches) is never held, even for a moment, in this process."""
    try:
        from importlib import metadata  # noqa: PLC0415
    except ImportError:
        return
    fast: Any = vars(metadata).get("FastPath")  # a private class: where it is not, folders are listed
    listing = getattr(fast, "children", None)
    if listing is None:
        return

    def children(self: Any) -> Any:
        names = listed.get(str(getattr(self, "root", "")))
        return list(names) if names is not None else listing(self)

    fast.children = children


def as_a_worker(dataset: Any) -> None:
    """Make the batches as worker 0 of a loader seeded 0 does in epoch 0: its ``get_worker_info()``, and
    Python's and NumPy's global generators seeded from its seed. A random draw (a seeded per-sample
    transform, a dataset's ``np.random``) is then the same in every count, whatever this process's id,
    so its work is too."""
    from cupy_nwt._worker_info import WorkerInfo, enter_process, worker_seed  # noqa: PLC0415
    from cupy_nwt.loader.workers.process_main import seed_globals  # noqa: PLC0415

    seed = worker_seed(0, 0, 0)
    enter_process(WorkerInfo(0, 1, seed, dataset))
    seed_globals(seed)


def main(argv: list[str]) -> int:
    global _plan
    checkout_code(os.path.join(os.path.dirname(argv[1]), "pyc"))
    with open(argv[1], "rb") as f:
        _plan = pickle.load(f)
    maker, batches = _plan
    if not batches:
        print("the counting plan holds no batch", file=sys.stderr)
        return 2
    as_a_worker(maker.dataset)
    maker.make(*batches[0])
    if len(argv) > 3 and argv[2] == "--native":
        native(argv[3])
    elif requests_work():
        request = requester()
        gc.collect()
        request(START_INSTRUMENTATION)
        mark(MARKERS[0])
        request(TOGGLE_COLLECT)
        region()
        request(TOGGLE_COLLECT)
        mark(MARKERS[1])
    else:
        gc.collect()
        mark(MARKERS[0])
        ctypes.pythonapi.PyRun_SimpleString(b"region()")
        mark(MARKERS[1])
    if failed:
        exc = failed[0]
        print(f"making a counted batch failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: the plan's, nothing to import from
    sys.exit(main(sys.argv))
