"""cupy_nwt: measure host-to-device transfer, feed GPUs with a shared-memory loader, tune its workers.

Users import from here. The parts: ``loader`` (the DataLoader and its machinery), ``nwt`` (the Num
Worker Tuner's search), ``picks`` (what a tuning found and where it is kept: ``num_workers="auto"``
reads and saves it), ``experiments`` (NVIDIA's transfer and overlap experiments, the simulated
training step), ``data`` (every data source and transform, behind one written dataset contract), ``cli`` (the
``cupy-nwt`` commands), ``cuda`` (the one gateway to CUDA) and ``errors``.
"""

from .cuda import gpu_status
from .data import (
                     BatchedMapDataset,
                     MapDataset,
                     PackedRecords,
                     ReaderSlot,
                     ShardedTarStream,
                     StreamDataset,
                     current_reader,
                     pack_records,
)
from .data.contract import IterableDataset
from .errors import (
                     ArgumentError,
                     ArgumentTypeError,
                     BatchLayoutError,
                     BatchStructureError,
                     BatchTypeError,
                     CorruptImageError,
                     CupyNwtError,
                     DamagedArchiveError,
                     DataError,
                     DataFileError,
                     LayoutError,
                     LoaderError,
                     LoaderTimeoutError,
                     MissingExtraError,
                     MissingPathError,
                     MisuseError,
                     NoGPUError,
                     OutOfRangeError,
                     RingMemoryError,
                     RunError,
                     ShmSpaceError,
                     StateError,
                     TooManyBadSamplesError,
                     UnknownKeyError,
                     WorkerDiedError,
                     WorkerError,
)
from .loader import DataLoader, WorkerInfo, default_collate, get_worker_info
from .nwt.placement import PlacementResult, tune_decode_placement
from .nwt.tune import tune_num_workers
from .picks.pick import AutoWorkers
from .picks.store import TuneResult, lookup
from .picks.verdict import UnreliablePickWarning

__version__ = "0.1.0"

__all__ = ["__version__", "gpu_status",
           "ArgumentError", "ArgumentTypeError", "BatchLayoutError", "BatchStructureError", "BatchTypeError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError", "DataError",
           "DataFileError", "LayoutError", "LoaderError", "LoaderTimeoutError", "NoGPUError", "RingMemoryError", "ShmSpaceError", "StateError", "TooManyBadSamplesError",
           "WorkerDiedError", "WorkerError", "MissingExtraError", "MissingPathError", "MisuseError", "OutOfRangeError",
           "RunError", "UnknownKeyError",
           "DataLoader", "IterableDataset", "WorkerInfo", "default_collate", "get_worker_info",
           "AutoWorkers", "TuneResult", "UnreliablePickWarning", "lookup", "tune_num_workers",
           "PlacementResult", "tune_decode_placement",
           "BatchedMapDataset", "MapDataset", "StreamDataset", "PackedRecords", "pack_records",
           "ReaderSlot", "ShardedTarStream", "current_reader"]
