"""A torch user's own code, unchanged, on both loaders: torch tensors in, torch tensors out.

The script is a tutorial's: a ``torch.utils.data.Dataset`` whose ``__getitem__`` normalises a tensor
with torch ops, and the loop ``for images, labels in loader: images = images.to(device); ...;
loss.backward()``. It must run on ``torch.utils.data.DataLoader`` and on ``cupy_nwt.DataLoader``
with the same batches. Then what torch's DataLoader accepts (``generator=torch.Generator()``,
``pin_memory_device``, ``pin_memory=True`` without a GPU: one warning) is accepted too, ``output=``
converts, and torch is never imported for a NumPy dataset.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

import cupy_nwt

torch = pytest.importorskip("torch", reason="torch is a test-only extra")
tud = pytest.importorskip("torch.utils.data", reason="torch is a test-only extra")
nn = torch.nn

N, B = 40, 8
LAYOUTS = [pytest.param({"num_workers": 0}, id="inline"),
           pytest.param({"num_workers": 2}, id="processes"),
           pytest.param({"num_workers": 2, "worker_type": "thread"}, id="threads")]
LOADERS = {"torch": tud.DataLoader, "cupy_nwt": cupy_nwt.DataLoader}


class Images(tud.Dataset):
    """A torchvision-style dataset: a uint8 image tensor, normalised with torch ops, and an int label."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        img = torch.full((3, 8, 8), i % 251, dtype=torch.uint8)
        x = (img.float() / 255.0 - 0.5) / 0.25
        return x, i % 10


def make(which: str, dataset, layout: dict, **kw):
    if which == "torch":
        layout = {k: v for k, v in layout.items() if k != "worker_type"}
    return LOADERS[which](dataset, batch_size=B, **layout, **kw)


def train(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    """The tutorial's loop, as written for torch's DataLoader; what it saw, as NumPy."""
    torch.manual_seed(0)
    device = torch.device("cpu")
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        out = model(images)
        loss = nn.functional.cross_entropy(out, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append((images.numpy().copy(), labels.numpy().copy()))
    return seen


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_unchanged_training_loop_runs_on_both_loaders_with_the_same_batches(layout: dict) -> None:
    got = {}
    for which in LOADERS:
        loader = make(which, Images(), layout)
        got[which] = [train(loader) for _ in range(2)]  # two epochs
        getattr(loader, "close", lambda: None)()
    assert len(got["cupy_nwt"][0]) == N // B
    for (a, la), (b, lb) in zip(sum(got["torch"], []), sum(got["cupy_nwt"], []), strict=True):
        assert a.dtype == b.dtype and la.dtype == lb.dtype
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_samples_give_torch_batches_of_torchs_dtypes(layout: dict) -> None:
    for which in LOADERS:
        images, labels = next(iter(make(which, Images(), layout)))
        assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor), which
        assert (images.dtype, labels.dtype, tuple(images.shape)) == (torch.float32, torch.int64, (B, 3, 8, 8))


@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_zero_copy_tensors_lie_over_the_ring_slot(layout: dict) -> None:
    """With zero_copy, a batch's tensor is the slot itself: valid until the next batch is asked for,
    then the slot is refilled (so it changes); without, each batch is the caller's to keep."""
    for zero_copy in (True, False):
        loader = cupy_nwt.DataLoader(Images(), batch_size=4, zero_copy=zero_copy, **layout)
        it = iter(loader)
        for _ in range(3):  # the first batches, made before the ring, are each their own memory
            third, _ = next(it)
        kept = third.clone()
        rest = [img.clone() for img, _ in it]
        assert len(rest) == N // 4 - 3
        changed = not torch.equal(third, kept)
        assert changed == (zero_copy and layout["num_workers"] > 0), zero_copy  # no ring without workers
        loader.close()


class Arrays:
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return np.full(4, i, np.float32), i


@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_output_option_converts_whatever_the_samples_hold(layout: dict) -> None:
    images, labels = next(iter(cupy_nwt.DataLoader(Arrays(), batch_size=B, output="torch", **layout)))
    assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)
    assert images[:, 0].tolist() == list(range(B))
    images, labels = next(iter(cupy_nwt.DataLoader(Images(), batch_size=B, output="numpy", **layout)))
    assert type(images) is np.ndarray and type(labels) is np.ndarray
    images, _ = next(iter(cupy_nwt.DataLoader(Arrays(), batch_size=B, **layout)))
    assert isinstance(images, torch.Tensor)  # auto in a program that uses torch: what torch's loader gives


def test_output_jax_gives_jax_arrays() -> None:
    """In a child process: JAX's runtime, once started, makes every later loader of this process start
    its workers by forkserver (``loader.workers.start``), which would change the tests that run after this one."""
    pytest.importorskip("jax", reason="JAX is a test-only extra")
    code = ("import jax, numpy as np, cupy_nwt\n"
            "class Arrays:\n    def __len__(self): return 16\n"
            "    def __getitem__(self, i): return np.full(4, i, np.float32), i\n"
            "images, labels = next(iter(cupy_nwt.DataLoader(Arrays(), batch_size=8, output='jax')))\n"
            "assert isinstance(images, jax.Array) and isinstance(labels, jax.Array), (type(images), type(labels))\n"
            "assert np.asarray(images)[:, 0].tolist() == list(range(8))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(("output", "device", "match"), [("tensorflow", "cpu", "output must be"),
                                                         ("cupy", "cpu", "device='cuda'")])
