"""``cupy_nwt.reporting`` is the public API the commands and ``bench/`` report through: each of its functions and
classes that takes arguments says what they are for, and it imports nothing above the package's base floor."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ("units", "tables", "figures", "progress", "plots")


def _public(module: str) -> list[tuple[str, object]]:
    mod = importlib.import_module(f"cupy_nwt.reporting.{module}")
    return [(n, o) for n, o in vars(mod).items() if not n.startswith("_") and getattr(o, "__module__", "") == mod.__name__
            and (inspect.isfunction(o) or inspect.isclass(o))]


@pytest.mark.parametrize("module", MODULES)
def test_each_public_name_says_what_its_arguments_are_for(module):
    lacking = []
    for name, obj in _public(module):
        target = obj.__init__ if inspect.isclass(obj) else obj
        params = [p for p in inspect.signature(target).parameters if p not in ("self", "args", "kwargs")]
        if params and "Args:" not in (obj.__doc__ or ""):
            lacking.append(f"{module}.{name}")
    assert lacking == []


def test_bench_reports_through_the_public_api_only():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "bench"
    private = [str(p.relative_to(root)) for p in root.rglob("*.py") if "cupy_nwt._reporting" in p.read_text(encoding="utf-8")]
    assert private == []
