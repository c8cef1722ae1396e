"""Data sources for the loader: arrays, image folders, tar shards, CIFAR-10 batches, and a synthetic CIFAR-10.

Every dataset keeps its index in a few NumPy arrays (never a Python list of per-sample objects):
a forked worker that touches a list of str/bytes objects writes their reference counts, so each
worker slowly copies the parent's pages and its memory grows epoch after epoch. NumPy buffers and
memmaps are read without writes, so worker memory stays flat.

Samples are ``(image, label)`` with ``image`` a uint8 HWC RGB array and ``label`` an int
(``ArrayDataset``: a tuple of one row per array). An optional ``transform`` is applied to the image.

Tar shards live in ``_tar_shards``, the synthetic CIFAR-10 in ``_synthetic``, the checks of .npy/.npz
files in ``_array_files`` and image decoding/encoding in ``_images``; their public names are importable
from here too. Bad data raises :class:`DataError` (a ``ValueError``) naming the file,
archive member or sample, whether it is found when a dataset is opened or when a sample is read.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import check_bool, check_callable, check_path
from .._mapped_files import MappedFile, ProcessMaps, mapped_file, open_all
from ..errors import ArgumentError, DataError, MissingPathError, OutOfRangeError
from ._array_files import as_columns, load_npy, load_npz
from ._images import (
    IMAGE_EXTENSIONS,
    ImageDataset,
    Transform,
    decode_image,
    encode_image,
    encode_png,
    encode_png_batch,
    index_in,
    is_apple_double,
)
from ._synthetic import CIFAR10_CLASSES, SyntheticCIFAR10, synthetic_pixels
from ._tar_cache import CacheRebuiltWarning
from ._tar_shards import TarImageDataset, scan_tar, write_tar_shard

_log = logging.getLogger("cupy_nwt.data")

__all__ = [
    "CIFAR10", "CIFAR10_CLASSES", "IMAGE_EXTENSIONS", "ArrayDataset", "CacheRebuiltWarning",
    "ImageFolder", "SyntheticCIFAR10", "TarImageDataset", "check_images", "decode_image",
    "encode_image", "encode_png", "encode_png_batch", "open_dataset", "sample_source", "scan_tar",
    "synthetic_pixels", "write_tar_shard",
]


# --- arrays ------------------------------------------------------------------------------------


def _array_state(a: np.ndarray, maps: ProcessMaps) -> Any:
    """A file-backed memmap pickled as the file it maps, so spawned workers map it, not copy it."""
    place = mapped_file(a, maps)
    return place if place is not None else a


class ArrayDataset:
    """Rows of NumPy arrays (or memmaps) with the same first dimension; a sample is a tuple of rows.

    ``transform`` applies to the row of the first array (the image by convention).

    Args:
        *arrays: arrays or memmaps of equal length; sample i is the tuple of their rows i.
        transform: applied to the first array's row (the image by convention).
    """

    def __init__(self, *arrays: np.ndarray, transform: Transform | None = None) -> None:
        if not arrays:
            raise ArgumentError("ArrayDataset needs at least one array")
        arrs = [a if isinstance(a, np.ndarray) else np.asarray(a) for a in arrays]
        for k, a in enumerate(arrs):
            if a.ndim == 0:
                raise ArgumentError(f"ArrayDataset: array {k} is a scalar; every array needs a first (sample) dimension")
        n = len(arrs[0])
        lengths = [len(a) for a in arrs]
        if any(m != n for m in lengths):
            raise ArgumentError(f"ArrayDataset: arrays differ in their first dimension: {lengths}")
        check_callable("transform", transform, optional=True)
        self.arrays = tuple(arrs)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        i = index_in(i, len(self))
        row = [a[i] for a in self.arrays]
        if self.transform is not None:
            row[0] = self.transform(row[0])
        return tuple(row)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        """One fancy-indexing gather per array instead of a Python loop over rows."""
        idx = np.asarray(indices, dtype=np.intp).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise OutOfRangeError(f"indices out of range for a dataset of {n} samples")
        cols: list[Any] = [a[idx] for a in self.arrays]
        if self.transform is not None:
            cols[0] = [self.transform(x) for x in cols[0]]
        return list(zip(*cols))

    def sample_source(self, i: int) -> str:
        """Sample ``i`` as errors name it: with its file when the first array is a memmap."""
        i = index_in(i, len(self))
        a = self.arrays[0]
        return f"{a.filename} row {i}" if isinstance(a, np.memmap) and a.filename else f"sample {i}"

    def __getstate__(self) -> dict[str, Any]:
        maps = ProcessMaps()
        return {"arrays": tuple(_array_state(a, maps) for a in self.arrays), "transform": self.transform}

    def __setstate__(self, state: dict[str, Any]) -> None:
        arrays = list(state["arrays"])
        places = [k for k, s in enumerate(arrays) if isinstance(s, MappedFile)]
        for k, a in zip(places, open_all([arrays[k] for k in places])):
            arrays[k] = a
        self.arrays = tuple(arrays)
        self.transform = state["transform"]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in self.arrays)
        return f"ArrayDataset({shapes})"


# --- image folder ------------------------------------------------------------------------------


def _head(path: str) -> bytes:
    """A file's first bytes; none if it cannot be read (reading it as a sample will say why)."""
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except OSError:
        return b""


