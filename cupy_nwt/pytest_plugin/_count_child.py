"""Run under callgrind by :mod:`cupy_nwt.pytest_plugin._count`: make the planned batches, counted.

Run by path (``python _count_child.py PLAN``), so that importing it pulls in neither pytest nor the
plugin: everything before the counted region costs callgrind time, not instructions. The plan is
a pickle of ``(maker, batches)``: a loader's ``BatchMaker`` and ``[(indices, seed), ...]``. The
first batch is made once, uncounted, so lazy imports and first-use caches stay out of the count;
then the garbage collector is run, so every run enters the region in the same state; then the batches
are made by code run through the C API's ``PyRun_SimpleStringFlags``, and callgrind collects only
inside that function (``--collect-atstart=no --toggle-collect=PyRun_SimpleStringFlags``), which
nothing else in the process calls.
"""

from __future__ import annotations

import ctypes
import gc
import pickle
import sys
from typing import Any

_plan: tuple[Any, list[tuple[Any, int]]] | None = None
failed: list[BaseException] = []


def region() -> None:
    """Make every planned batch; the one call callgrind counts."""
    assert _plan is not None
    maker, batches = _plan
    try:
        for indices, seed in batches:
            maker.make(indices, seed)
    except BaseException as exc:  # noqa: BLE001 - carried out of the C API call, reported below
        failed.append(exc)


def main(argv: list[str]) -> int:
    global _plan
    with open(argv[1], "rb") as f:
        _plan = pickle.load(f)
    maker, batches = _plan
    if not batches:
        print("the counting plan holds no batch", file=sys.stderr)
        return 2
    maker.make(*batches[0])
    gc.collect()
    ctypes.pythonapi.PyRun_SimpleString(b"region()")
    if failed:
        exc = failed[0]
        print(f"making a counted batch failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: the package's private modules are not top-level names
    sys.exit(main(sys.argv))
