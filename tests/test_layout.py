"""The package's shape holds: one idea a module, no import circles, one gateway to CUDA, one room per part.

Static checks over the source, so they cost nothing at run time and fail as soon as a change breaks
the layout that ``DESIGN.md`` draws (cli -> nwt -> loader -> picks -> data, cuda).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cupy_nwt

PKG = Path(cupy_nwt.__file__).resolve().parent
MAX_LINES = 460


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, *, everywhere: bool) -> set[str]:
    """cupy_nwt modules ``name`` imports: at module level only (what runs on import), or ``everywhere``
    (inside functions and for type checking too, as the ownership rule counts them)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    known = modules()
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if everywhere else tree.body:
        if not everywhere and isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for cand in [f"{base}.{a.name}" for a in node.names] + [base]:
                if cand in known:
                    found.add(cand)
                    break
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
    return found - {name}


def eager_imports(name: str, path: Path) -> set[str]:
    return imports(name, path, everywhere=False)


def all_imports(name: str, path: Path) -> set[str]:
    return imports(name, path, everywhere=True)


def test_no_module_is_over_about_450_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}


def test_module_level_imports_have_no_circle():
    graph = {n: eager_imports(n, p) for n, p in modules().items()}
    # a package's __init__ importing its own modules is how a package exports; only cross edges count
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m.startswith(n + "."):
                continue
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                if not all(b.startswith(a + ".") or a.startswith(b + ".") for a, b in zip(cycle, cycle[1:])):
                    pytest.fail("import circle: " + " -> ".join(cycle))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_only_cuda_imports_cupy():
    users = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "cupy" for a in node.names):
                users.add(name)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cupy" and not node.level:
                users.add(name)
    assert users == {"cupy_nwt.cuda"}


def _in(name: str, *rooms: str) -> bool:
    return any(name == f"cupy_nwt.{r}" or name.startswith(f"cupy_nwt.{r}.") for r in rooms)


# The package's floors, lowest first: a module may import its own floor and those below, never one above, not
# even lazily or for type checking. The base is what every part shares (errors, checks, files, host facts, the
# rank layout, the one gateway to CUDA, the reporting API); the picks are what a tuning found and where it is
# kept, which the loader reads and saves and the search writes; the commands and the pytest plugin are the top.
FLOORS = [
    ("base", ("errors", "_checks", "_files", "_lazy", "_exit", "_interrupts", "_background", "_fork_safe_lock", "_driver", "_pcie", "system", "ranks", "cuda", "_worker_info",
              "_mapped_files", "reporting")),
    ("data", ("data",)),
    ("picks", ("picks",)),
    ("loader", ("loader",)),
    ("tuner and experiments", ("nwt", "experiments")),
    ("commands and plugin", ("cli", "pytest_plugin")),
    ("entry points", ("__main__",)),
]

# The loader's floors, lowest first, by when each part acts: the events every stage announces and the gate a
# close waits at for the threads inside next() (the pools hold its event, the epoch passes it); the ring and
# the figures summed from the events; the workers that fill it; the device, the online tuner and the plan of an
# epoch (what sampling gives); the options (every argument resolved once); the runtime (what outlives an
# epoch) and the checkpoint (where an epoch stands, saved and restored); the running epoch and the arguments
# read back; the DataLoader itself.
LOADER_FLOORS = [
    ("events and the reader gate", ("_events", "_reader_gate")),
    ("ring and stats", ("ring", "_stats")),
    ("workers", ("workers",)),
    ("device, tuning, plan", ("device", "tuning", "plan")),
    ("options", ("_options",)),
    ("runtime and checkpoint", ("_runtime", "checkpoint")),
    ("epoch", ("epoch", "_settings_view")),
    ("the DataLoader", ("_dataloader",)),
]

# What still runs up a floor, each named with its reason; the rule is that this stays empty.
KNOWN_UP: set[tuple[str, str]] = set()


