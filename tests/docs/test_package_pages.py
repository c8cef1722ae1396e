"""The page a reader enters a package by names what is there. For the loader and the tuner that is the
package's ``README.md`` (the loader's map as a fenced block, the tuner's as a table of modules); for
``data``, ``picks`` and ``experiments`` the docstring of their ``__init__.py``. Each map lists every
module of its package and no file that is gone; every code name the READMEs quote, and every class,
constant or ``module.name`` the packages' docstrings and comments quote, is defined in cupy_nwt. A module
or name added, moved or renamed fails here until the text follows."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

import cupy_nwt

PKG = Path(cupy_nwt.__file__).resolve().parent
#: the packages whose pages and docstrings are held to what is there
PACKAGES = ("loader", "data", "nwt", "picks", "experiments")

#: names the pages and the docstrings quote that are not the package's: other libraries' classes, constants
#: and methods, JSON's constants, and the remainder's symbols for an epoch's order and a world size
FOREIGN = {"BatchEncoding", "BytesIO", "Connection", "Dataset", "DistributedSampler", "DupFd", "ForkingPickler",
           "IterDataPipe", "Mapping", "O", "OrderedDict", "PicklingError", "RLIMIT_NOFILE", "RLIMIT_NPROC",
           "RandomSampler", "SCM_RIGHTS", "SIG_IGN", "Sequence", "SequentialSampler", "Stateful", "Trainer",
           "UserDict", "UserList", "W", "fit", "recv", "BILINEAR", "Image", "fromarray", "ToTensor",
           "RandomAccessDataSource", "NaN", "Infinity", "__cuda_array_interface__", "StatefulDistributedSampler",
           "StatefulDataLoader", "SubsetRandomSampler", "WeightedRandomSampler", "NUMBA_CACHE_DIR", "PIL",
           "MAX_IMAGE_PIXELS"}


def readme(package: str) -> Path:
    return PKG / package / "README.md"


def modules(package: str) -> set[str]:
    """Every module of ``package`` (C extension sources too), as paths under ``cupy_nwt``; ``__init__`` aside."""
    root = PKG / package
    return {p.relative_to(PKG).as_posix() for ext in ("*.py", "*.c") for p in root.rglob(ext)
            if p.name != "__init__.py"}


def fenced_map(package: str) -> set[str]:
    """A README's first fenced block, ``cupy_nwt/<package>/`` then one line per module or room: the modules it
    names (``room/name.py`` under a room's line)."""
    m = re.search(rf"^```\n(cupy_nwt/{package}/\n.*?)^```$", readme(package).read_text(encoding="utf-8"), re.M | re.S)
    assert m, f"cupy_nwt/{package}/README.md no longer opens with its map of the package"
    found, room = set(), ""
    for line in m.group(1).splitlines()[1:]:
        head = re.match(r"  (\S+)", line)
        if head:
            room = head.group(1) if head.group(1).endswith("/") else ""
            if not room:
                found.add(f"{package}/{head.group(1)}")
        for name in re.findall(r"(?<![/\w])([a-z_]+)\.py\b", line[line.find(" ", 3):] if head else line):
            found.add(f"{package}/{room}{name}.py")
    return found


def table_map(package: str) -> set[str]:
    """A README's table of modules: the first column of each row, ``name.py`` (this package's) or
    ``other/name.py`` (a module of another package the page covers)."""
    found = set()
    for cell in re.findall(r"^\| `([\w/]+\.py)` \|", readme(package).read_text(encoding="utf-8"), re.M):
        found.add(cell if "/" in cell else f"{package}/{cell}")
    assert found, f"cupy_nwt/{package}/README.md no longer holds its table of modules"
    return found


def defs(package: str) -> set[str]:
    """The functions and classes defined in ``package``: what a docstring map quotes beside its modules."""
    return {node.name for path in (PKG / package).rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def docstring_map(package: str) -> set[str]:
    """The package docstring's map: each quoted bare name (``contract``) is a module or folder of the package,
    a function or class defined in it, or cupy_nwt or one of its top-level modules; a name that is none of
    these stands for a module that is gone."""
    doc = ast.get_docstring(ast.parse((PKG / package / "__init__.py").read_text(encoding="utf-8"))) or ""
    found, named, own = set(), defs(package), {p.rsplit("/", 1)[-1].split(".")[0] for p in modules(package)}
    elsewhere = {"cupy_nwt"} | {p.stem for p in PKG.glob("*.py")} | {p.name for p in PKG.iterdir() if p.is_dir()}
    for name in re.findall(r"``(\w+)(?:\.py)?``", doc):
        if (PKG / package / name).is_dir() or name not in own and (name in named or name in elsewhere):
            continue
        suffix = ".c" if (PKG / package / f"{name}.c").is_file() else ".py"
        found.add(f"{package}/{name}{suffix}")
    return found


def the_map(package: str) -> set[str]:
    if package == "loader":
        return fenced_map(package)
    if package == "nwt":
        return table_map(package)
    return docstring_map(package)


def existing(paths: set[str]) -> set[str]:
    return {p for p in paths if (PKG / p).is_file()}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_map_lists_every_module_and_only_modules_that_exist(package):
    mapped = the_map(package)
    page = f"cupy_nwt/{package}/README.md" if package in ("loader", "nwt") else f"cupy_nwt/{package}/__init__.py"
    wrong = {"not in the map": sorted(modules(package) - mapped), "gone": sorted(mapped - existing(mapped))}
    assert wrong == {"not in the map": [], "gone": []}, f"the map in {page} differs from the files"


def defined() -> set[str]:
    """Every module, class, function, attribute and argument name defined anywhere in the package (and the
    layout test's names, which the loader's page points to)."""
    names = {p.name for p in PKG.rglob("*") if p.is_dir()} | {p.stem for p in PKG.rglob("*.py")} | {"cupy_nwt"}
    for path in [*PKG.rglob("*.py"), Path(__file__).resolve().parents[1] / "test_layout.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"CUPY_NWT_\w+",
                                                                                                 node.value):
                names.add(node.value)  # an environment variable the package reads
    return names


def module_names() -> set[str]:
    return {p.stem for p in PKG.rglob("*.py")} | {p.name for p in PKG.rglob("*") if p.is_dir()}


def quoted_code_names(page: Path) -> set[str]:
    """A page's code references: a quoted class name, or a dotted path that starts at a module of the package
    or a class (``workers/pool.fit_ring``, ``Make.remakes``, ``EpochIterator.__next__``)."""
    modules_ = module_names()
    found = set()
    for span in re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:[./]\w+)*?)(?:\.py|/|\(.*\))?", span)
        if not m:
            continue
        parts = re.split(r"[./]", m.group(1))
        if parts[0] in modules_ or parts[0][0].isupper() or parts[0].startswith("_") and len(parts) == 1:
            found.update(parts)
    return found


