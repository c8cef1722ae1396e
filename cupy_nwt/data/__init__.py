"""Every data source and transform the loader reads, behind one written contract (``contract``).

``datasets``: arrays and memmaps (their files checked in ``_array_files``), image folders and CIFAR-10
batches, and, from their own modules, tar shards (``_tar_shards``; their gunzip cache in ``_tar_cache``) and
the synthetic CIFAR-10 (``_synthetic``); ``_images``: decoding, PNG encoding and the base of the image
datasets. ``jpeg_bytes`` and ``gpu_decode``: JPEG samples as encoded bytes and their decoding on the GPU
(nvImageCodec, through ``jpeg_codecs``; ``resample``: the NumPy reference of its resize kernel);
``streaming``: sharded tar streams read by several readers (their saved positions checked in
``_stream_state``); ``records``: a list of Python records packed into NumPy columns; ``transforms``:
per-sample transforms and the Numba batch kernel of the CIFAR pipeline; ``crops``: the ImageNet crops, which
tell the JPEG decoder the region they keep (``_region_decode``, resized by ``_resize``; ``jpeg_region``:
the optional libjpeg-turbo extension, ``_libjpeg_region``, that decodes only that region). A random
transform draws from a stream per worker (``_process_rng``); the Numba kernels compile through ``_jit``,
which keeps them on disk where Numba can. Nothing here imports the loader.

The contract and the light modules load with the package; ``datasets``, ``transforms``, ``crops``, ``jpeg_bytes``
and ``gpu_decode`` (Pillow, Numba) load on first use of one of their names, so a worker or a command that
needs none of them pays nothing for them.
"""

from __future__ import annotations

from .._lazy import lazy_names
from .contract import (
    BatchedMapDataset,
    EpochAware,
    IterableDataset,
    MapDataset,
    ResumableStream,
    StreamDataset,
    dataset_style,
)
from .records import PackedRecords, pack_records
from .streaming import ReaderSlot, ShardedTarStream, current_reader

_LAZY = {
    **dict.fromkeys(("ArrayDataset", "CIFAR10", "CIFAR10_CLASSES", "CacheRebuiltWarning", "IMAGE_EXTENSIONS", "ImageFolder",
                     "SyntheticCIFAR10", "TarImageDataset", "check_images", "decode_image", "encode_image",
                     "encode_png", "encode_png_batch", "open_dataset", "sample_source", "scan_tar",
                     "synthetic_pixels", "write_tar_shard"), ".datasets"),
    **dict.fromkeys(("AugmentParams", "CIFAR10_MEAN", "CIFAR10_STD", "CifarEvalTransform", "CifarTrainTransform",
                     "Compose", "IMAGENET_MEAN", "IMAGENET_STD", "Normalize", "NormalizeBatch", "RandomCrop",
                     "RandomHorizontalFlip", "ToCHWFloat", "crop_flip_normalize"), ".transforms"),
    **dict.fromkeys(("CenterCrop", "RandomResizedCrop", "Resize", "center_crop_box", "random_resized_crop_box",
                     "resized_shape"), ".crops"),
    **dict.fromkeys(("GpuJpegDecoder", "gpu_decode_status"), ".gpu_decode"),
    **dict.fromkeys(("EncodedJpegs", "jpeg_size"), ".jpeg_bytes"),
}

__all__ = ["BatchedMapDataset", "EpochAware", "IterableDataset", "MapDataset", "PackedRecords", "ReaderSlot", "ResumableStream",
           "ShardedTarStream", "StreamDataset", "current_reader", "dataset_style", "pack_records", *sorted(_LAZY)]


__getattr__ = lazy_names(__name__, _LAZY)


def __dir__() -> list[str]:
    return __all__
