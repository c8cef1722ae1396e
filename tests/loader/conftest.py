"""Fixtures of the loader's tests."""

import pytest
from parity_backends import BACKENDS, tud

import cupy_nwt


@pytest.fixture(params=BACKENDS)
def backend(request, worker_type):
    if request.param == "torch" and worker_type != "process":
        pytest.skip("torch's loader has no thread workers: its cases run once, beside cupy_nwt's process workers")
    if request.param == "cupy_nwt":
        return lambda dataset, **kw: cupy_nwt.DataLoader(dataset, device="cpu", **kw)
    return tud.DataLoader
