"""The tuner's layout: imports point one way (nwt -> loader -> picks).

The loader reads and saves picks through ``cupy_nwt.picks`` and never imports the tuner's search,
which builds loaders. Checked twice: statically over every import in the source (function-level
ones too, which a run may never reach), and by a fresh interpreter that imports the loader without
``cupy_nwt/__init__`` (which imports everything) and builds loaders with ``num_workers="auto"``,
one with a saved pick and one without.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cupy_nwt

PKG = Path(cupy_nwt.__file__).resolve().parent
ROOT = PKG.parent
PICKS = tuple(f"cupy_nwt.picks.{p.stem}" for p in sorted((PKG / "picks").glob("*.py")) if p.stem != "__init__")


def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    for candidate in (PKG.joinpath(*parts).with_suffix(".py"), PKG.joinpath(*parts, "__init__.py")):
        if parts and candidate.is_file():
            return candidate
    return None


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(name: str) -> set[str]:
    """The cupy_nwt modules ``name`` imports anywhere in its source, ``if TYPE_CHECKING:`` blocks aside."""
    path = _module_file(name)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    out = set()
    for mod in found:
        if mod.startswith("cupy_nwt.") and _module_file(mod) is not None:
            out.add(mod)
            parts = mod.split(".")
            out.update(".".join(parts[:i]) for i in range(2, len(parts)))  # the package __init__s it runs
    return out


def _closure(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(_imports(mod) - seen)
    return seen


def test_the_scan_sees_imports_at_every_level():
    """The checks below prove something only if the scan finds lazy and relative imports."""
    assert "cupy_nwt.loader" in _imports("cupy_nwt.nwt.measure")  # from ..loader import DataLoader
    assert "cupy_nwt.picks.pick" in _imports("cupy_nwt.loader._options")
    assert "cupy_nwt.nwt.measure" in _imports("cupy_nwt.nwt.tune")  # from . import measure as _measure
    assert "cupy_nwt.loader" in _closure("cupy_nwt.nwt.tune")


def test_the_loader_side_never_imports_the_tuner():
    closure = _closure("cupy_nwt.loader._dataloader")  # the package exports it on first use: its own imports
    assert {m for m in closure if m.startswith("cupy_nwt.nwt")} == set()
    assert "cupy_nwt.picks.pick" in closure


def test_the_picks_never_import_the_loader_or_the_tuner():
    for name in PICKS:
        closure = _closure(name)
        assert {m for m in closure if m.startswith(("cupy_nwt.loader", "cupy_nwt.nwt"))} == set(), name


BARE = """
import json, logging, sys, types

pkg = types.ModuleType("cupy_nwt")  # the package without its __init__: only what the loader imports
pkg.__path__ = [sys.argv[1]]
sys.modules["cupy_nwt"] = pkg
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.loader import DataLoader
from cupy_nwt.picks.fingerprint import Fingerprint, machine_fingerprint, work_fingerprint
from cupy_nwt.picks.store import TuneResult
import numpy as np

data = ArrayDataset(np.zeros((32, 4, 4, 3), np.uint8), np.arange(32) % 10)
fp = Fingerprint(machine_fingerprint(), work_fingerprint(data, batch_size=8, device="cpu", pin_memory=False,
                                                         prefetch_factor=2, local_world_size=1))
TuneResult(3, "fast", (), 4, 8, 0.5, 0.02, 8, 2, False, "cpu", fingerprint=fp).save()
out = {}
with DataLoader(data, batch_size=8, num_workers="auto", device="cpu", seed=0, rank=0, world_size=1) as dl:
    out["saved"] = dl.num_workers
with DataLoader(data, batch_size=16, num_workers="auto", device="cpu", seed=0, rank=0, world_size=1) as dl:
    out["unsaved"] = [d.action for d in dl.decisions]
    out["batches"] = sum(1 for _ in dl)
out["modules"] = sorted(m for m in sys.modules if m.startswith("cupy_nwt"))
print(json.dumps(out))
"""


def test_a_bare_loader_reads_a_saved_pick_and_tunes_online_without_the_tuner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), CUPY_NWT_CACHE_DIR=str(tmp_path), CUPY_NWT_DISABLE_GPU="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BARE), str(PKG)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["saved"] == 3
    assert out["unsaved"] == ["start"] and out["batches"] == 2  # a miss: online tuning, no search
    assert "cupy_nwt.picks.pick" in out["modules"]
    assert not {m for m in out["modules"] if m.startswith("cupy_nwt.nwt")}, out["modules"]
