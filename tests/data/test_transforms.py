"""Transforms: the Numba CIFAR batch path against a plain NumPy reference, and the per-sample callables."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cupy_nwt.data._process_rng import ProcessRng
from cupy_nwt.data.transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CifarEvalTransform,
    CifarTrainTransform,
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    ToCHWFloat,
    crop_flip_normalize,
)
from cupy_nwt.errors import ArgumentError, ArgumentTypeError

MEAN = np.array(CIFAR10_MEAN, np.float32)
STD = np.array(CIFAR10_STD, np.float32)


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    return rng.integers(1, 256, (16, 32, 32, 3), dtype=np.uint8), np.arange(16)


def reference_crop_flip(images, oy, ox, flip, size, padding):
    """Plain NumPy: zero-pad, crop, mirror; uint8 HWC out."""
    padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    out = np.stack([padded[k, oy[k]:oy[k] + size, ox[k]:ox[k] + size] for k in range(len(images))])
    out[flip] = out[flip][:, :, ::-1]
    return out


def reference_normalize(u8_hwc):
    return ((u8_hwc.astype(np.float32) / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2)


def test_train_transform_matches_numpy_reference(batch):
    images, labels = batch
    t = CifarTrainTransform()
    p = t.params(16, 32, 32, seed=11)
    out, out_labels = t(batch, seed=11)
    assert out.shape == (16, 3, 32, 32) and out.dtype == np.float32 and out.flags.c_contiguous
    assert out_labels is labels
    ref_u8 = reference_crop_flip(images, p.oy, p.ox, p.flip, 32, 4)
    np.testing.assert_allclose(out, reference_normalize(ref_u8), rtol=1e-5, atol=1e-5)
    # exact placement: undo the normalisation and compare pixel values exactly
    back = np.rint((out.transpose(0, 2, 3, 1) * STD + MEAN) * 255.0).astype(np.int64)
    np.testing.assert_array_equal(back, ref_u8)
    assert p.flip.any() and not p.flip.all()
    assert (p.oy != 4).any() and p.oy.max() <= 8 and p.ox.max() <= 8


def test_same_seed_same_batch_other_seed_differs(batch):
    t = CifarTrainTransform()
    a, b, c = t(batch, 5)[0], t(batch, 5)[0], t(batch, 6)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert t.params(16, 32, 32, 5).to_dict() == t.params(16, 32, 32, 5).to_dict()


def test_transform_survives_pickling(batch):
    t = pickle.loads(pickle.dumps(CifarTrainTransform(size=28, padding=2, flip_p=1.0)))
    out = t(list(batch), seed=1)
    assert isinstance(out, list) and out[0].shape == (16, 3, 28, 28)
    p = t.params(16, 32, 32, 1)
    assert p.flip.all()
    np.testing.assert_allclose(out[0], reference_normalize(reference_crop_flip(batch[0], p.oy, p.ox, p.flip, 28, 2)),
                               rtol=1e-5, atol=1e-5)


def test_eval_transform_is_normalize_and_layout(batch):
    images, labels = batch
    out, lab = CifarEvalTransform()(batch)
    np.testing.assert_allclose(out, reference_normalize(images), rtol=1e-5, atol=1e-5)
    assert lab is labels


def test_crop_flip_normalize_writes_into_out_and_validates(batch):
    images, _ = batch
    n = len(images)
    zeros = np.zeros(n, np.int64)
    out = np.empty((n, 3, 8, 8), np.float32)
    got = crop_flip_normalize(images, zeros, zeros, np.ones(n, bool), size=8, padding=0, out=out)
    assert got is out
    np.testing.assert_allclose(out, reference_normalize(images[:, :8, :8][:, :, ::-1]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="uint8"):
        crop_flip_normalize(images.astype(np.float32), zeros, zeros, zeros, size=8, padding=0)
    with pytest.raises(ValueError, match="does not fit"):
        crop_flip_normalize(images, zeros, zeros, zeros, size=41, padding=4)
    with pytest.raises(ValueError, match="outside"):
        crop_flip_normalize(images, zeros + 9, zeros, zeros, size=32, padding=4)
    with pytest.raises(ValueError, match="one crop offset"):
        crop_flip_normalize(images, zeros[:3], zeros, zeros, size=8, padding=0)
    with pytest.raises(ValueError, match="out must be"):
        crop_flip_normalize(images, zeros, zeros, zeros, size=8, padding=0, out=np.empty((n, 3, 8, 8)))
    with pytest.raises(ValueError, match="channels"):
        crop_flip_normalize(images[..., :2], zeros, zeros, zeros, size=8, padding=0)


def test_the_kernel_loaded_at_import_still_takes_read_only_images_and_a_strided_out(batch):
    """The kernel is loaded at import for the wrapper's usual types (so forked workers share it);
    other layouts must still compile on first use rather than be refused."""
    images, _ = batch
    n = len(images)
    zeros = np.zeros(n, np.int64)
    frozen = images.copy()
    frozen.flags.writeable = False
    wide = np.zeros((n, 3, 8, 16), np.float32)
    got = crop_flip_normalize(frozen, zeros, zeros, np.ones(n, bool), size=8, padding=0, out=wide[..., ::2])
    want = reference_normalize(images[:, :8, :8][:, :, ::-1])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wide[..., ::2], want, rtol=1e-5, atol=1e-5)
    assert not wide[..., 1::2].any()


def test_batch_transform_rejects_bad_batches(batch):
    t = CifarTrainTransform()
    with pytest.raises(ValueError, match="batch"):
        t(batch[0], seed=0)
    with pytest.raises(ValueError, match="N x H x W x C"):
        t((batch[0][0], 1), seed=0)
    with pytest.raises(ValueError, match="does not fit"):
        CifarTrainTransform(size=48)(batch, seed=0)
    with pytest.raises(ValueError, match="positive"):
        CifarTrainTransform(std=(0.2, 0.0, 0.2))


# --- per-sample ------------------------------------------------------------------------------


def test_random_crop_is_a_window_of_the_padded_image(batch):
    img = batch[0][0]
    crop = RandomCrop(32, padding=4, seed=0)
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)))
    seen = set()
    for _ in range(20):
        out = crop(img)
        assert out.shape == (32, 32, 3)
        hits = [(y, x) for y in range(9) for x in range(9) if np.array_equal(padded[y:y + 32, x:x + 32], out)]
        assert hits
        seen.add(hits[0])
    assert len(seen) > 5
    again = RandomCrop(32, padding=4, seed=0)
    np.testing.assert_array_equal(RandomCrop(32, padding=4, seed=0)(img), again(img))
    with pytest.raises(ValueError, match="larger"):
        RandomCrop(50)(img)
    with pytest.raises(ValueError, match="H x W x C"):
        RandomCrop(4)(img[:, :, 0])


def test_flip_to_float_normalize_compose_match_the_eval_kernel(batch):
    img = batch[0][3]
    np.testing.assert_array_equal(RandomHorizontalFlip(p=1.0)(img), img[:, ::-1])
    assert RandomHorizontalFlip(p=0.0)(img) is img
    pipeline = Compose([ToCHWFloat(), Normalize()])
    out = pipeline(img)
    assert out.dtype == np.float32 and out.shape == (3, 32, 32)
    np.testing.assert_allclose(out, CifarEvalTransform()(batch)[0][3], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="C = 3"):
        Normalize()(img)
    with pytest.raises(ValueError, match="0 <= p <= 1"):
        RandomHorizontalFlip(p=2)


def _draw(r: ProcessRng) -> tuple[int, list[float]]:
    import os  # noqa: PLC0415

    return os.getpid(), r.get().random(4).tolist()


def test_forked_workers_do_not_repeat_the_parents_draws():
    r = ProcessRng(seed=7)
    _, parent = _draw(r)
    assert parent == np.random.default_rng(7).random(4).tolist()
    with mp.get_context("fork").Pool(2) as pool:
        kids = pool.map(_draw, [r, r, r], chunksize=1)
    for pid, draws in kids:
        assert draws != parent
        assert draws == np.random.default_rng([7, pid]).random(4).tolist()


def test_compose_takes_a_list_of_callables_only():
    with pytest.raises(ArgumentTypeError, match=r"^transforms must be a list of callables, got 5$"):
        Compose(5)
    with pytest.raises(ArgumentTypeError, match=r"^transforms\[1\] must be a callable, got 5$"):
        Compose([ToCHWFloat(), 5])
    assert Compose(t for t in [np.flipud])(np.arange(3)).tolist() == [2, 1, 0]


def test_bad_seeds_and_statistics_are_named(batch):
    with pytest.raises(ArgumentError, match=r"^seed must be a non-negative integer or None, got -1$"):
        CifarTrainTransform()(batch, -1)
    with pytest.raises(ArgumentError, match=r"^seed must be a non-negative integer or None, got -1$"):
        RandomCrop(32, seed=-1)
    with pytest.raises(ArgumentError, match=r"^mean must be finite and std finite and positive"):
        Normalize(mean=(float("nan"), 0, 0), std=(1, 1, 1))


def test_two_threads_asking_a_seeded_transform_first_at_once_draw_from_one_stream(monkeypatch):
    """Two threads' first crops: each made the seed's stream of its own when they asked together, and
    both drew the same position (a repeated crop); one stream is made, and the draws follow each other."""
    made = np.random.default_rng

    def slow_rng(*args, **kwargs):
        time.sleep(0.2)  # both threads are inside the first request before either stream exists
        return made(*args, **kwargs)

    monkeypatch.setattr(np.random, "default_rng", slow_rng)
    crop = RandomCrop(1, seed=3)
    row = np.arange(1000, dtype=np.uint16).reshape(1, 1000, 1).astype(np.float32)
    start = threading.Barrier(2)

    def first_crop(_: int) -> float:
        start.wait()
        return float(crop(row)[0, 0, 0])

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(first_crop, range(2))
    stream = made(3)
    assert sorted([a, b]) == sorted(float(stream.integers(0, (1, 1000))[1]) for _ in range(2))


class _Rows:
    """Sample i is a row whose pixel x holds x: a 1-pixel crop's value is where it was cut."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> float:
        return float(self.transform(np.arange(1000, dtype=np.float32).reshape(1, 1000, 1))[0, 0, 0])


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_seeded_loaders_per_sample_crops_repeat_run_after_run_with_workers(worker_type):
    """As a seeded torch run repeats its augmentations: the same loader seed and transform seed give the same
    crops in a second run, whose workers are other processes; the workers still draw apart."""
    from cupy_nwt import DataLoader

    def run() -> list[float]:
        data = _Rows(RandomCrop(1, seed=7))
        with DataLoader(data, batch_size=4, num_workers=2, worker_type=worker_type, seed=11) as dl:
            return [float(x) for b in dl for x in b]

    first = run()
    assert run() == first
    assert len(set(first)) > 12  # two workers' streams, not one stream twice


def test_fresh_thread_workers_of_a_later_epoch_draw_their_own_crops_and_repeat():
    """Threads started for epoch 1 are the same process and worker ids as epoch 0's, with new worker seeds: they
    draw from their own streams (not epoch 0's again), and a second run repeats both epochs."""
    from cupy_nwt import DataLoader

    def run() -> list[list[float]]:
        data = _Rows(RandomCrop(1, seed=7))
        with DataLoader(data, batch_size=4, num_workers=2, worker_type="thread", seed=11) as dl:
            return [[float(x) for b in dl for x in b] for _ in range(2)]

    first = run()
    assert first[0] != first[1]
    assert run() == first


def test_torch_workers_draw_a_seeded_transform_apart_and_repeat():
    """A torch DataLoader's workers (torch's worker info, not cupy_nwt's) each draw from their own stream of the
    transform's seed, and a seeded torch run repeats them."""
    torch = pytest.importorskip("torch")

    def run() -> list[float]:
        data = _Rows(RandomCrop(1, seed=7))
        dl = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, generator=torch.Generator().manual_seed(3),
                                         multiprocessing_context="fork")
        return [float(x) for b in dl for x in b]

    first = run()
    assert run() == first
    assert len(set(first)) > 12
