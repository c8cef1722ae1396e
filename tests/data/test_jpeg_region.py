"""The libjpeg-turbo region decoder (``cupy_nwt.data.jpeg_region``) against whole decodes, on damage, and absent.

Tolerance: none. The rectangle's pixels must equal simplejpeg's whole decode at the same DCT scale,
cropped, bit for bit (the same libjpeg-turbo arithmetic: islow IDCT, fancy upsampling), at every
scale, for crops at odd offsets and at each image edge, for 4:2:0, 4:2:2, 4:4:4, progressive and
grayscale files; and a crop through it equals the simplejpeg path's crop bit for bit.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cupy_nwt.data import RandomResizedCrop, Resize, jpeg_region
from cupy_nwt.errors import ArgumentError, CorruptImageError

simplejpeg = pytest.importorskip("simplejpeg")
pytestmark = pytest.mark.skipif(not jpeg_region.available(), reason="the libjpeg-turbo region extension is not built")


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients, soft blobs and grain: compresses like a photograph."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 60 * np.sin(x / (w / (2 + c)) + c) * np.cos(y / (h / (3 + c))) for c in range(3)], -1)
    img += rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(img: np.ndarray, **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90, **kw)
    return buf.getvalue()


FILES = {
    "420": lambda: encode(photo(301, 403), subsampling="4:2:0"),
    "422": lambda: encode(photo(301, 403, 1), subsampling="4:2:2"),
    "444": lambda: encode(photo(301, 403, 2), subsampling="4:4:4"),
    "progressive": lambda: encode(photo(301, 403, 3), progressive=True),
    "gray": lambda: encode(photo(301, 403, 4)[..., 0]),
}


def boxes(h: int, w: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """The four corners, a 1 x 1 at the last pixel, the whole image, a full-width band, and odd random boxes."""
    out = [(0, 0, 7, 9), (0, w - 9, 7, 9), (h - 7, 0, 7, 9), (h - 7, w - 9, 7, 9), (h - 1, w - 1, 1, 1),
           (0, 0, h, w), (h // 3, 0, h // 3, w)]
    for _ in range(12):
        top, left = int(rng.integers(0, h)) | 1, int(rng.integers(0, w)) | 1
        top, left = min(top, h - 1), min(left, w - 1)
        out.append((top, left, int(rng.integers(1, h - top + 1)), int(rng.integers(1, w - left + 1))))
    return out


@pytest.mark.parametrize("kind", list(FILES))
@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_the_rectangle_is_the_whole_decode_cropped(kind: str, scale: int) -> None:
    data = FILES[kind]()
    h0, w0 = Image.open(io.BytesIO(data)).size[::-1]
    h, w = jpeg_region.scaled_size(h0, w0, scale)
    whole = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=h, min_width=w)
    assert whole.shape == (h, w, 3)
    for top, left, bh, bw in boxes(h, w, np.random.default_rng(scale)):
        got = jpeg_region.decode_region(data, (top, left, bh, bw), scale)
        np.testing.assert_array_equal(got, whole[top:top + bh, left:left + bw], err_msg=f"box {(top, left, bh, bw)}")


@pytest.mark.parametrize("kind", ["420", "422", "444"])
@pytest.mark.parametrize("scale", [1, 2])
def test_narrow_boxes_at_every_column_are_the_whole_decode_cropped(kind: str, scale: int) -> None:
    """One to three columns wide, at every column: a crop of one column at the left edge of a 4:2:0 file was
    up to 9 levels off, the run decoded too narrow for the chroma column its upsampling reads."""
    sub = {"420": "4:2:0", "422": "4:2:2", "444": "4:4:4"}[kind]
    data = encode(photo(40, 33, 5), subsampling=sub)
    h, w = jpeg_region.scaled_size(40, 33, scale)
    whole = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=h, min_width=w)
    for left in range(w):
        for bw in range(1, min(3, w - left) + 1):
            got = jpeg_region.decode_region(data, (0, left, h, bw), scale)
            np.testing.assert_array_equal(got, whole[:, left:left + bw], err_msg=f"box {(0, left, h, bw)}")


@pytest.mark.parametrize("out", [16, 40, 100, 300])
def test_crops_equal_the_simplejpeg_paths_at_every_scale(out: int) -> None:
    data = encode(photo(700, 933, 5))
    for seed in range(6):
        a = RandomResizedCrop(out, seed=seed, backend="libjpeg", flip_p=0.5).from_bytes(data, "x.jpg")
        b = RandomResizedCrop(out, seed=seed, backend="simplejpeg", flip_p=0.5).from_bytes(data, "x.jpg")
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(Resize(out, backend="libjpeg").from_bytes(data, "x.jpg"),
                                  Resize(out, backend="simplejpeg").from_bytes(data, "x.jpg"))


def test_auto_takes_the_extension() -> None:
    data = encode(photo(200, 300))
    np.testing.assert_array_equal(RandomResizedCrop(32, seed=1).from_bytes(data, "x"),
                                  RandomResizedCrop(32, seed=1, backend="libjpeg").from_bytes(data, "x"))


@pytest.mark.parametrize("damage", ["truncated", "truncated-below-the-crop", "garbage", "not-a-jpeg-body"])
def test_damage_is_one_corrupt_image_error(damage: str) -> None:
    data = encode(photo(400, 400))
    sos = data.index(b"\xff\xda")
    bad = {"truncated": data[: len(data) // 2],
           "truncated-below-the-crop": data[: len(data) - len(data) // 8],
           "garbage": data[: sos + 20] + bytes(range(256)) * 4 + data[sos + 20 + 1024:],
           "not-a-jpeg-body": data[:4] + b"\x00" * 200}[damage]
    crop = Resize((8, 8), backend="libjpeg")  # the whole image, at 1/8: every block is read
    if damage == "truncated-below-the-crop":
        crop = RandomResizedCrop(8, scale=(0.01, 0.01), ratio=(1, 1), seed=0, backend="libjpeg")
    with pytest.raises(CorruptImageError) as err:
        crop.from_bytes(bad, "dir/bad.jpg", 7)
    msg = str(err.value)
    assert "dir/bad.jpg" in msg and "\n" not in msg and err.value.sample_index == 7


def test_the_raw_call_raises_libjpegs_message_and_checks_its_arguments() -> None:
    data = encode(photo(64, 64))
    with pytest.raises(ValueError, match="outside"):
        jpeg_region.decode_region(data, (60, 0, 8, 8), 1)
    with pytest.raises(ValueError):
        jpeg_region.decode_region(data[:100], (0, 0, 8, 8), 1)
    with pytest.raises(ArgumentError):
        jpeg_region.decode_region(data, (0, 0, 8, 8), 3)
    with pytest.raises(ArgumentError):
        jpeg_region.decode_region(data, (0, -1, 8, 8), 1)


def test_cmyk_keeps_the_pillow_fallback() -> None:
    data = io.BytesIO()
    Image.fromarray(photo(80, 120)).convert("CMYK").save(data, format="JPEG", quality=90)
    a = RandomResizedCrop(24, seed=2).from_bytes(data.getvalue(), "cmyk.jpg")
    b = RandomResizedCrop(24, seed=2, backend="pillow").from_bytes(data.getvalue(), "cmyk.jpg")
    np.testing.assert_array_equal(a, b)


FALLBACK = """
import io, logging
import numpy as np
from PIL import Image
logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
from cupy_nwt.data import RandomResizedCrop, jpeg_region
from cupy_nwt.errors import ArgumentError
buf = io.BytesIO()
Image.fromarray(np.full((120, 160, 3), 90, np.uint8)).save(buf, format="JPEG")
assert not jpeg_region.available()
for _ in range(3):
    a = RandomResizedCrop(32, seed=1).from_bytes(buf.getvalue(), "x")
b = RandomResizedCrop(32, seed=1, backend="simplejpeg").from_bytes(buf.getvalue(), "x")
assert (a == b).all()
try:
    RandomResizedCrop(32, backend="libjpeg")
except ArgumentError as exc:
    print("refused:", exc)
"""


def test_without_the_extension_crops_take_simplejpeg_and_say_so_once() -> None:
    env = {**os.environ, jpeg_region.ENV_DISABLE: "1"}
    run = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if jpeg_region.ENV_DISABLE in line]
    assert len(said) == 1 and said[0].startswith("cupy_nwt.data INFO")
    assert "refused:" in run.stdout and "libjpeg" in run.stdout
