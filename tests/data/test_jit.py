"""The Numba kernels on an install the user cannot write, with a HOME that cannot be written either (a
root-owned virtual environment, a container's read-only image): Numba finds no folder to cache them in,
and the pipelines must still run, their kernels compiled in the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cupy_nwt

PACKAGE = Path(cupy_nwt.__file__).parent

SCRIPT = """
import logging, sys
import numpy as np
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from cupy_nwt.data import CifarTrainTransform
import cupy_nwt
assert cupy_nwt.__file__.startswith(sys.argv[1]), cupy_nwt.__file__
images = np.full((4, 32, 32, 3), 255, np.uint8)
out, labels = CifarTrainTransform()((images, np.arange(4)), 0)
print(out.shape)
"""


def test_the_cifar_pipeline_runs_from_a_read_only_install_with_an_unwritable_home(tmp_path):
    user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
    if user and shutil.which("setpriv") is None:
        pytest.skip("root writes anywhere, and setpriv is not here to drop that")
    site = tmp_path / "site-packages"
    shutil.copytree(PACKAGE, site / "cupy_nwt", ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    home.mkdir()
    folders = [home, site, *(p for p in site.rglob("*") if p.is_dir())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        if subprocess.run([*user, "touch", str(home / "x")], capture_output=True, check=False).returncode == 0:
            pytest.skip("this user writes into a read-only folder")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
        env.update(PYTHONPATH=str(site), HOME=str(home))
        run = subprocess.run([*user, sys.executable, "-c", SCRIPT, str(site)], capture_output=True, text=True,
                             env=env, timeout=300, check=False, cwd=home)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(4, 3, 32, 32)", run.stdout
    assert "set NUMBA_CACHE_DIR to a writable folder" in run.stderr
    assert "Traceback" not in run.stderr
