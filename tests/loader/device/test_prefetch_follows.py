"""``device``, ``pin_memory`` and ``output`` set on a loader after construction: the next iteration's batches
land, are pinned and come out as the new value says, as a script that moves its loader expects.

``Gpu`` is the lazy fake GPU of ``test_prefetch`` that also remembers the device arrays it handed out, so a
test can tell a batch on the "GPU" from one on the host. Each loader is made, iterated, changed, iterated
again, through the public surface only.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_prefetch import LazyCuda
from toy_data import Squares

from cupy_nwt import DataLoader
from cupy_nwt.loader import LoaderParts

N, BATCH = 20, 4
LABELS = [list(range(b, b + BATCH)) for b in range(0, N, BATCH)]

# (num_workers, the loader's other arguments): the main process's ring, and persistent workers' shared one
STAGES = [
    pytest.param(0, {}, id="workers0"),
    pytest.param(2, {"persistent_workers": True, "worker_type": "thread"}, id="persistent-threads"),
    pytest.param(2, {"persistent_workers": True, "worker_type": "process", "multiprocessing_context": "fork"},
                 id="persistent-processes"),
]


class Gpu(LazyCuda):
    def __init__(self) -> None:
        super().__init__()
        self.made: list[np.ndarray] = []

    def empty(self, shape, dtype, stream):
        a = super().empty(shape, dtype, stream)
        self.made.append(a)
        return a

    def on_gpu(self, batch) -> bool:
        """Every array of ``batch`` lies in memory this fake GPU handed out."""
        return all(any(np.shares_memory(np.asarray(a), d) for d in self.made) for a in batch)

    def open_registrations(self) -> int:
        return sum(r.open for r in self.registrations)


def loader(ops: Gpu, device: str, num_workers: int = 0, **kw) -> DataLoader:
    return DataLoader(Squares(N, modulo=200), batch_size=BATCH, device=device, num_workers=num_workers,
                      parts=LoaderParts(ops=ops), **kw)


def epoch(dl: DataLoader, ops: Gpu) -> tuple[list[bool], list[list[int]]]:
    """Where each batch of one epoch lay, and its labels (read as a kernel would, after the copy's wait)."""
    where, labels = [], []
    for b in dl:
        where.append(ops.on_gpu(b))
        labels.append(ops.consume([np.asarray(a) for a in b])[1].tolist())
    return where, labels


@pytest.mark.parametrize(("num_workers", "kw"), STAGES)
def test_a_host_loader_set_to_cuda_copies_its_next_epochs_to_the_gpu(num_workers, kw):
    ops = Gpu()
    with loader(ops, "cpu", num_workers, **kw) as dl:
        assert epoch(dl, ops) == ([False] * len(LABELS), LABELS)
        dl.device = "cuda"
        assert dl.pin_path == "none" and dl.stats().copy.startswith("h2d")
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        dl.pin_memory = True
        assert dl.pin_path == "registered"
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "registered" and ops.open_registrations() == 1
    assert ops.open_registrations() == 0


@pytest.mark.parametrize(("num_workers", "kw"), STAGES)
def test_a_gpu_loader_set_to_cpu_hands_out_host_batches_and_unregisters_its_ring(num_workers, kw):
    ops = Gpu()
    with loader(ops, "cuda", num_workers, pin_memory=True, **kw) as dl:
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "registered"
        with pytest.warns(UserWarning, match="no accelerator"):  # torch's: pinning without a GPU does nothing
            dl.device = "cpu"
        assert dl.pin_path == "none"
        assert epoch(dl, ops) == ([False] * len(LABELS), LABELS)
        assert ops.open_registrations() == 0 and dl.slots_in_use() == 0
        assert not dl.stats().copy.startswith("h2d")
        dl.device = "cuda"
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "registered" and ops.open_registrations() == 1
    assert ops.open_registrations() == 0


@pytest.mark.parametrize(("num_workers", "kw"), STAGES)
def test_pin_memory_set_on_a_gpu_loader_changes_how_its_ring_is_pinned(num_workers, kw):
    ops = Gpu()
    with loader(ops, "cuda", num_workers, pin_memory=True, **kw) as dl:
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "registered" and ops.open_registrations() == 1 and ops.pinned_count == 0
        dl.pin_memory = "staging"
        assert dl.pin_path == "staging"  # what the next iteration will try, before it starts
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "staging" and ops.open_registrations() == 0 and ops.pinned_count > 0
        dl.pin_memory = False
        staged = ops.pinned_count
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "none" and ops.open_registrations() == 0 and ops.pinned_count == staged
        dl.pin_memory = True
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        assert dl.pin_path == "registered" and ops.open_registrations() == 1
    assert ops.open_registrations() == 0


def test_output_set_on_a_gpu_loader_changes_the_framework_of_its_batches():
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    ops = Gpu()
    with loader(ops, "cuda", output="cupy") as dl:
        assert all(type(x) is np.ndarray for x, _ in dl)  # the fake GPU's arrays, handed out as they are
        dl.output = "torch"
        got = [(x, y) for x, y in dl]
        assert len(got) == len(LABELS) and all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                                               for x, y in got)
        assert all(ops.on_gpu(b) for b in got)


