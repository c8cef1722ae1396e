"""docs/api.md, the reference mkdocstrings builds from the docstrings: every public name of ``cupy_nwt``
and ``cupy_nwt.data``, every error and the pytest fixtures are in it, and each function or class a
caller passes arguments to says what they are for (an ``Args:`` section; a fixture's ``Returns:``
describes its factory's), naming exactly its parameters, as every ``Args:`` section of a public name in
``data``, ``nwt``, ``picks`` and ``experiments`` does. A new public name fails here until it is documented."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import cupy_nwt
import cupy_nwt.data
import cupy_nwt.errors

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
FIXTURES = ("loader_benchmark", "transfer_benchmark")


def resolve(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def documented() -> dict[str, Any]:
    targets = re.findall(r"^::: ([\w.]+)$", API.read_text(encoding="utf-8"), re.M)
    return {t: resolve(t) for t in targets}


def reporting_names(module: Any) -> list[str]:
    """The public API ``cupy_nwt.reporting`` offers ``bench/`` and users' scripts: its modules' public
    functions and classes that take arguments (a bare helper such as ``to_json`` aside, named below)."""
    return [n for n, o in vars(module).items() if not n.startswith("_") and (inspect.isfunction(o) or inspect.isclass(o))
            and getattr(o, "__module__", "") == module.__name__ and takes_arguments(o) and n not in REPORTING_INTERNAL]


#: reporting's helpers for its own and the plots' plumbing: not part of what a script calls
REPORTING_INTERNAL = {"to_json", "wrote", "is_terminal", "matplotlib_available", "figure_class", "legend_outside"}


def public() -> dict[str, Any]:
    names = {f"cupy_nwt.{n}": getattr(cupy_nwt, n) for n in cupy_nwt.__all__ if n != "__version__"}
    names.update({f"cupy_nwt.data.{n}": getattr(cupy_nwt.data, n) for n in cupy_nwt.data.__all__})
    names.update({f"cupy_nwt.errors.{n}": c for n, c in vars(cupy_nwt.errors).items()
                  if inspect.isclass(c) and issubclass(c, cupy_nwt.errors.CupyNwtError) and not n.startswith("_")})
    for module in ("units", "tables", "figures", "progress", "plots"):
        mod = importlib.import_module(f"cupy_nwt.reporting.{module}")
        names.update({f"cupy_nwt.reporting.{module}.{n}": getattr(mod, n) for n in reporting_names(mod)})
    plugin = importlib.import_module("cupy_nwt.pytest_plugin")
    names.update({f"fixture {n}": getattr(plugin, n) for n in FIXTURES})
    return names


def test_every_public_name_is_in_the_reference():
    docs = documented()
    shown = {id(o) for o in docs.values()}
    errors_whole = "cupy_nwt.errors" in docs
    missing = [name for name, obj in public().items()
               if id(obj) not in shown and not (errors_whole and name.startswith("cupy_nwt.errors."))
               and not (errors_whole and inspect.isclass(obj) and issubclass(obj, cupy_nwt.errors.CupyNwtError))]
    assert not missing, f"add to docs/api.md: {missing}"


def takes_arguments(obj: Any) -> bool:
    if inspect.isclass(obj):
        if (dataclasses.is_dataclass(obj) or issubclass(obj, BaseException) or getattr(obj, "_is_protocol", False)
                or "__init__" not in vars(obj)):
            return False  # fields, a message, a protocol to implement
        target = obj.__init__
    elif callable(obj):
        target = obj
    else:
        return False
    try:
        params = [p for p in inspect.signature(target).parameters if p != "self"]
    except (TypeError, ValueError):
        return False
    return bool(params)


def test_what_takes_arguments_says_what_they_are_for():
    lacking = []
    for path, obj in documented().items():
        if inspect.ismodule(obj) or getattr(obj, "__name__", "") == "PackedRecords":  # built by pack_records
            continue
        section = "Returns:" if path.rsplit(".", 1)[-1] in FIXTURES else "Args:"
        if takes_arguments(obj) and section not in (obj.__doc__ or ""):
            lacking.append(path)
    assert not lacking, f"add an Args: section to: {lacking}"


def args_named(doc: str) -> list[str] | None:
    """The names an ``Args:`` section lists (None without one): each entry's name, at the section's indent.

    An entry naming two parameters on one line (``mean, std: ...``) comes back as that one name: the
    reference's parser (griffe's Google style) reads it so, as a parameter the signature does not have,
    so it is never a match; each parameter takes its own entry."""
    m = re.search(r"^([ \t]*)Args:\n((?:\1[ \t]+.*\n|[ \t]*\n)*)", doc + "\n", re.M)
    if m is None:
        return None
    entries = [line for line in m.group(2).splitlines() if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in entries), default=0)
    named = [re.match(r"\**(\w+(?:, \w+)*)( \(.*?\))?:", line.strip()) for line in entries
             if len(line) - len(line.lstrip()) == indent]
    return [n.group(1) for n in named if n is not None]


def parameters(fn: Any, bound: bool) -> list[str] | None:
    """``fn``'s parameters as a caller passes them (``self`` or ``cls`` dropped where ``bound``); None where
    Python cannot tell (a builtin)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params[1:] if bound and params else params