@pytest.mark.parametrize("package", [p for p in PACKAGES if readme(p).is_file()])
def test_every_code_name_the_page_quotes_is_defined_in_the_package(package):
    missing = sorted(quoted_code_names(readme(package)) - defined() - FOREIGN)
    assert missing == [], f"cupy_nwt/{package}/README.md names what the package does not define: {missing}"


#: a quoted file name (``data.npy``, ``num_workers.json``): a file on disk, not a code name
FILE_NAME = re.compile(r".*\.(md|npy|npz|json|tar|gz|tgz|cu|c|png|jpg)")


def quoted_in_source(path: Path) -> list[str]:
    """The ``Name`` (a class, a constant) and ``module.name`` spans a module's docstrings and comments quote."""
    modules_ = module_names()
    found = []
    for span in re.findall(r"``([^`\n]+)``", path.read_text(encoding="utf-8")):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:\.\w+)*)(?:\(.*\))?", span)
        if not m or FILE_NAME.fullmatch(span):
            continue
        parts = m.group(1).split(".")
        if parts[0][0].isupper() or len(parts) > 1 and parts[0] in modules_:
            found += [f"``{span}``: {p}" for p in parts]
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_class_or_constant_the_docstrings_quote_is_defined(package):
    """A quoted ``Name`` (a class, a constant) or ``module.name`` in the package's modules names what is there."""
    known = defined() | set(dir(builtins)) | FOREIGN
    missing = [f"{path.relative_to(PKG)}: {q}" for path in sorted((PKG / package).rglob("*.py"))
               for q in quoted_in_source(path) if q.rsplit(": ", 1)[1] not in known]
    assert missing == []
