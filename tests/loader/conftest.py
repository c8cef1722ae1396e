"""Fixtures of the loader's tests."""

import pytest
from parity_backends import BACKENDS, tud

import cupy_nwt


@pytest.fixture(params=["torchdata", "cupy_nwt", "cupy_nwt-threads"])
def stateful_backend(request):
    """A resumable loader's maker, ``make(dataset, **kwargs)``: torchdata's ``StatefulDataLoader`` (skipped without
    torchdata), or cupy_nwt's ``DataLoader`` with process or thread workers; ``make.name`` says which. cupy_nwt
    loaders get ``seed=0`` unless given a seed or a generator."""
    name = request.param
    if name == "torchdata":
        sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is a test-only extra")

    def make(dataset, **kw):
        if name == "torchdata":
            return sdl.StatefulDataLoader(dataset, **kw)
        if "generator" not in kw:
            kw.setdefault("seed", 0)
        kind = "thread" if name.endswith("threads") else "process"
        return cupy_nwt.DataLoader(dataset, device="cpu", worker_type=kind, **kw)

    make.name = name
    return make


@pytest.fixture(params=BACKENDS)
def backend(request, worker_type):
    if request.param == "torch" and worker_type != "process":
        pytest.skip("torch's loader has no thread workers: its cases run once, beside cupy_nwt's process workers")
    if request.param == "cupy_nwt":
        return lambda dataset, **kw: cupy_nwt.DataLoader(dataset, device="cpu", **kw)
    return tud.DataLoader
