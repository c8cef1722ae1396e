"""The decode stage's resampling: the NumPy reference against Pillow, and the CUDA kernel's arithmetic against the reference.

``emulate_kernel`` is ``cuda_src/resize_normalize.cu`` line for line in float32 NumPy (vectorised over
the output pixels instead of one thread each): the same tap bounds, weights, sums and normalisation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from cupy_nwt.data.gpu_decode import KERNEL_PATH
from cupy_nwt.data.resample import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    antialias_weights,
    crop_resize_flip_normalize,
    normalize_affine,
)
from cupy_nwt.errors import ArgumentError
from cupy_nwt.experiments import kernels

F = np.float32


def _taps(i: np.ndarray, in_size: int, out_size: int):
    """The kernel's ``taps_of`` for output indices ``i`` (int array): first, last, centre, support, inv_sum."""
    scale = F(in_size) / F(out_size)
    support = np.maximum(scale, F(1))
    centre = (i.astype(F) + F(0.5)) * scale
    first = np.maximum((centre - support + F(0.5)).astype(np.int32), 0)  # C's (int) truncates toward zero too
    last = np.minimum((centre + support + F(0.5)).astype(np.int32), in_size)
    width = int((last - first).max())
    total = np.zeros(i.shape, F)
    for t in range(width):
        j = first + t
        w = np.maximum(F(0), F(1) - np.abs((j.astype(F) - centre + F(0.5)) / support))
        total += np.where(j < last, w, F(0)).astype(F)
    inv = np.where(total > 0, F(1) / total, F(0)).astype(F)
    return first, last, centre, support, inv, width


