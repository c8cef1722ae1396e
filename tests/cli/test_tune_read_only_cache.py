"""``cupy-nwt tune`` with a cache folder that takes no new file: refused before the search, or, where the folder
stops taking files during it, the search's result printed and written all the same.

Run as a user the folder's mode stops: as root, with the capabilities that pass over modes dropped (``setpriv``).
The search runs on a fake trial curve (``tune_num_workers(measure=...)`` behind the command), which also
leaves a mark per trial; the command, its checks and the store are the real ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cli

USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []
SCRIPT = """
import os, sys
from pathlib import Path
from cupy_nwt import cli
from cupy_nwt.nwt import tune as nwt_tune

REAL, CACHE, MARKS = nwt_tune.tune_num_workers, os.environ["CUPY_NWT_CACHE_DIR"], Path(sys.argv[2])

def measure(workers, iterations, warmup):
    (MARKS / f"trial-{workers}").touch()
    if sys.argv[1] == "closes":
        os.chmod(CACHE, 0o555)  # a remount, an operator: the folder stops taking files mid-search
    return 0.05 / (workers + 1)

nwt_tune.tune_num_workers = lambda data, **kw: REAL(data, **{**kw, "measure": measure})
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.fixture
def run_tune(tmp_path):
    if USER and shutil.which("setpriv") is None:
        pytest.skip("root writes anywhere, and setpriv is not here to drop that")
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o555)
    if subprocess.run([*USER, "touch", str(probe / "x")], capture_output=True, check=False).returncode == 0:
        pytest.skip("this user writes into a read-only folder")
    data, marks, cache = tmp_path / "data.npy", tmp_path / "marks", tmp_path / "cache"
    np.save(data, np.zeros((64, 4), np.float32))
    marks.mkdir()
    cache.mkdir()
    env = dict(os.environ, CUPY_NWT_CACHE_DIR=str(cache), PYTHONPATH=str(Path(cli.__file__).parents[2]))
    env.pop(cli.DEBUG_ENV, None)

    def run(folder: str) -> subprocess.CompletedProcess:
        argv = ["tune", "--dataset", str(data), "--batch-size", "8", "--max-workers", "3", "--strategy", "paper",
                "--iterations", "4", "--device", "cpu", "--no-progress", "--json", "--output", str(tmp_path / "t.json")]
        try:
            return subprocess.run([*USER, sys.executable, "-c", SCRIPT, folder, str(marks), *argv],
                                  capture_output=True, text=True, env=env, timeout=120, check=False)
        finally:
            cache.chmod(0o755)

    run.cache, run.marks, run.output = cache, marks, tmp_path / "t.json"
    return run


def test_a_read_only_cache_holding_an_earlier_saves_lock_is_refused_before_the_search(run_tune):
    (run_tune.cache / "num_workers.json.lock").touch()  # what any earlier save leaves behind
    run_tune.cache.chmod(0o555)
    proc = run_tune("read-only")
    assert proc.returncode == cli.EXIT_USAGE and proc.stderr.count("\n") == 1
    assert f"the cache folder {run_tune.cache} (CUPY_NWT_CACHE_DIR) cannot hold the saved picks" in proc.stderr
    assert "--no-save" in proc.stderr and not list(run_tune.marks.iterdir())


def test_a_cache_that_stops_taking_files_during_the_search_still_gives_the_result(run_tune):
    proc = run_tune("closes")
    assert proc.returncode == cli.EXIT_USAGE and proc.stderr.count("\n") == 1
    assert "cannot hold the saved picks" in proc.stderr
    assert json.loads(proc.stdout)["best_workers"] == 2
    assert json.loads(run_tune.output.read_text())["best_workers"] == 2
