"""Shared fixtures, and the one import rule of this tree.

``tests/`` mirrors the package in folders without ``__init__.py``: test modules and their helpers
(``toy_data``, ``plugin_projects``, ``launch_rank``, fixtures one test module takes from another) are
imported by their bare names. So every folder here goes on ``sys.path`` before any test module is
imported, whatever pytest collects first, and two files with one name are refused up front.

``worker_type`` runs a loader test file once per kind of worker.

A loader test module opts in with ``pytestmark = pytest.mark.usefixtures("worker_type")``: every
``DataLoader`` its tests build without naming ``worker_type`` then gets the parametrised one, so one
test body checks process and thread workers alike. A test about processes alone (a SIGKILL, a start
method, worker PIDs, /dev/shm) carries ``@pytest.mark.process_only("why threads have no analogue")``
and is skipped for threads with that reason.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

from cupy_nwt.loader import DataLoader
from cupy_nwt.loader.workers.kinds import WORKER_TYPES

TESTS = Path(__file__).resolve().parent


def _put_folders_on_path() -> None:
    by_name: defaultdict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1 and name != "conftest.py"}
    if clashes:
        raise pytest.UsageError(f"tests/ holds two modules of one name (they would shadow each other): {clashes}")
    for folder in sorted({p.parent for p in TESTS.rglob("*.py")}, reverse=True):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


_put_folders_on_path()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "process_only(reason): a worker_type test with no thread analogue")


@pytest.fixture(params=WORKER_TYPES)
def worker_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    only = request.node.get_closest_marker("process_only")
    if only is not None and request.param != "process":
        pytest.skip(f"process workers only: {only.args[0] if only.args else 'no thread analogue'}")
    defaults = DataLoader.__init__.__kwdefaults__
    assert defaults is not None and "worker_type" in defaults
    monkeypatch.setitem(defaults, "worker_type", request.param)
    return str(request.param)