def emulate_kernel(pixels: np.ndarray, top: int, left: int, h: int, w: int, out_h: int, out_w: int, flip: bool,
                   scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """One image of the kernel's output (3 x out_h x out_w), computed as the kernel computes it."""
    oy = np.arange(out_h)
    ox = np.arange(out_w)
    sx = out_w - 1 - ox if flip else ox
    fy, ly, cy, sy, iy, wy_n = _taps(oy, h, out_h)
    fx, lx, cx, sxs, ix, wx_n = _taps(sx, w, out_w)
    acc = np.zeros((out_h, out_w, 3), F)
    for ty in range(wy_n):
        y = fy + ty
        wy = np.where(y < ly, np.maximum(F(0), F(1) - np.abs((y.astype(F) - cy + F(0.5)) / sy)), F(0)).astype(F)
        row = np.zeros((out_h, out_w, 3), F)
        for tx in range(wx_n):
            x = fx + tx
            wx = np.where(x < lx, np.maximum(F(0), F(1) - np.abs((x.astype(F) - cx + F(0.5)) / sxs)), F(0)).astype(F)
            ys = np.clip(top + y, 0, pixels.shape[0] - 1)
            xs = np.clip(left + x, 0, pixels.shape[1] - 1)
            p = pixels[ys[:, None], xs[None, :]].astype(F)
            row += wx[None, :, None] * p
        acc += wy[:, None, None] * row
    norm = (iy[:, None] * ix[None, :]).astype(F)
    out = acc * norm[:, :, None] * scale.astype(F) + bias.astype(F)
    return out.transpose(2, 0, 1)


def _photo_like(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise: both the flat and the busy regions a photo has."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(yy * 255 // max(h - 1, 1)), (xx * 255 // max(w - 1, 1)), ((yy + xx) * 7) % 256], -1)
    return np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)


def test_weights_rows_sum_to_one_and_stay_near_their_centre():
    for m, n in [(500, 224), (224, 224), (100, 224), (4000, 224), (7, 3)]:
        w = antialias_weights(m, n)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert (w >= 0).all()
        centre = (np.arange(n) + 0.5) * m / n - 0.5
        mean_tap = (w * np.arange(m)).sum(axis=1)
        assert np.abs(mean_tap - centre).max() <= max(m / n, 1.0)


def test_same_size_is_the_identity():
    img = _photo_like(40, 50)
    out = crop_resize_flip_normalize(img, (0, 0, 40, 50), (40, 50), False, (0, 0, 0), (1 / 255,) * 3)
    np.testing.assert_allclose(out, img.transpose(2, 0, 1), atol=1e-4)


@pytest.mark.parametrize(("box", "size"), [((10, 20, 300, 400), (224, 224)), ((0, 0, 60, 90), (224, 224)),
                                           ((5, 7, 333, 111), (224, 160)), ((0, 0, 375, 500), (64, 64))])
def test_reference_is_pillows_bilinear_of_the_crop(box, size):
    img = _photo_like(375, 500, seed=1)
    top, left, h, w = box
    ours = crop_resize_flip_normalize(img, box, size, False, (0, 0, 0), (1 / 255,) * 3)
    pil = Image.fromarray(img).crop((left, top, left + w, top + h)).resize((size[1], size[0]), Image.BILINEAR)
    # Pillow rounds to uint8 after each of its two passes; the reference rounds nowhere
    assert np.abs(ours - np.asarray(pil).transpose(2, 0, 1)).max() <= 1.0


def test_flip_mirrors_the_resized_crop_and_normalisation_is_torchvisions():
    img = _photo_like(120, 90, seed=2)
    plain = crop_resize_flip_normalize(img, (3, 4, 100, 80), (32, 48), False)
    mirrored = crop_resize_flip_normalize(img, (3, 4, 100, 80), (32, 48), True)
    np.testing.assert_allclose(mirrored, plain[:, :, ::-1], atol=1e-5)
    raw = crop_resize_flip_normalize(img, (3, 4, 100, 80), (32, 48), False, (0, 0, 0), (1, 1, 1)) * 255
    mean, std = np.array(IMAGENET_MEAN)[:, None, None], np.array(IMAGENET_STD)[:, None, None]
    np.testing.assert_allclose(plain, (raw / 255 - mean) / std, atol=1e-4)


@pytest.mark.parametrize(("shape", "box", "size", "flip"), [
    ((375, 500), (10, 20, 300, 400), (224, 224), False),
    ((375, 500), (100, 50, 61, 47), (224, 224), True),  # upscaling
    ((375, 500), (0, 0, 375, 500), (224, 224), True),
    ((60, 80), (2, 3, 55, 70), (17, 29), False),
    ((1500, 2000), (100, 50, 1400, 1900), (64, 64), True),  # camera-like: ~22 x 30 taps, centres in the thousands
])
def test_kernel_arithmetic_matches_the_reference(shape, box, size, flip):
    img = _photo_like(*shape, seed=3)
    scale, bias = normalize_affine(IMAGENET_MEAN, IMAGENET_STD)
    ref = crop_resize_flip_normalize(img, box, size, flip)
    emulated = emulate_kernel(img, *box, *size, flip, scale, bias)
    # float32 accumulation against float64: well under a thousandth of one level (1 / (255 * std) ~ 0.0175)
    assert np.abs(emulated - ref).max() < 2e-4


def test_the_emulation_mirrors_the_kernel_file():
    text = KERNEL_PATH.read_text()
    for line in ("t.support = fmaxf(scale, 1.0f);", "t.centre = ((float)i + 0.5f) * scale;",
                 "int first = (int)(t.centre - t.support + 0.5f);", "t.first = first > 0 ? first : 0;",
                 "int last = (int)(t.centre + t.support + 0.5f);", "t.last = last < in_size ? last : in_size;",
                 "return fmaxf(0.0f, 1.0f - fabsf(((float)j - t.centre + 0.5f) / t.support));",
                 "int sx = m[6] ? out_w - 1 - ox : ox;", "o[0] = r * norm * scale_r + bias_r;"):
        assert line in text, line
    assert KERNEL_PATH in {k.path for k in kernels.SOURCES}  # compiled for sm_90 by kernel_check in CI


def test_bad_boxes_and_normalisation_are_one_line_errors():
    img = _photo_like(10, 10)
    with pytest.raises(ArgumentError, match="not inside the 10x10 image"):
        crop_resize_flip_normalize(img, (5, 5, 6, 2), (4, 4), False)
    with pytest.raises(ArgumentError, match="std must be finite and > 0"):
        normalize_affine((0, 0, 0), (1, 0, 1))
    with pytest.raises(ArgumentError, match=r"std must be finite and > 0 for every channel, got \(1.0, nan, 1.0\)"):
        normalize_affine((0, 0, 0), (1, float("nan"), 1))
    with pytest.raises(ArgumentError, match=r"^mean must be finite for every channel, got \(inf, 0.0, 0.0\)$"):
        normalize_affine((float("inf"), 0, 0), (1, 1, 1))
    with pytest.raises(ArgumentError, match="sizes >= 1"):
        antialias_weights(0, 3)


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 90), w=st.integers(1, 90), out_h=st.integers(1, 40), out_w=st.integers(1, 40),
       top=st.integers(0, 10), left=st.integers(0, 10), flip=st.booleans(), seed=st.integers(0, 3))
def test_kernel_arithmetic_matches_the_reference_at_any_size(h, w, out_h, out_w, top, left, flip, seed):
    img = _photo_like(top + h, left + w, seed=seed)
    scale, bias = normalize_affine(IMAGENET_MEAN, IMAGENET_STD)
    ref = crop_resize_flip_normalize(img, (top, left, h, w), (out_h, out_w), flip)
    assert np.abs(emulate_kernel(img, top, left, h, w, out_h, out_w, flip, scale, bias) - ref).max() < 2e-4