def _walk(top: Path, root: Path) -> Iterator[tuple[str, list[str]]]:
    """Each folder under ``top`` (``top`` too), a folder under ``root``, and its sorted file names, following
    links; folders come top-down, so a caller wanting torchvision's order sorts them by path.

    ``os.walk`` follows a link back to a folder it is inside (``cat/all -> ..``) over and over, as
    deep as the kernel resolves links, listing every image there dozens of times; such a link is
    not followed. It also skips a folder it cannot list without a word: here that is a
    ``DataError`` naming it, as its images would be missing from the dataset.
    """
    def refuse(exc: OSError) -> None:
        raise DataError(f"ImageFolder: cannot list {exc.filename} ({exc.strerror or exc})") from None

    inside = {str(top): frozenset({_folder_id(root), _folder_id(top)})}
    for dirpath, dirnames, filenames in os.walk(str(top), followlinks=True, onerror=refuse):
        chain = inside.pop(dirpath)
        kept = []
        for name in sorted(dirnames):
            sub = os.path.join(dirpath, name)
            try:
                key = _folder_id(sub)
            except FileNotFoundError:  # removed since it was listed
                continue
            if key not in chain:
                kept.append(name)
                inside[sub] = chain | {key}
        dirnames[:] = kept
        yield dirpath, sorted(filenames)


