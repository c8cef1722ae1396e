"""Shared fixtures: ``worker_type`` runs a loader test file once per kind of worker.

A loader test module opts in with ``pytestmark = pytest.mark.usefixtures("worker_type")``: every
``DataLoader`` its tests build without naming ``worker_type`` then gets the parametrised one, so one
test body checks process and thread workers alike. A test about processes alone (a SIGKILL, a start
method, worker PIDs, /dev/shm) carries ``@pytest.mark.process_only("why threads have no analogue")``
and is skipped for threads with that reason.
"""

from __future__ import annotations

import pytest

from cupy_nwt.loader import DataLoader
from cupy_nwt.loader.workers.kinds import WORKER_TYPES


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