def test_a_live_gpu_iterator_ends_when_an_iteration_starts_on_the_host():
    """On the GPU a new iteration ends the one before; one that leaves the GPU does too, before its prefetcher goes."""
    ops = Gpu()
    with loader(ops, "cuda", pin_memory=True) as dl:
        old = iter(dl)
        assert ops.on_gpu(next(old))
        with pytest.warns(UserWarning, match="no accelerator"):
            dl.device = "cpu"
        new = iter(dl)
        first = next(new)
        assert not ops.on_gpu(first) and first[1].tolist() == LABELS[0]
        with pytest.raises(StopIteration):
            next(old)
        assert [b[1].tolist() for b in new] == LABELS[1:]
        assert ops.open_registrations() == 0 and dl.slots_in_use() == 0


def test_a_live_host_iterator_keeps_its_workers_and_the_host_when_the_loader_moves_to_the_gpu():
    """An iteration of its own (workers not persistent) runs to its end as it began, on the host."""
    ops = Gpu()
    with loader(ops, "cpu", 2, worker_type="thread") as dl:
        old = iter(dl)
        head = [next(old) for _ in range(2)]
        dl.device = "cuda"
        assert epoch(dl, ops) == ([True] * len(LABELS), LABELS)
        rest = list(old)
        assert [b[1].tolist() for b in head + rest] == LABELS
        assert not any(ops.on_gpu(b) for b in head + rest)
        assert dl.slots_in_use() == 0



@pytest.mark.gpu
def test_gpu_a_persistent_ring_moves_between_prefetchers_and_devices():
    """On CUDA: the old prefetcher unregisters the ring before the new one registers it (a second
    cudaHostRegister of a registered range is refused, which would show as 'staging')."""
    from cupy_nwt import cuda

    ref = [y.tolist() for _, y in DataLoader(Squares(N), batch_size=BATCH, device="cpu", output="numpy")]
    with DataLoader(Squares(N), batch_size=BATCH, device="cpu", num_workers=2, persistent_workers=True,
                    output="numpy") as dl:
        assert [y.tolist() for _, y in dl] == ref
        dl.output = "auto"  # "numpy" and "cupy" are each refused on the other device
        dl.device = "cuda"
        dl.output = "cupy"
        for pin, path in ((True, "registered"), ("staging", "staging"), (True, "registered")):
            dl.pin_memory = pin
            got = [(cuda.is_device_array(x), cuda.as_numpy(y).tolist()) for x, y in dl]
            assert dl.pin_path == path and got == [(True, r) for r in ref]
        dl.pin_memory, dl.output = False, "auto"
        dl.device = "cpu"
        dl.output = "numpy"
        assert [(type(y), y.tolist()) for _, y in dl] == [(np.ndarray, r) for r in ref]
        assert dl.pin_path == "none"
