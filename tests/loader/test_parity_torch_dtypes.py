"""Batches of every torch dtype, as torch's DataLoader gives them: the ones NumPy lacks (bfloat16, the float8
kinds, complex32) ride the ring as their bits, and the unsigned ones, which torch's own pickling cannot carry,
leave a worker as NumPy arrays. The same script runs on both loaders; values and dtypes must agree."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import cupy_nwt

torch = pytest.importorskip("torch", reason="torch tensors' dtypes need torch")
import torch.utils.data as tud  # noqa: E402

pytestmark = [pytest.mark.usefixtures("worker_type"),
              pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")]

DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "complex32", "float16", "uint16", "uint32", "uint64"]


class Ramp(tud.Dataset):
    """Sample i: a (2, 3) tensor of ``dtype`` holding i + 0.5 * column (exact in every dtype here), and i."""

    def __init__(self, dtype: str, n: int = 6) -> None:
        self.dtype, self.n = getattr(torch, dtype), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.arange(3, dtype=torch.float32).repeat(2, 1) * (0.5 if self.dtype.is_floating_point else 1) + i
        return x.to(self.dtype), i


def values(batches) -> list:
    """Each batch's tensor as (dtype, shape, exact values in float64), and its labels."""
    out = []
    for x, y in batches:
        wide = x.to(torch.complex64) if x.dtype == torch.complex32 else x
        out.append((x.dtype, tuple(x.shape), wide.to(torch.complex128 if x.is_complex() else torch.float64).tolist(),
                    y.tolist() if isinstance(y, torch.Tensor) else y))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [2, None], ids=["batched", "unbatched"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_torch_dtype_arrives_as_torch_gives_it(dtype, batch_size, num_workers, worker_type):
    if worker_type == "thread" and num_workers == 0:
        pytest.skip("num_workers=0 has no workers to choose")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = values(tud.DataLoader(Ramp(dtype), batch_size=batch_size, num_workers=0))
        with cupy_nwt.DataLoader(Ramp(dtype), batch_size=batch_size, num_workers=num_workers, device="cpu",
                                 worker_type=worker_type) as loader:
            assert values(loader) == expected


class Switches(Ramp):
    """bfloat16 samples, but sample 3 is int16: the same bits' width, another dtype."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return (x.to(torch.int16) if i == 3 else x), y


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_of_another_dtype_of_the_same_width_is_named_not_reinterpreted(num_workers):
    with cupy_nwt.DataLoader(Switches("bfloat16"), batch_size=4, num_workers=num_workers, device="cpu") as loader:
        it = iter(loader)
        with pytest.raises(cupy_nwt.BatchLayoutError, match=r"sample index 3, field \[0\]: expected shape \(2, 3\) "
                                                            r"dtype bfloat16, got shape \(2, 3\) dtype int16"):
            next(it)


class ThenBits(tud.Dataset):
    """Samples 0-3 (every worker's first batch) are ``dtype`` tensors, one NumPy lacks; samples 4-7 are NumPy
    values of the integer dtype that carries its bits in shared memory (arrays, or scalars with ``scalar``)."""

    BITS = {"bfloat16": np.int16, "float8_e4m3fn": np.uint8, "complex32": np.int32}

    def __init__(self, dtype: str, scalar: bool) -> None:
        self.dtype, self.scalar = dtype, scalar

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        bits = self.BITS[self.dtype]
        if i < 4:
            x = torch.full(() if self.scalar else (2,), i).to(getattr(torch, self.dtype))
        else:
            x = bits(i) if self.scalar else np.full(2, i, bits)
        return x, i


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("scalar", [False, True], ids=["arrays", "scalars"])
@pytest.mark.parametrize("dtype", list(ThenBits.BITS))
def test_later_batches_of_the_carrying_integer_dtype_are_not_read_as_the_first_batches_dtype(dtype, scalar,
                                                                                           num_workers, worker_type):
    if worker_type == "thread" and num_workers == 0:
        pytest.skip("num_workers=0 has no workers to choose")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = values(tud.DataLoader(ThenBits(dtype, scalar), batch_size=2, num_workers=0))
        with cupy_nwt.DataLoader(ThenBits(dtype, scalar), batch_size=2, num_workers=num_workers, device="cpu",
                                 worker_type=worker_type) as loader:
            assert values(loader) == expected


def test_a_tensor_that_requires_grad_is_refused_in_one_line():
    class Grad(Ramp):
        def __getitem__(self, i: int):
            return torch.ones(2, requires_grad=True)

    with cupy_nwt.DataLoader(Grad("float32"), batch_size=2, device="cpu") as loader, \
            pytest.raises(cupy_nwt.BatchTypeError, match=r"sample index 0: a torch tensor that requires grad cannot be "
                                                         r"batched in shared memory: detach it"):
        next(iter(loader))


class Dates(tud.Dataset):
    """Samples 2 and 3 hold a datetime64 field, which no torch tensor can hold: their batch fails alone."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        day = np.array(["2020-01-01"], "datetime64[D]") if i in (2, 3) else np.zeros(1, np.int64)
        return day, i


def outcomes(loader) -> list:
    """Each turn of an epoch: the batch's labels, or the type of error that turn raised."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(next(it)[1].tolist())
        except StopIteration:
            return out
        except TypeError:
            out.append("TypeError")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_torch_cannot_hold_fails_alone_and_the_epoch_goes_on(num_workers, worker_type):
    expected = [[0, 1], "TypeError", [4, 5], [6, 7]]
    assert outcomes(tud.DataLoader(Dates(), batch_size=2, num_workers=num_workers)) == expected
    with cupy_nwt.DataLoader(Dates(), batch_size=2, num_workers=num_workers, device="cpu",
                             worker_type=worker_type) as loader:
        assert outcomes(loader) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "uint16"])
def test_on_the_gpu_every_torch_dtype_arrives_as_on_the_host(dtype):
    """The device path views the copied bits back as the dtype too (DLPack, then torch's ``view``)."""
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA: torch tensors on the GPU need one")
    expected = values(tud.DataLoader(Ramp(dtype), batch_size=2))
    with cupy_nwt.DataLoader(Ramp(dtype), batch_size=2, num_workers=2, device="cuda") as loader:
        got = list(loader)
    assert all(x.is_cuda for x, _ in got)
    assert values((x.cpu(), y.cpu()) for x, y in got) == expected


class Held:
    """What a collate_fn may return that the loader does not look into: it leaves a worker pickled."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y


def held(samples):
    return Held(torch.stack([x for x, _ in samples]), [y for _, y in samples])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_torch_dtype_leaves_a_worker_inside_an_object_of_the_users(dtype, worker_type):
    """torch's own pickle of a uint16, float8 or complex32 tensor does not load back: such a batch failed
    the epoch in the main process with an AttributeError from torch's unpickler."""
    if worker_type == "thread":
        pytest.skip("thread workers hand a batch over without pickling it")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = values((b.x, b.y) for b in tud.DataLoader(Ramp(dtype), batch_size=2, collate_fn=held))
        with cupy_nwt.DataLoader(Ramp(dtype), batch_size=2, collate_fn=held, num_workers=2, device="cpu") as loader:
            assert values((b.x, b.y) for b in loader) == expected
