"""cupy_nwt: measure host-to-device transfer, feed GPUs with a shared-memory loader, tune its workers.

Users import from here. The parts: ``loader`` (the DataLoader and its machinery), ``nwt`` (the Num
Worker Tuner's search), ``picks`` (what a tuning found and where it is kept: ``num_workers="auto"``
reads and saves it), ``experiments`` (NVIDIA's transfer and overlap experiments, the simulated
training step), ``data`` (every data source and transform, behind one written dataset contract), ``cli`` (the
``cupy-nwt`` commands), ``cuda`` (the one gateway to CUDA) and ``errors``.

The errors load with the package, and the loaders' exit function is registered (``_exit``: before the
script's own, which then find their loaders whole); every other name loads with its module on first use. A loader
worker imports this package before its own modules, under spawn once per worker and under forkserver
in the server: it should pay for the worker's modules, not for the tuner, the picks and the loader's
main-process side (``bench/studies/what_does_a_worker_start_cost/worker_import.py`` measures it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _exit  # noqa: F401 - the loaders' exit function, registered before the script's own
from ._lazy import lazy_names
from .errors import (
                     AgainstError,
                     ArgumentError,
                     ArgumentTypeError,
                     BaselineError,
                     BatchLayoutError,
                     BatchStructureError,
                     BatchTypeError,
                     CallgrindError,
                     CorruptImageError,
                     CupyNwtError,
                     DamagedArchiveError,
                     DataError,
                     DataFileError,
                     LayoutError,
                     LoaderClosedError,
                     LoaderError,
                     LoaderTimeoutError,
                     MissingExtraError,
                     MissingPathError,
                     MisuseError,
                     NoGPUError,
                     OutOfRangeError,
                     RingMemoryError,
                     RunError,
                     SavedPickError,
                     ShmSpaceError,
                     StateError,
                     TooManyBadSamplesError,
                     UnknownKeyError,
                     WorkerDiedError,
                     WorkerError,
)

if TYPE_CHECKING:
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
    from .loader import Autotune, DataLoader, MemoryGrowthWarning, WorkerInfo, default_collate, get_worker_info
    from .nwt.placement import PlacementResult, tune_decode_placement
    from .nwt.tune import tune_num_workers
    from .picks.pick import AutoWorkers
    from .picks.store import TuneResult, lookup
    from .picks.verdict import UnreliablePickWarning

__version__ = "0.1.0"

__getattr__ = lazy_names(__name__, {
    "gpu_status": ".cuda",
    **dict.fromkeys(("BatchedMapDataset", "MapDataset", "PackedRecords", "ReaderSlot", "ShardedTarStream",
                     "StreamDataset", "current_reader", "pack_records"), ".data"),
    "IterableDataset": ".data.contract",
    **dict.fromkeys(("Autotune", "DataLoader", "MemoryGrowthWarning", "WorkerInfo", "default_collate",
                     "get_worker_info"), ".loader"),
    **dict.fromkeys(("PlacementResult", "tune_decode_placement"), ".nwt.placement"),
    "tune_num_workers": ".nwt.tune",
    "AutoWorkers": ".picks.pick",
    **dict.fromkeys(("TuneResult", "lookup"), ".picks.store"),
    "UnreliablePickWarning": ".picks.verdict",
})

__all__ = ["__version__", "gpu_status",
           "ArgumentError", "ArgumentTypeError", "BatchLayoutError", "BatchStructureError", "BatchTypeError", "CorruptImageError", "CupyNwtError", "DamagedArchiveError", "DataError",
           "DataFileError", "LayoutError", "LoaderClosedError", "LoaderError", "LoaderTimeoutError", "NoGPUError", "RingMemoryError", "ShmSpaceError", "StateError", "TooManyBadSamplesError",
           "WorkerDiedError", "WorkerError", "MissingExtraError", "MissingPathError", "MisuseError", "OutOfRangeError",
           "RunError", "UnknownKeyError", "SavedPickError", "AgainstError", "BaselineError", "CallgrindError",
           "Autotune", "DataLoader", "IterableDataset", "MemoryGrowthWarning", "WorkerInfo", "default_collate",
           "get_worker_info",
           "AutoWorkers", "TuneResult", "UnreliablePickWarning", "lookup", "tune_num_workers",
           "PlacementResult", "tune_decode_placement",
           "BatchedMapDataset", "MapDataset", "StreamDataset", "PackedRecords", "pack_records",
           "ReaderSlot", "ShardedTarStream", "current_reader"]


def __dir__() -> list[str]:
    return __all__
