"""Is CuPy installed on a Linux machine without a CUDA driver? Asked of the package metadata and the
dynamic loader, without importing CuPy: that import takes seconds (1.8 s on a 2-vCPU VM), which every
loader's first batch waited for on a machine without a GPU. ``cuda`` asks it before CuPy."""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import sys

NO_DRIVER = "no NVIDIA driver is installed (libcuda was not found)"
_NAMES = ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x")


def cupy_without_driver() -> str | None:
    """CuPy's version where CuPy is installed and ``libcuda.so.1`` cannot be loaded; else None (ask CuPy)."""
    if sys.platform != "linux" or importlib.util.find_spec("cupy") is None:
        return None
    try:
        ctypes.CDLL("libcuda.so.1")
        return None
    except OSError:
        pass
    for name in _NAMES:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