def _floor(name: str, floors: list, prefix: str) -> int | None:
    rest = name[len(prefix):].lstrip(".")
    best = None
    for i, (_, rooms) in enumerate(floors):
        for room in rooms:
            if (rest == room or rest.startswith(room + ".")) and (best is None or len(room) > best[1]):
                best = (i, len(room))
    return None if best is None else best[0]


def _up_imports(floors: list, prefix: str) -> list[str]:
    found = []
    for name, path in modules().items():
        if not name.startswith(prefix + ".") or _floor(name, floors, prefix) is None:
            continue
        mine = _floor(name, floors, prefix)
        for dep in sorted(all_imports(name, path)):
            theirs = _floor(dep, floors, prefix) if dep.startswith(prefix + ".") else None
            if theirs is not None and theirs > mine and (name, dep) not in KNOWN_UP:
                found.append(f"{name} ({floors[mine][0]}) imports {dep} ({floors[theirs][0]})")
    return found


def test_every_module_has_a_floor():
    rooms = {n.split(".")[1] for n in modules() if n.count(".") >= 1}
    named = {r for _, rs in FLOORS for r in rs}
    assert rooms - named == set()
    loader_rooms = {n.split(".")[2] for n in modules() if n.startswith("cupy_nwt.loader.")}
    assert loader_rooms - {r.split(".")[0] for _, rs in LOADER_FLOORS for r in rs} == set()


def test_no_module_imports_a_higher_floor_not_even_lazily():
    """data never imports the loader, the loader never the tuner, the experiments or the commands, the
    reporting API nothing above the base, ... : at module level, inside functions and for type checking alike."""
    assert _up_imports(FLOORS, "cupy_nwt") == []


def test_inside_the_loader_no_module_imports_a_later_stage():
    assert _up_imports(LOADER_FLOORS, "cupy_nwt.loader") == []


def _imports_of(room: str, other: str) -> list[str]:
    """Every import, lazy and type-only included, from a module of ``room`` to one of ``other``."""
    return [f"{n} imports {d}" for n, p in modules().items() if _in(n, room)
            for d in sorted(all_imports(n, p)) if _in(d, other)]


@pytest.mark.parametrize(("room", "other"), [
    ("data", "picks"), ("data", "loader"), ("data", "nwt"),
    ("picks", "loader"), ("picks", "nwt"),
    ("loader", "nwt"), ("loader", "experiments"), ("loader", "cli"), ("loader", "pytest_plugin"),
    ("reporting", "nwt"), ("reporting", "experiments"), ("reporting", "loader"),
])
def test_rule_room_never_imports_other(room, other):
    """The floors' rules one by one: data never imports the loader, the loader never the tuner, the picks
    never the loader (the loader reads and saves picks; the tuner that builds loaders sits above both)."""
    assert _imports_of(room, other) == []


def test_no_registration_slot_fills_a_lower_floor():
    """``import cupy_nwt`` imports nothing for its side effects but the loaders' exit function (``_exit``), which
    must be registered before the script's own: every other name it imports is one it exports."""
    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    imported = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
                for a in node.names}
    assert imported - set(cupy_nwt.__all__) - {"__version__", "lazy_names", "_exit"} == set()  # lazy_names makes __getattr__