def callables_of(path: str, obj: Any) -> list[tuple[str, Any, str | None, bool]]:
    """(where, callable, docstring, whether its first parameter is bound) of a function, or of a class's
    constructor and public methods (static and class methods included)."""
    if not inspect.isclass(obj):
        return [(path, obj, obj.__doc__, False)]
    out = [(path, obj.__init__, obj.__doc__, True)]
    for name, member in vars(obj).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            out.append((f"{path}.{name}", getattr(obj, name), member.__func__.__doc__, False))
        elif inspect.isfunction(member):
            out.append((f"{path}.{name}", member, member.__doc__, True))
    return out


def args_mismatches(names: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    """Where an ``Args:`` section of these names (or of their methods) differs from the parameters:
    (named but not a parameter, a parameter not named)."""
    wrong = {}
    for path, obj in names.items():
        if inspect.ismodule(obj) or not callable(obj):
            continue
        for where, fn, doc, bound in callables_of(path, obj):
            named = args_named(inspect.cleandoc(doc or ""))
            params = parameters(fn, bound)
            if named is None or params is None:
                continue
            if sorted(named) != sorted(params):
                wrong[where] = (sorted(set(named) - set(params)), sorted(set(params) - set(named)))
    return wrong


def test_every_args_section_names_exactly_the_parameters():
    """A parameter renamed, added or dropped leaves no stale or missing entry in the reference."""
    assert args_mismatches(documented()) == {}, "Args: (named but not a parameter, a parameter not named)"


#: packages whose every public function and class (private modules' too) keeps its ``Args:`` section exact
EXACT_ARGS = ("data", "nwt", "picks", "experiments")


def package_names(package: str) -> dict[str, Any]:
    """The functions and classes each module of ``cupy_nwt.<package>`` defines under a public name."""
    root = importlib.import_module(f"cupy_nwt.{package}")
    names = {}
    for info in pkgutil.iter_modules(root.__path__):
        module = importlib.import_module(f"{root.__name__}.{info.name}")
        names.update({f"{module.__name__}.{n}": o for n, o in vars(module).items() if not n.startswith("_")
                      and (inspect.isfunction(o) or inspect.isclass(o)) and o.__module__ == module.__name__})
    return names


@pytest.mark.parametrize("package", EXACT_ARGS)
def test_every_args_section_of_the_package_names_exactly_the_parameters(package):
    """Beyond the reference: a reader of any module of these packages meets no stale or missing entry."""
    assert args_mismatches(package_names(package)) == {}, "Args: (named but not a parameter, a parameter not named)"
