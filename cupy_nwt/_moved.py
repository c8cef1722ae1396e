"""Old module paths of the flat layout, kept importable for one release.

``import cupy_nwt.worker`` (say) still works: a finder on ``sys.meta_path`` answers for each old
name in :data:`MOVED` with the module now at its new path, registered under the old name too, so
both names are one module object (a monkeypatch through either reaches the same code). Each first
use says where the module went with a ``DeprecationWarning``. One table here instead of a shim file
per old module keeps the package's top level as small as the layout intends.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "cupy_nwt.worker": "cupy_nwt.loader.workers.process",
    "cupy_nwt.shm": "cupy_nwt.loader.ring.ring",
    "cupy_nwt.prefetch": "cupy_nwt.loader.device.prefetch",
    "cupy_nwt.collate": "cupy_nwt.loader.ring.collate",
    "cupy_nwt.sampler": "cupy_nwt.loader.epoch.sampler",
    "cupy_nwt.distributed": "cupy_nwt.ranks",
    "cupy_nwt.memory": "cupy_nwt.nwt.memory",
    "cupy_nwt.fingerprint": "cupy_nwt.nwt.fingerprint",
    "cupy_nwt.transfers": "cupy_nwt.experiments.transfers",
    "cupy_nwt.overlap": "cupy_nwt.experiments.overlap",
    "cupy_nwt.step_sim": "cupy_nwt.experiments.step_sim",
    "cupy_nwt.timing": "cupy_nwt.experiments.timing",
    "cupy_nwt.units": "cupy_nwt._reporting.units",
    "cupy_nwt.report": "cupy_nwt._reporting.tables",
    "cupy_nwt.plots": "cupy_nwt._reporting.plots",
    "cupy_nwt.loader._sampler": "cupy_nwt.loader.epoch.sampler",
    "cupy_nwt.loader._remainder": "cupy_nwt.loader.epoch.remainder",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{self.old} moved to {self.new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module already ran under its new name: nothing to execute again."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Answer for the old paths (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
