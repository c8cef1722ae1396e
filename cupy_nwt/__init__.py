"""cupy_nwt: measure host-to-device transfer, feed GPUs with a shared-memory loader, tune its workers.

Users import from here. The parts: ``loader`` (the DataLoader and its machinery), ``nwt`` (the Num
Worker Tuner), ``experiments`` (NVIDIA's transfer and overlap experiments, the simulated training
step), ``datasets`` and ``transforms`` (data sources and Numba batch transforms), ``cuda`` (the one
gateway to CUDA) and ``errors``.
"""

from . import _moved
from .cuda import gpu_status
from .errors import (
                     ArgumentError,
                     BatchLayoutError,
                     CorruptImageError,
                     CupyNwtError,
                     DamagedArchiveError,
                     DataError,
                     DataFileError,
                     LayoutError,
                     LoaderError,
                     LoaderTimeoutError,
                     NoGPUError,
                     RingMemoryError,
                     ShmSpaceError,
                     StateError,
                     WorkerDiedError,
                     WorkerError,
)
from .loader import DataLoader, IterableDataset, WorkerInfo, default_collate, get_worker_info
from .nwt import auto as _auto  # noqa: F401 - registers the tuner that num_workers="auto" runs
from .nwt.store import TuneResult, lookup
from .nwt.tune import tune_num_workers
from .records import PackedRecords, pack_records
from .streaming import ReaderSlot, ShardedTarStream, current_reader

__version__ = "0.1.0"

_moved.install()

__all__ = ["__version__", "gpu_status",
           "ArgumentError", "BatchLayoutError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError", "DataError",
           "DataFileError", "LayoutError", "LoaderError", "LoaderTimeoutError", "NoGPUError", "RingMemoryError", "ShmSpaceError",
           "StateError",
           "WorkerDiedError",
           "WorkerError",
           "DataLoader", "IterableDataset", "WorkerInfo", "default_collate", "get_worker_info",
           "TuneResult", "lookup", "tune_num_workers",
           "PackedRecords", "pack_records",
           "ReaderSlot", "ShardedTarStream", "current_reader"]
