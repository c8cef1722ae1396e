"""The cache folder without platformdirs, and every import of the GPU path against the GPU image's packages.

The project's GPU image has no platformdirs (see ``GPU_IMAGE_MODULES``), so there the cache
falls back to ``$CUPY_NWT_CACHE_DIR``, ``$XDG_CACHE_HOME/cupy_nwt``, then ``~/.cache/cupy_nwt``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_nwt import system
from cupy_nwt.errors import ArgumentError

ROOT = Path(__file__).resolve().parent.parent
# the studies bench/gpu_session.sh runs on the GPU machine (gpu_feed imports loader_compare's workloads)
STUDIES_ON_THE_GPU = ("does_the_gpu_wait_for_batches", "does_it_scale_over_ranks", "is_the_loader_faster_than_torch")

# Third-party modules the project's GPU image ('cuda') has, from its package list: CuPy for
# CUDA 13, NumPy, Numba, psutil, Pillow, nvidia-ml-py, tqdm, filelock, matplotlib, PyTorch, JAX,
# mpi4py, pytest, pytest-benchmark, hypothesis. Not platformdirs.
GPU_IMAGE_MODULES = {"cupy", "numpy", "numba", "psutil", "PIL", "pynvml", "tqdm", "filelock", "matplotlib",
                     "torch", "jax", "mpi4py", "pytest", "pytest_benchmark", "hypothesis", "_pytest"}


def _blocker(tmp_path: Path) -> Path:
    """A folder for the front of PYTHONPATH in which ``import platformdirs`` raises ImportError."""
    pkg = tmp_path / "blocked" / "platformdirs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('raise ImportError("platformdirs is not on this image")\n')
    return pkg.parent


@pytest.fixture
def no_platformdirs(monkeypatch):
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # ``import platformdirs`` raises ImportError
    monkeypatch.delenv(system.CACHE_ENV, raising=False)


def test_fallback_order_without_platformdirs(no_platformdirs, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert system.cache_dir() == tmp_path / "home" / ".cache" / "cupy_nwt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec ignores relative paths
    assert system.cache_dir() == tmp_path / "home" / ".cache" / "cupy_nwt"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert system.cache_dir() == tmp_path / "xdg" / "cupy_nwt"
    monkeypatch.setenv(system.CACHE_ENV, str(tmp_path / "env"))
    assert system.cache_dir() == tmp_path / "env"
    assert system.cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_tune_saves_its_pick_without_platformdirs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != system.CACHE_ENV}
    env.update(PYTHONPATH=f"{_blocker(tmp_path)}{os.pathsep}{ROOT}", XDG_CACHE_HOME=str(tmp_path / "xdg"),
               CUPY_NWT_DISABLE_GPU="1")
    proc = subprocess.run([sys.executable, "-m", "cupy_nwt", "tune", "--synthetic-n", "256", "--batch-size", "32",
                           "--max-workers", "2", "--iterations", "8", "--no-progress", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = tmp_path / "xdg" / "cupy_nwt" / "num_workers.json"
    assert saved.is_file() and f"saved to {saved}" in proc.stdout


def test_every_module_of_the_gpu_path_imports_without_platformdirs(tmp_path):
    mods = sorted(f"cupy_nwt.{p.stem}" for p in (ROOT / "cupy_nwt").glob("*.py") if p.stem != "__main__")
    mods += ["gpu_feed", "scaleout", "loader_compare", "bench.workloads"]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    studies = [str(ROOT / "bench" / "studies" / s) for s in STUDIES_ON_THE_GPU]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_blocker(tmp_path)), str(ROOT), *studies]))
    proc = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def _required_imports(path: Path) -> set[str]:
    """Top-level names this file imports, except those inside a ``try`` that catches ImportError."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is None or "ImportError" in ast.unparse(h.type) or "ModuleNotFoundError" in ast.unparse(h.type)
                for h in node.handlers):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_required_imports_are_all_on_the_gpu_image():
    files = [p for d in ("cupy_nwt", "examples") for p in (ROOT / d).glob("*.py")]
    files += [p for d in ("bench", "tests") for p in (ROOT / d).rglob("*.py")]
    files.append(ROOT / "conftest.py")
    local = {p.stem for p in files} | {"cupy_nwt", "bench"}  # bench: the shared workloads, bench.workloads
    missing = {}
    for path in files:
        extra = _required_imports(path) - set(sys.stdlib_module_names) - local - GPU_IMAGE_MODULES
        if extra:
            missing[str(path.relative_to(ROOT))] = sorted(extra)
    assert not missing, f"imports the GPU image lacks (guard them with try/except ImportError): {missing}"


def test_the_import_scan_sees_a_missing_package(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import platformdirs\ntry:\n    import yaml\nexcept ImportError:\n    yaml = None\n")
    assert _required_imports(f) == {"platformdirs"}


def test_a_cache_variable_starting_with_a_tilde_is_under_home(monkeypatch, tmp_path):
    """A quoted ``CUPY_NWT_CACHE_DIR="~/picks"`` (no shell expanded it) saves under the home folder, not in a
    folder named ``~`` wherever the program happens to run."""
    from cupy_nwt.picks.store import ResultStore  # noqa: PLC0415

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(system.CACHE_ENV, "~/picks")
    monkeypatch.chdir(tmp_path)
    ResultStore().put("k", {"v": 1})
    assert (tmp_path / "home" / "picks" / "num_workers.json").is_file()
    assert not (tmp_path / "~").exists()


def test_a_relative_cache_folder_is_refused_in_one_line(monkeypatch, tmp_path):
    """A relative folder would follow the working folder: a job started elsewhere would miss its saved picks."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(system.CACHE_ENV, "nwt-cache")
    with pytest.raises(ArgumentError, match=rf"^CUPY_NWT_CACHE_DIR must be an absolute folder .* got 'nwt-cache': .*"
                                            rf"try CUPY_NWT_CACHE_DIR={tmp_path}/nwt-cache$"):
        system.cache_dir()
    monkeypatch.setenv(system.CACHE_ENV, "~/nwt-cache")
    assert system.cache_dir() == Path.home() / "nwt-cache"


def test_the_command_line_says_a_relative_cache_folder_in_one_line(tmp_path):
    env = {**os.environ, system.CACHE_ENV: "nwt-cache", "CUPY_NWT_DISABLE_GPU": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cupy_nwt", "reproduce", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr  # bad input
    assert done.stderr.strip().count("\n") == 0 and "CUPY_NWT_CACHE_DIR must be an absolute folder" in done.stderr
    assert not (tmp_path / "nwt-cache").exists()
