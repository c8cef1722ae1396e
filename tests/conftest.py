"""Shared fixtures, and the one import rule of this tree.

``tests/`` mirrors the package in folders without ``__init__.py``: test modules and their helpers
(``toy_data``, ``plugin_projects``, ``launch_rank``, fixtures one test module takes from another) are
imported by their bare names. So every folder here goes on ``sys.path`` before any test module is
imported, whatever pytest collects first, and two files with one name are refused up front.

``worker_type`` runs a loader test file once per kind of worker.

torch's iterators with workers are shut down as the test that made them ends
(``torch_workers_end_with_their_test``).

A loader test module opts in with ``pytestmark = pytest.mark.usefixtures("worker_type")``: every
``DataLoader`` its tests build without naming ``worker_type`` then gets the parametrised one, so one
test body checks process and thread workers alike. A test about processes alone (a SIGKILL, a start
method, worker PIDs, /dev/shm) carries ``@pytest.mark.process_only("why threads have no analogue")``
and is skipped for threads with that reason.

Under pytest-xdist (``-n 2``, what CI runs) each test file runs whole on one worker, in its own order (a
docs page's code blocks use what the page's earlier blocks wrote), and the files holding the most tests
marked ``slow`` start first, so that the workers end together rather than one waiting on the other's
last long file.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cupy_nwt.loader import DataLoader
from cupy_nwt.loader.workers.kinds import WORKER_TYPES

TESTS = Path(__file__).resolve().parent
#: what pytest-xdist tells each of its workers; a pytest this suite starts (a user's run, through pytester or
#: a docs block) is a single process, and pytest-benchmark in it would take these for xdist's and record nothing
XDIST_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


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
    for var in XDIST_VARIABLES:
        os.environ.pop(var, None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole files, in collection order, unless the command named a ``--dist`` of its own."""
    if config.getoption("dist") != "load":
        return None
    try:  # xdist calls this hook, so it is there; the GPU machine's image has no xdist, and the suite runs there
        from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415
    except ImportError:
        return None
    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


@pytest.fixture(params=WORKER_TYPES)
def worker_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    only = request.node.get_closest_marker("process_only")
    if only is not None and request.param != "process":
        pytest.skip(f"process workers only: {only.args[0] if only.args else 'no thread analogue'}")
    defaults = DataLoader.__init__.__kwdefaults__
    assert defaults is not None and "worker_type" in defaults
    monkeypatch.setitem(defaults, "worker_type", request.param)
    return str(request.param)


_TORCH_ITERATORS: weakref.WeakSet[Any] = weakref.WeakSet()
# torch's multiprocessing iterator, and torchdata's, which is a copy of it rather than a subclass
_ITERATOR_CLASSES = (("torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter"),
                     ("torchdata.stateful_dataloader.stateful_dataloader", "_StatefulMultiProcessingDataLoaderIter"))
_WATCHED: set[str] = set()


def _torch_iterators() -> weakref.WeakSet[Any]:
    """Every torch (or torchdata) multiprocessing iterator made from now on, once its module is imported."""
    for module_name, class_name in _ITERATOR_CLASSES:
        module = sys.modules.get(module_name)
        if module is None or module_name in _WATCHED:
            continue
        cls = getattr(module, class_name)
        init = cls.__init__

        def registered(self: Any, *args: Any, _init: Any = init, **kwargs: Any) -> None:
            _TORCH_ITERATORS.add(self)
            _init(self, *args, **kwargs)

        cls.__init__ = registered
        _WATCHED.add(module_name)
    return _TORCH_ITERATORS


@pytest.fixture(autouse=True)
def torch_workers_end_with_their_test() -> Iterator[None]:
    """A torch iterator whose batch raised stays in a reference cycle (the error's traceback holds the frame
    that raised it, which holds the error and the iterator) until the cyclic collector runs, during some
    later test; its queues may be finalized before it then, and its shutdown waits 5 s for each worker
    there (10-20 s of CI landing in unrelated tests). Each one is shut down as its test ends instead,
    by torch's own shutdown, as dropping it at once would have done."""
    _torch_iterators()
    yield
    for it in list(_torch_iterators()):
        it._shutdown_workers()