def test_an_output_that_cannot_be_served_is_refused(output: str, device: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cupy_nwt.DataLoader(Arrays(), output=output, device=device)


def test_a_custom_collate_returning_tensors_gives_tensors() -> None:
    loader = cupy_nwt.DataLoader(Images(), batch_size=B, num_workers=2, collate_fn=tud.default_collate)
    batches = list(loader)
    assert all(isinstance(x, torch.Tensor) for b in batches for x in b)
    assert torch.equal(batches[1][1], torch.arange(B, 2 * B) % 10)


def test_numpy_data_never_imports_torch_or_jax() -> None:
    code = ("import sys, numpy as np, cupy_nwt\n"
            "class D:\n    def __len__(self): return 20\n    def __getitem__(self, i): return np.full(3, i), i\n"
            "for layout in ({'num_workers': 0}, {'num_workers': 2}):\n"
            "    assert sum(len(b[0]) for b in cupy_nwt.DataLoader(D(), batch_size=4, **layout)) == 20\n"
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def epoch_orders(loader, epochs: int = 2) -> list[list[int]]:
    return [[int(x) for _, labels in loader for x in labels] for _ in range(epochs)]


class Ids(tud.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.zeros(1), i


@pytest.mark.parametrize("which", LOADERS)
def test_a_torch_generator_seeds_the_shuffle_deterministically(which: str) -> None:
    """The same generator state gives the same epochs, and each epoch its own order; the order is
    each loader's own (cupy_nwt's is not torch.randperm's)."""
    runs = [epoch_orders(make(which, Ids(), {}, shuffle=True, generator=torch.Generator().manual_seed(5)))
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1] and sorted(runs[0][0]) == list(range(N))
    other = epoch_orders(make(which, Ids(), {}, shuffle=True, generator=torch.Generator().manual_seed(6)))
    assert other != runs[0]


@pytest.mark.parametrize("which", LOADERS)
def test_pin_memory_device_is_accepted(which: str) -> None:
    assert len(list(make(which, Ids(), {}, pin_memory_device=""))) == N // B


@pytest.mark.skipif(cupy_nwt.gpu_status().available, reason="the warning is for a machine without a GPU")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for a machine without a GPU")
@pytest.mark.parametrize("which", LOADERS)
def test_pin_memory_without_a_gpu_warns_once_in_torchs_words(which: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place, as a user's Python shows it
        loader = make(which, Ids(), {}, pin_memory=True)
        for _ in range(3):
            assert len(list(loader)) == N // B
    pinned = [w for w in caught if "pin_memory" in str(w.message)]
    assert len(pinned) == 1, [str(w.message) for w in caught]
    assert "no accelerator is found" in str(pinned[0].message)


class DeviceArray:
    """A fake device array: DLPack over host memory, which the fake copy engine fills late."""

    def __init__(self, a: np.ndarray, ops) -> None:
        self.a, self.ops = a, ops
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, **kw):
        self.ops.log.append(("dlpack",))
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("dataset", [Images(), Arrays()], ids=["torch-samples", "numpy-samples"])
def test_on_the_gpu_path_tensors_come_through_dlpack_after_the_stream_waits(dataset) -> None:
    """device="cuda" with CUDA faked (the prefetcher's ops, as tests/loader/device/test_prefetch.py fakes them): each
    batch is handed to torch through DLPack only after the consumer stream was told to wait on its copy."""
    from test_prefetch import LazyCuda

    from cupy_nwt.loader import LoaderParts

    class DLPackCuda(LazyCuda):
        def empty(self, shape, dtype, stream):
            return DeviceArray(super().empty(shape, dtype, stream), self)

        def h2d(self, dst, src, stream) -> None:
            super().h2d(dst.a, src, stream)

    output = "torch" if isinstance(dataset, Arrays) else "auto"
    ops = DLPackCuda()  # as if on a GPU: the main process's ring and the prefetcher, run by the fake
    dl = cupy_nwt.DataLoader(dataset, batch_size=B, device="cuda", pin_memory=True, output=output,
                             parts=LoaderParts(ops=ops))
    with dl:
        got = []
        for images, labels in dl:
            assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)
            kinds = [e[0] for e in ops.log]
            last_wait = max(i for i, k in enumerate(kinds) if k == "wait")
            assert kinds[-2:] == ["dlpack", "dlpack"] and last_wait < len(kinds) - 2
            ops.consume([])  # run the copies the consumer waited on
            got.append(labels.tolist())
    assert got == [[i % 10 if isinstance(dataset, Images) else i for i in range(b, b + B)] for b in range(0, N, B)]
