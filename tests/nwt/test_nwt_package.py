"""The tuner's package layout: imports point one way (nwt -> loader).

The loader reads a saved pick through ``cupy_nwt.nwt.pick`` and reaches the tuner only through the
slot ``cupy_nwt.nwt.auto`` fills; the tuner builds loaders, so an import the other way would bring
the circle back. Checked twice: statically over every import in the source (function-level ones
too, which a run may never reach), and by a fresh interpreter that imports the loader without
``cupy_nwt/__init__`` (which imports everything) and builds a loader with ``num_workers="auto"``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.nwt import auto, pick, store
from cupy_nwt.nwt.store import ResultStore
from cupy_nwt.ranks import RankLayout

PKG = Path(cupy_nwt.__file__).resolve().parent
ROOT = PKG.parent
TUNER_SIDE = {"cupy_nwt.nwt.measure", "cupy_nwt.nwt.auto", "cupy_nwt.nwt.tune", "cupy_nwt.nwt.fast",
              "cupy_nwt.nwt.paper"}
BELOW_LOADER = ("cupy_nwt.nwt.pick", "cupy_nwt.nwt.store", "cupy_nwt.nwt.fingerprint", "cupy_nwt.nwt.footprint",
                "cupy_nwt.nwt.trials", "cupy_nwt.nwt.schema", "cupy_nwt.nwt.verdict")


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
    assert "cupy_nwt.nwt.pick" in _imports("cupy_nwt.loader._options")  # inside the options' resolve
    assert "cupy_nwt.nwt.tune" in _imports("cupy_nwt.nwt.auto")  # from . import tune as _tune
    assert TUNER_SIDE <= _closure("cupy_nwt.nwt.auto")


def test_the_loader_side_never_imports_the_tuner():
    closure = _closure("cupy_nwt.loader")
    assert not closure & TUNER_SIDE, sorted(closure & TUNER_SIDE)
    assert {m for m in closure if m.startswith("cupy_nwt.nwt.")} <= set(BELOW_LOADER)


@pytest.mark.parametrize("name", BELOW_LOADER + ("cupy_nwt.nwt",))
def test_what_the_loader_imports_of_the_tuner_does_not_import_the_loader(name):
    assert "cupy_nwt.loader" not in _closure(name)


BARE = """
import json, sys, types

pkg = types.ModuleType("cupy_nwt")  # the package without its __init__, which imports the whole tuner
pkg.__path__ = [sys.argv[1]]
sys.modules["cupy_nwt"] = pkg
from cupy_nwt.data.datasets import ArrayDataset
from cupy_nwt.loader import DataLoader
from cupy_nwt.nwt.fingerprint import Fingerprint, machine_fingerprint, work_fingerprint
from cupy_nwt.nwt.store import TuneResult
import numpy as np

data = ArrayDataset(np.zeros((32, 4, 4, 3), np.uint8), np.arange(32) % 10)
fp = Fingerprint(machine_fingerprint(), work_fingerprint(data, batch_size=8, device="cpu", pin_memory=False,
                                                         prefetch_factor=2, local_world_size=1))
TuneResult(3, "fast", (), 4, 8, 0.5, 0.02, 8, 2, False, "cpu", fingerprint=fp).save()
out = {}
with DataLoader(data, batch_size=8, num_workers="auto", device="cpu", seed=0, rank=0, world_size=1) as dl:
    out["saved"] = dl.num_workers
try:
    DataLoader(data, batch_size=16, num_workers="auto", device="cpu", seed=0, rank=0, world_size=1)
except RuntimeError as exc:
    out["unsaved"] = str(exc)
out["modules"] = sorted(m for m in sys.modules if m.startswith("cupy_nwt"))
print(json.dumps(out))
"""


def test_a_bare_loader_reads_a_saved_pick_without_the_tuner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=str(ROOT), CUPY_NWT_CACHE_DIR=str(tmp_path), CUPY_NWT_DISABLE_GPU="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(BARE), str(PKG)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["saved"] == 3
    assert "no tuner is registered" in out["unsaved"] and "import cupy_nwt" in out["unsaved"]
    assert "cupy_nwt.nwt.pick" in out["modules"]
    assert not set(out["modules"]) & TUNER_SIDE, out["modules"]


def test_importing_cupy_nwt_registers_the_tuner():
    assert pick.registered_tuner() is auto._tune_once


def test_auto_takes_a_measure_factory(tmp_path, monkeypatch):
    """``num_workers="auto"`` for another loader, or without one: the factory's measure runs the trials."""
    built = []

    def factory(dataset, **settings):
        built.append(settings)
        return lambda workers, iterations, warmup: ([1.0, 0.5, 0.335, 0.33][workers] if workers < 4
                                                    else 0.33 * (1 + 0.05 * (workers - 3)))

    monkeypatch.setattr("cupy_nwt.ranks.usable_cpus", lambda: 4)
    monkeypatch.setattr("cupy_nwt.system.usable_cpus", lambda: 4)
    data = ArrayDataset(np.zeros((64, 4, 4, 3), np.uint8), np.arange(64) % 10)
    kw = {"batch_size": 8, "device": "cpu", "cache_dir": tmp_path, "measure_factory": factory,
          "layout": RankLayout(0, 1, 0, 1, "single")}
    assert pick.auto_num_workers(data, **kw) == 2  # 0.335 is within 2% of 0.33 with fewer workers
    assert built == [{"batch_size": 8, "prefetch_factor": 2, "pin_memory": False, "device": "cpu",
                      "batch_transform": None}]
    (record,) = ResultStore(tmp_path).records().values()
    saved = store.TuneResult.from_dict(record)
    # one rank: the open search, counts 0..4 (the usable CPUs) at least; 4 is slower than 3, so no further
    assert saved.best_workers == 2 and saved.max_workers == 5 and saved.strategy == "fast"
    assert pick.auto_num_workers(data, **kw) == 2 and len(built) == 1  # saved: no second search