def _folder_id(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


class ImageFolder(ImageDataset):
    """``root/<class>/**/<image>``: class names sorted alphabetically give labels 0, 1, ...

    Samples are in torchvision's ``ImageFolder`` order, so an index means the same file in both: class by
    class, folders sorted by path (``sorted(os.walk(...))``: ``a/x`` after ``a-b``), file names sorted.
    The default ``extensions`` are torchvision's plus ``.gif``: pass ``extensions=`` without it where a
    folder holds GIFs and the indices must match torchvision's.

    Images are decoded with Pillow to uint8 HWC RGB. Paths live in one fixed-width bytes array.
    Links are followed, except one back to a folder it is inside (a loop), and a folder that cannot
    be listed is a ``DataError``, rather than images missing without a word.

    Args:
        root: the folder holding one sub-folder per class.
        transform: applied to each decoded image (HWC uint8).
        extensions: file name endings read as images (one string is one ending); other files are ignored.
        allow_empty: keep a class folder without images (it still takes its label). Refused by default, as
            torchvision refuses it: a stray folder (``.ipynb_checkpoints``) would shift every label after it.
    """

    def __init__(self, root: str | os.PathLike, transform: Transform | None = None,
                 extensions: Iterable[str] = IMAGE_EXTENSIONS, *, allow_empty: bool = False) -> None:
        self.root = check_path("root", root)
        check_bool("allow_empty", allow_empty)
        self.transform = transform
        if not self.root.is_dir():
            raise MissingPathError(f"ImageFolder: no such directory: {self.root}")
        exts = (extensions.lower(),) if isinstance(extensions, str) else tuple(e.lower() for e in extensions)
        self.classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        if not self.classes:
            raise ArgumentError(f"ImageFolder: {self.root} has no class sub-directories")
        paths: list[bytes] = []
        labels: list[int] = []
        metadata: list[str] = []
        for label, cls in enumerate(self.classes):
            for dirpath, filenames in sorted(_walk(self.root / cls, self.root)):
                for f in filenames:
                    if not f.lower().endswith(exts):
                        continue
                    if is_apple_double(f, functools.partial(_head, os.path.join(dirpath, f))):
                        metadata.append(os.path.join(dirpath, f))
                        continue
                    paths.append(os.fsencode(os.path.relpath(os.path.join(dirpath, f), self.root)))
                    labels.append(label)
        if metadata:
            _log.warning("ImageFolder: %d macOS metadata file(s) (._ AppleDouble files, not images) under %s left out, "
                         "e.g. %s", len(metadata), self.root, metadata[0])
        if not paths:
            raise ArgumentError(f"ImageFolder: no images with extensions {', '.join(exts)} under {self.root}")
        empty = [c for c, n in zip(self.classes, np.bincount(labels, minlength=len(self.classes))) if n == 0]
        if empty and not allow_empty:
            raise ArgumentError(f"ImageFolder: no images with extensions {', '.join(exts)} in the class folders "
                                f"{', '.join(map(repr, empty))} of {self.root}; remove them (ImageFolder(..., "
                                "allow_empty=True) keeps their labels)")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._paths = np.array(paths, dtype=bytes)
        self.labels = np.array(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> Path:
        return self.root / os.fsdecode(self._paths[index_in(i, len(self))])

    def sample_source(self, i: int) -> str:
        return str(self.path(i))

    def read_bytes(self, i: int) -> bytes:
        """The encoded bytes of sample ``i``; a file gone or unreadable since the folder was indexed is a
        ``DataError`` naming it and the sample, as a corrupt image is, rather than a bare ``OSError``.

        Args:
            i: the sample's index.
        """
        p = self.path(i)
        try:
            return p.read_bytes()
        except OSError as exc:
            why = (
                "no such file: removed or renamed since ImageFolder indexed the folder, or a dangling link"
                if isinstance(exc, FileNotFoundError)
                else exc.strerror or type(exc).__name__
            )
            raise DataError(f"{p} (sample {index_in(i, len(self))}): cannot be read ({why})") from exc

    def _encoded(self, i: int) -> tuple[bytes, str]:
        return self.read_bytes(i), str(self.path(i))

    def _label(self, i: int) -> int:
        return int(self.labels[i])

    def __repr__(self) -> str:
        return f"ImageFolder({str(self.root)!r}, {len(self)} images, {len(self.classes)} classes)"


# --- CIFAR-10 ----------------------------------------------------------------------------------


class _CifarUnpickler(pickle.Unpickler):
    """CIFAR-10 ships as pickles; allow only what its batches contain, so a crafted file cannot run code."""

    _ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR-10 batch file")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module.removeprefix("numpy.core.")
        return super().find_class(module, name)


def _load_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise MissingPathError(
            f"CIFAR-10 batch file not found: {path} (expected the 'CIFAR-10 python version' archive "
            "from https://www.cs.toronto.edu/~kriz/cifar.html, extracted)")
    try:
        with open(path, "rb") as f:
            d = _CifarUnpickler(f, encoding="bytes").load()
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path} is not a CIFAR-10 python batch: {exc}") from exc
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{path} is not a CIFAR-10 python batch: data {data.shape}, {len(labels)} labels")
    return data, labels


def _cifar_dir(root: Path) -> Path:
    return root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root


class CIFAR10(ArrayDataset):
    """The CIFAR-10 python batches on disk (``data_batch_1..5`` or ``test_batch``) as uint8 HWC images.

    ``root`` is the folder holding ``cifar-10-batches-py`` or that folder itself. Nothing is downloaded.

    Args:
        root: the folder holding ``cifar-10-batches-py``, or that folder itself.
        train: the five training batches (else ``test_batch``).
        transform: applied to each image (HWC uint8).
    """

    def __init__(self, root: str | os.PathLike, train: bool = True, transform: Transform | None = None) -> None:
        self.root = check_path("root", root)
        base = _cifar_dir(self.root)
        names = [f"data_batch_{k}" for k in range(1, 6)] if train else ["test_batch"]
        parts = [_load_cifar_batch(base / n) for n in names]
        data = np.concatenate([p[0] for p in parts])
        images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels = np.concatenate([p[1] for p in parts])
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise DataError(f"CIFAR-10 labels in {base} fall outside 0..9")
        super().__init__(images, labels, transform=transform)
        self.images, self.labels = self.arrays
        self.train = train
        self.classes = list(CIFAR10_CLASSES)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        img, label = super().__getitem__(i)
        return img, int(label)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        return [(img, int(label)) for img, label in super().__getitems__(indices)]

    def sample_source(self, i: int) -> str:
        return f"sample {index_in(i, len(self))} of the CIFAR-10 batches in {_cifar_dir(self.root)}"

    def __repr__(self) -> str:
        return f"CIFAR10({str(self.root)!r}, train={self.train}, {len(self)} images)"


# --- dispatch ----------------------------------------------------------------------------------


def open_dataset(path: str | os.PathLike, **kwargs: Any) -> Any:
    """A dataset for ``path`` by its kind; ``kwargs`` go to the dataset (``transform``, ``train``, ...).

    .tar / .tar.gz / .tgz -> TarImageDataset; a folder with ``cifar-10-batches-py`` or
    ``data_batch_1`` -> CIFAR10; any other folder -> ImageFolder; .npy -> ArrayDataset over a
    read-only memmap; .npz -> ArrayDataset of its arrays (``images`` then ``labels`` when both are
    there, otherwise in file order). A .npy or .npz that is empty, cut short, not of that format or
    holds Python objects raises :class:`DataFileError` naming it (see ``_array_files``).

    Args:
        path: a tar shard, a folder or an array file.
        **kwargs: passed to the dataset (``transform``, ``train``, ...).
    """
    p = Path(path)
    if not p.exists():
        raise MissingPathError(f"no such dataset path: {p}")
    name = p.name.lower()
    if p.is_dir():
        if (p / "cifar-10-batches-py").is_dir() or (p / "data_batch_1").is_file():
            return CIFAR10(p, **kwargs)
        return ImageFolder(p, **kwargs)
    if not p.is_file():  # a pipe would block its reader for ever, a device read without end
        raise ArgumentError(f"dataset {p} is no regular file or folder (a pipe, a device): give a file or folder")
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        return TarImageDataset(p, **kwargs)
    if name.endswith(".npy"):
        return ArrayDataset(load_npy(p), **kwargs)
    if name.endswith(".npz"):
        arrays = load_npz(p)
        if {"images", "labels"} <= arrays.keys():
            arrays = {k: arrays[k] for k in ("images", "labels")}
        return ArrayDataset(*as_columns(arrays, p), **kwargs)
    raise ArgumentError(f"cannot tell what dataset {p} is: expected a folder (ImageFolder or CIFAR-10 batches), "
                     ".tar/.tar.gz/.tgz, .npy or .npz")


def sample_source(dataset: Any, i: int) -> str:
    """Where sample ``i`` of any dataset comes from, for error messages: its file or member if known.

    Args:
        dataset: any dataset; one with a ``sample_source(i)`` method says where its samples come from.
        i: the sample's index.
    """
    describe = getattr(dataset, "sample_source", None)
    if describe is not None:
        try:
            return str(describe(i))
        except (IndexError, TypeError, ValueError, OSError):
            pass
    return f"sample {i}"


def check_images(dataset: Any, name: str | os.PathLike, needed_by: str) -> None:
    """Raise :class:`DataError` unless sample 0 leads with a uint8 H x W x C image, as ``needed_by`` needs.

    For a path that opens as a dataset of other things (a 1-D ``.npy`` is a dataset of scalars):
    checked before a run that would otherwise fail on its first batch with a shape error.

    Args:
        dataset: the dataset to check.
        name: the path it was opened from, named by the error.
        needed_by: what needs images, named by the error.
    """
    if len(dataset) == 0:
        raise DataError(f"{name}: the dataset is empty")
    sample = dataset[0]
    first = sample[0] if isinstance(sample, (tuple, list)) and sample else sample
    a = np.asarray(first)
    if a.dtype == np.uint8 and a.ndim == 3:
        return
    what = f"a {a.dtype} scalar" if a.ndim == 0 else f"a {a.dtype} array of shape {a.shape}"
    raise DataError(f"{name}: sample 0 is {what}; {needed_by} needs uint8 H x W x C images")
