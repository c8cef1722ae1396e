"""``cupy_nwt/loader/README.md``, the page a reader of the loader enters by, names what is there: its map lists
every module of the package and no file that is gone, and every code name it quotes is defined in the package,
as is every class or constant the loader's docstrings and comments quote. A module or name added, moved or
renamed fails here until the text follows."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import cupy_nwt

PKG = Path(cupy_nwt.__file__).resolve().parent
LOADER = PKG / "loader"
README = LOADER / "README.md"

#: names the page and the docstrings quote that are not the package's: other libraries' classes and constants,
#: and the remainder's symbols for an epoch's order and a world size
FOREIGN = {"BatchEncoding", "BytesIO", "Connection", "Dataset", "DistributedSampler", "DupFd", "ForkingPickler",
           "IterDataPipe", "Mapping", "O", "OrderedDict", "PicklingError", "RLIMIT_NOFILE", "RLIMIT_NPROC",
           "RandomSampler", "SCM_RIGHTS", "SIG_IGN", "Sequence", "SequentialSampler", "Stateful", "Trainer",
           "UserDict", "UserList", "W", "fit", "recv"}


def the_map() -> str:
    """The first fenced block: the rooms and their modules."""
    m = re.search(r"^```\n(cupy_nwt/loader/\n.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)
    assert m, "cupy_nwt/loader/README.md no longer opens with its map of the package"
    return m.group(1)


def mapped_files() -> set[str]:
    """The modules the map names, as paths under ``cupy_nwt/loader`` (``room/name.py`` under a room's line)."""
    found, room = set(), ""
    for line in the_map().splitlines()[1:]:
        head = re.match(r"  (\S+)", line)
        if head:
            room = head.group(1) if head.group(1).endswith("/") else ""
            if not room:
                found.add(head.group(1))
        for name in re.findall(r"(?<![/\w])([a-z_]+)\.py\b", line[line.find(" ", 3):] if head else line):
            found.add(f"{room}{name}.py")
    return found


def modules() -> set[str]:
    return {p.relative_to(LOADER).as_posix() for p in LOADER.rglob("*.py") if p.name != "__init__.py"} | {"__init__.py"}


def test_the_map_lists_every_module_and_only_modules_that_exist():
    mapped = mapped_files()
    assert sorted(modules() - mapped) == [], "add to the map in cupy_nwt/loader/README.md"
    assert sorted(mapped - modules()) == [], "the map in cupy_nwt/loader/README.md names files that are gone"


def defined() -> set[str]:
    """Every module, class, function, attribute and argument name defined anywhere in the package (and the
    layout test's names, which the page points to)."""
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
    return names


def quoted_code_names() -> set[str]:
    """The page's code references: a quoted class name, or a dotted path that starts at a module of the package
    or a class (``workers/pool.fit_ring``, ``Make.remakes``, ``EpochIterator.__next__``)."""
    modules_ = {p.stem for p in PKG.rglob("*.py")} | {p.name for p in PKG.rglob("*") if p.is_dir()}
    found = set()
    for span in re.findall(r"`([^`\n]+)`", README.read_text(encoding="utf-8")):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:[./]\w+)*?)(?:\.py|/|\(.*\))?", span)
        if not m:
            continue
        parts = re.split(r"[./]", m.group(1))
        if parts[0] in modules_ or parts[0][0].isupper() or parts[0].startswith("_") and len(parts) == 1:
            found.update(parts)
    return found


def test_every_code_name_the_page_quotes_is_defined_in_the_package():
    missing = sorted(quoted_code_names() - defined() - FOREIGN)
    assert missing == [], f"cupy_nwt/loader/README.md names what the package does not define: {missing}"


def test_every_class_or_constant_the_loader_s_docstrings_quote_is_defined():
    """A quoted ``Name`` (a class, a constant) or ``module.name`` in the loader's modules names what is there."""
    known = defined() | set(dir(builtins)) | FOREIGN
    modules_ = {p.stem for p in PKG.rglob("*.py")} | {p.name for p in PKG.rglob("*") if p.is_dir()}
    missing = []
    for path in sorted(LOADER.rglob("*.py")):
        for span in re.findall(r"``([^`\n]+)``", path.read_text(encoding="utf-8")):
            m = re.fullmatch(r"([A-Za-z_]\w*(?:\.\w+)*)(?:\(.*\))?", span)
            if not m or span.endswith(".md"):
                continue
            parts = m.group(1).split(".")
            if parts[0][0].isupper() or len(parts) > 1 and parts[0] in modules_:
                missing += [f"{path.relative_to(PKG)}: ``{span}``" for p in parts if p not in known]
    assert missing == []