def test_import_cupy_nwt_loads_the_errors_only_and_a_worker_only_its_own_side():
    """A loader worker imports the package on the way to its modules (per worker under spawn): the
    package's names load on first use, and a worker's modules do not pull in the main process's side."""
    code = ("import sys, cupy_nwt; top = sorted(m for m in sys.modules if m.startswith('cupy_nwt'));"
            "import cupy_nwt.loader.workers.process_main;"
            "print(top); print(sorted(m for m in sys.modules if m.startswith('cupy_nwt')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert eval(out[0]) == ["cupy_nwt", "cupy_nwt._exit", "cupy_nwt._lazy", "cupy_nwt.errors"]  # noqa: S307 - our own list
    worker = set(eval(out[1]))  # noqa: S307
    for main_side in ("cupy_nwt.loader._dataloader", "cupy_nwt.loader.workers.process", "cupy_nwt.nwt", "cupy_nwt.picks",
                      "cupy_nwt.cuda", "cupy_nwt.data.transforms", "cupy_nwt.reporting"):
        assert not {m for m in worker if m == main_side or m.startswith(main_side + ".")}, main_side
    assert {name: getattr(cupy_nwt, name).__name__ for name in ("DataLoader", "tune_num_workers")} == {
        "DataLoader": "DataLoader", "tune_num_workers": "tune_num_workers"}


def test_the_known_exceptions_are_still_real():
    """An entry of ``KNOWN_UP`` that no longer happens is taken out, so the list only shrinks."""
    every = {n: all_imports(n, p) for n, p in modules().items()}
    assert {(a, b) for a, b in KNOWN_UP if b not in every.get(a, set())} == set()


def test_nothing_but_the_entry_point_imports_the_commands():
    every = {n: all_imports(n, p) for n, p in modules().items()}
    for name in modules():
        if not _in(name, "cli") and name not in ("cupy_nwt.__main__", "cupy_nwt"):
            assert not {d for d in every[name] if _in(d, "cli")}, name


# what may sit at the package's top level: the gateway to CUDA, the errors, and the small shared pieces that
# several rooms use (argument checks, the one atomic file writer, the packages' names loaded on first use, the rank layout, host facts, the worker info, the locks a fork frees,
# the loaders' exit function)
TOP_LEVEL = {"cupy_nwt", "cupy_nwt.__main__", "cupy_nwt._exit", "cupy_nwt._interrupts", "cupy_nwt._background", "cupy_nwt._fork_safe_lock", "cupy_nwt._checks", "cupy_nwt._driver", "cupy_nwt._files", "cupy_nwt._lazy", "cupy_nwt._pcie",
             "cupy_nwt._worker_info", "cupy_nwt._mapped_files",
             "cupy_nwt.cuda", "cupy_nwt.errors", "cupy_nwt.ranks", "cupy_nwt.system"}


def test_every_data_source_and_command_lives_in_its_room():
    top = {n for n in modules() if n.count(".") <= 1 and not (PKG / n.split(".")[-1]).is_dir()}
    assert top == TOP_LEVEL
    assert {"cupy_nwt.data.contract", "cupy_nwt.data.datasets", "cupy_nwt.data.streaming", "cupy_nwt.data.records",
            "cupy_nwt.data.transforms", "cupy_nwt.cli.commands", "cupy_nwt.cli.reproduce", "cupy_nwt.cli.stats",
            "cupy_nwt.cli._pipeline"} <= set(modules())


def test_the_dataset_contract_is_asked_in_one_place():
    """The loader and the tuner ask ``data.contract`` what a dataset provides; none probes for its methods."""
    probes = ("__getitems__", "__getitem__", "set_epoch", "state_dict", "__iter__")
    found = []
    for name, path in modules().items():
        if name == "cupy_nwt.data.contract" or not _in(name, "loader", "nwt", "picks"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("hasattr", "getattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in probes
                    and "dataset" in ast.unparse(node.args[0])):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_no_import_circle_even_counting_type_only_and_lazy_imports():
    """One owner per thing: modules import one way, TYPE_CHECKING and function-level imports included."""
    graph = {n: all_imports(n, p) for n, p in modules().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_only_the_loader_package_imports_the_dataloader_module():
    users = {n for n, p in modules().items() if "cupy_nwt.loader._dataloader" in all_imports(n, p)}
    assert users == {"cupy_nwt.loader"}


def test_no_generator_yields_inside_an_exception_handler():
    """Python 3.10 (which the package supports) keeps a handled exception's traceback while a generator is
    suspended inside its ``except`` block, and those frames hold a loader's source and ring: a ring then
    outlived ``close()`` until the cyclic collector ran. Yield after the handler instead."""
    found = [f"{path.relative_to(PKG.parent)}:{sub.lineno}" for path in modules().values()
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ExceptHandler)
             for sub in ast.walk(node) if isinstance(sub, (ast.Yield, ast.YieldFrom))]
    assert found == []
