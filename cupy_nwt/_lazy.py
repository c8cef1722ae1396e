"""Names a package exports but imports on first use, so that importing the package stays cheap.

A loader worker imports ``cupy_nwt`` and ``cupy_nwt.loader`` on the way to its own modules (under
spawn once per worker): it should not pay for the tuner, Numba or the loader's main-process side.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: name -> its module (absolute, or relative to ``package``),
    imported on first use and then kept as a plain attribute of the package."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
