"""The embedded default dataset: a synthetic CIFAR-10 built locally from a seed, cached, decoded like real data."""

from __future__ import annotations

import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import check_bool, check_int
from .._files import fresh_folder, make_folder, writable_base
from ..errors import ArgumentError, DataFileError
from ..reporting.progress import ProgressBar
from ..reporting.units import fmt_bytes
from ..system import CACHE_ENV, memory_room, usable_cpus
from ..system import cache_dir as default_cache_dir
from ._array_files import load_npy
from ._images import ImageDataset, Transform, encode_image, encode_png_batch, index_in
from ._tar_cache import CacheRebuiltWarning

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# --- synthetic CIFAR-10 ------------------------------------------------------------------------

_SYNTH_VERSION = 1
_SYNTH_CHUNK = 1024  # part of the format: chunk k draws from default_rng([seed, k])
_CLASS_COLOR = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200], [200, 200, 60], [200, 60, 200],
                         [60, 200, 200], [230, 140, 40], [140, 40, 230], [40, 230, 140], [120, 120, 120]],
                        dtype=np.float32)
_CLASS_ANGLE = np.linspace(0.0, np.pi, 10, endpoint=False, dtype=np.float32)


def synthetic_pixels(labels: np.ndarray, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """Textured, noisy uint8 images (N x size x size x 3), vectorised over the batch.

    Each image is a striped background (orientation set by the class, frequency and phase random)
    under a soft blob in the class colour, plus pixel noise: nothing constant, so compressed images
    cost a real decode, and the class is learnable. Channels are computed planar (N x 3 x H x W)
    because NumPy broadcasts over a trailing axis of 3 several times slower.

    Args:
        labels: one class (0..9) per image: it sets the image's orientation and colour.
        rng: the generator every random choice comes from.
        size: the images' side.
    """
    labels = np.asarray(labels, dtype=np.intp)
    m = len(labels)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    theta = _CLASS_ANGLE[labels] + rng.normal(0.0, 0.2, m).astype(np.float32)
    freq = rng.uniform(0.3, 1.0, m).astype(np.float32)
    phase = rng.uniform(0.0, 2 * np.pi, m).astype(np.float32)[:, None, None]
    wave = (freq * np.sin(theta))[:, None, None] * yy
    wave += (freq * np.cos(theta))[:, None, None] * xx
    wave += phase
    np.sin(wave, out=wave)
    cy, cx = rng.uniform(0.25 * size, 0.75 * size, (2, m)).astype(np.float32)[:, :, None, None]
    neg_inv_width2 = (-1.0 / (rng.uniform(20.0, 80.0, m) * (size / 32) ** 2)).astype(np.float32)[:, None, None]
    blob = (yy - cy) ** 2
    blob += (xx - cx) ** 2
    blob *= neg_inv_width2
    np.exp(blob, out=blob)
    shade = wave
    shade *= 0.3
    shade += 0.7
    shade *= 1.0 - blob
    background = rng.uniform(40.0, 200.0, (m, 3)).astype(np.float32)
    img = shade[:, None] * background[:, :, None, None]
    img += blob[:, None] * _CLASS_COLOR[labels][:, :, None, None]
    img += np.frombuffer(rng.bytes(img.size), dtype=np.uint8).reshape(img.shape) & np.uint8(31)
    img -= 16.0
    np.clip(img, 0.0, 255.0, out=img)
    return img.transpose(0, 2, 3, 1).astype(np.uint8)


#: bytes one stored 32x32x3 image takes at least (measured: PNG about 2.5 KiB, JPEG about 1 KiB): a floor, so
#: that only a size that cannot fit is refused
_MIN_IMAGE_BYTES = {"png": 2048, "jpeg": 768}
#: what the build holds per image beside its bytes: the bytes object, two lists' pointers, its length, the arrays
_BUILD_OVERHEAD = 128


def synthetic_cache_path(n: int, seed: int = 0, fmt: str = "png", cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``SyntheticCIFAR10(n, seed, fmt, cache_dir)`` is cached."""
    return default_cache_dir(cache_dir) / "synthetic-cifar10" / f"v{_SYNTH_VERSION}-n{n}-seed{seed}-{fmt}"


def _labels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n, dtype=np.int64) % 10)


def cache_problem(path: Path, n: int, seed: int) -> str | None:
    """Why the cache folder ``path`` cannot be used (None: it can).

    The cache is read back by later processes and may have been cut, emptied or replaced since it
    was built (a full disk, a clean-up, a copy from another folder): each array's header is checked
    against its file, the offsets must cut ``data`` into ``n`` ascending slices and the labels must
    be those ``seed`` gives, or samples would come back wrong, or as a NumPy error naming no file.
    """
    try:
        data, offsets, labels = (load_npy(path / f"{name}.npy") for name in ("data", "offsets", "labels"))
    except DataFileError as exc:
        return f"{Path(exc.path or '').name}: {exc.problem}"
    except OSError as exc:
        return f"{Path(exc.filename or '').name}: cannot be read ({exc.strerror or exc})"
    if data.dtype != np.uint8 or data.ndim != 1:
        return f"data.npy holds {data.dtype} of shape {data.shape}, not a flat uint8 buffer"
    if offsets.dtype != np.int64 or offsets.shape != (n + 1,):
        return f"offsets.npy holds {offsets.dtype} of shape {offsets.shape}, not {n + 1} int64 offsets"
    if offsets[0] != 0 or offsets[-1] != len(data) or (np.diff(offsets) < 0).any():
        return f"offsets.npy does not cut data.npy's {len(data)} bytes into {n} ascending slices"
    if labels.shape != (n,) or not np.array_equal(labels, _labels(n, seed)):
        return f"labels.npy does not hold the {n} labels seed {seed} gives"
    return None


def check_synthetic_room(n: int, seed: int = 0, fmt: str = "png", cache_dir: str | os.PathLike | None = None) -> None:
    """Refuse, in one ``ArgumentError`` line and before any work, a synthetic CIFAR-10 this machine cannot build:
    its cache folder is under a file or not writable, or ``n`` images need more disk or memory than there is
    (the build holds every encoded image twice, the list and the buffer saved from it). One already built passes.
    """
    path = synthetic_cache_path(n, seed, fmt, cache_dir)
    if path.is_dir() and cache_problem(path, n, seed) is None:
        return
    named = f" ({CACHE_ENV})" if cache_dir is None and os.environ.get(CACHE_ENV) else ""
    existing, why = writable_base(path)
    if why is not None:
        raise ArgumentError(f"the cache folder {default_cache_dir(cache_dir)}{named} cannot hold the synthetic "
                            f"CIFAR-10: {why}; set {CACHE_ENV} (or cache_dir=) to a folder you can write")
    per_image = _MIN_IMAGE_BYTES.get(fmt, _MIN_IMAGE_BYTES["png"])
    disk, free = n * (per_image + 16), shutil.disk_usage(existing).free
    if disk > free:
        raise ArgumentError(f"{n:,} synthetic CIFAR-10 images need at least {fmt_bytes(disk)} of disk, more than the "
                            f"{fmt_bytes(free)} free under {existing}{named}: ask for fewer")
    memory, room = n * (2 * per_image + _BUILD_OVERHEAD), memory_room()
    if memory > room.bytes:
        raise ArgumentError(f"{n:,} synthetic CIFAR-10 images need at least {fmt_bytes(memory)} of memory to build, "
                            f"more than the {fmt_bytes(room.bytes)} free {room.bound}: ask for fewer")


def _synthetic_chunk(seed: int, k: int, labels: np.ndarray, fmt: str) -> list[bytes]:
    pixels = synthetic_pixels(labels, np.random.default_rng([seed, k]))
    return encode_png_batch(pixels) if fmt == "png" else [encode_image(p, fmt) for p in pixels]


class SyntheticCIFAR10(ImageDataset):
    """The embedded default dataset: n CIFAR-shaped 32x32x3 images with labels 0..9, no download.

    Built deterministically from ``seed`` on first use (a few seconds for 50 000 PNGs) and cached
    under ``default_cache_dir(cache_dir)`` as ``data.npy`` (every encoded image in one uint8
    buffer), ``offsets.npy`` and ``labels.npy``, memory-mapped read-only, so all workers share the
    page cache. Builders take a file lock and publish the folder with one atomic rename, so
    concurrent first uses build once and nobody reads a half-written cache. A built cache is checked
    when opened (``cache_problem``); one that fails is rebuilt with one ``CacheRebuiltWarning``.
    ``__getitem__`` decodes with Pillow, like a real image dataset. ``progress=True`` shows the
    build on stderr (the command line does; a library call stays quiet).

    Args:
        n: number of images.
        seed: the seed the images and labels are built from: the same seed, the same dataset.
        fmt: how images are stored, "png" or "jpeg": each costs a real decode, as real data does.
        cache_dir: where the built dataset is cached (default: ``$CUPY_NWT_CACHE_DIR``, else the user cache dir).
        transform: applied to each decoded image (HWC uint8).
        progress: show the first build on stderr.
    """

    def __init__(self, n: int = 50000, seed: int = 0, fmt: str = "png", cache_dir: str | os.PathLike | None = None,
                 transform: Transform | None = None, *, progress: bool = False) -> None:
        n, seed = check_int("n", n, ge=1), check_int("seed", seed, ge=0)
        fmt = {"jpg": "jpeg"}.get(str(fmt).lower(), str(fmt).lower())
        if fmt not in ("png", "jpeg"):
            raise ArgumentError(f"unknown image format {fmt!r}: use 'png' or 'jpeg'")
        self.n, self.seed, self.fmt = n, seed, fmt
        self.classes = list(CIFAR10_CLASSES)
        self.transform = transform
        self.cache_path = synthetic_cache_path(n, seed, fmt, cache_dir)
        check_synthetic_room(n, seed, fmt, cache_dir)
        self.built_now = self._ensure_built(check_bool("progress", progress))
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._arrays_pid: int | None = None

    def _ensure_built(self, progress: bool) -> bool:
        from filelock import FileLock  # noqa: PLC0415

        if self.cache_path.is_dir() and cache_problem(self.cache_path, self.n, self.seed) is None:
            return False
        make_folder(self.cache_path.parent, "cache_dir")
        with FileLock(str(self.cache_path) + ".lock"):
            problem = cache_problem(self.cache_path, self.n, self.seed) if self.cache_path.is_dir() else "missing"
            if problem is None:
                return False
            for stale in self.cache_path.parent.glob(f".tmp-{self.cache_path.name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            if os.path.lexists(self.cache_path):
                warnings.warn(f"{self.cache_path}: {problem}; rebuilding it", CacheRebuiltWarning, stacklevel=3)
                self._set_aside()
            tmp = fresh_folder(self.cache_path.parent, f".tmp-{self.cache_path.name}-")
            try:
                self._build_into(tmp, progress)
                os.rename(tmp, self.cache_path)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return True

    def _set_aside(self) -> None:
        """Remove a cache that failed its check (under the lock): a folder is renamed away first, so a crash
        mid-removal leaves a stale ``.tmp-`` folder (removed by the next build), never half a cache under its name."""
        if self.cache_path.is_symlink() or not self.cache_path.is_dir():
            self.cache_path.unlink()
            return
        aside = fresh_folder(self.cache_path.parent, f".tmp-{self.cache_path.name}-")
        os.rename(self.cache_path, aside)
        shutil.rmtree(aside, ignore_errors=True)

    def _build_into(self, out: Path, progress: bool) -> None:
        labels = _labels(self.n, self.seed)
        starts = range(0, self.n, _SYNTH_CHUNK)
        # NumPy ufuncs and zlib release the GIL, so threads use every core without pickling images.
        chunks: list[list[bytes]] = []
        with ThreadPoolExecutor(max_workers=max(1, min(usable_cpus(), len(starts)))) as pool, ProgressBar(
                len(starts), f"building synthetic CIFAR-10 ({self.n:,} images)", unit="chunk", enabled=progress) as bar:
            for chunk in pool.map(
                    lambda s: _synthetic_chunk(self.seed, s // _SYNTH_CHUNK, labels[s:s + _SYNTH_CHUNK], self.fmt),
                    starts):
                chunks.append(chunk)
                bar.step(f"{min(len(chunks) * _SYNTH_CHUNK, self.n):,} images")
        encoded = [b for chunk in chunks for b in chunk]
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        np.save(out / "data.npy", np.frombuffer(b"".join(encoded), dtype=np.uint8))
        np.save(out / "offsets.npy", offsets)
        np.save(out / "labels.npy", labels)

    def _mapped(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pid = os.getpid()
        if self._arrays is None or self._arrays_pid != pid:
            self._arrays = tuple(np.load(self.cache_path / f"{name}.npy", mmap_mode="r")
                                 for name in ("data", "offsets", "labels"))
            self._arrays_pid = pid
        return self._arrays

    @property
    def labels(self) -> np.ndarray:
        return self._mapped()[2]

    def encoded(self, i: int) -> bytes:
        """The stored PNG/JPEG bytes of sample ``i``."""
        data, offsets, _ = self._mapped()
        i = index_in(i, self.n)
        return data[offsets[i]:offsets[i + 1]].tobytes()

    def __len__(self) -> int:
        return self.n

    def _encoded(self, i: int) -> tuple[bytes, str]:
        return self.encoded(i), f"{self.cache_path} sample {i}"

    def _label(self, i: int) -> int:
        return int(self._mapped()[2][i])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = state["_arrays_pid"] = None
        return state

    def __repr__(self) -> str:
        return f"SyntheticCIFAR10(n={self.n}, seed={self.seed}, fmt={self.fmt!r})"
