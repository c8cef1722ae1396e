"""forkserver's server stands in for the script when nothing a worker unpickles comes from it.

Without it a process's first forkserver loader waited for the server to import what the script
imports (torch: seconds), and on Python 3.11 every worker ran the script again as ``__mp_main__``.
A dataset from a module needs none of that; one defined in the script has it run once, in the server
(as Python 3.13.8 and later do), and a later one from the script, or a ``worker_init_fn`` from it,
finds it run in each of its workers, whichever loader came first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np

from cupy_nwt.data import ArrayDataset
from cupy_nwt.loader.workers.start import SCRIPT, forkserver_preload, names_script, pickled_modules

ROOT = Path(__file__).resolve().parents[3]

SCRIPT_TEXT = """
import sys
import numpy as np
from cupy_nwt import DataLoader
from cupy_nwt.data import ArrayDataset

if __name__ == "__mp_main__":
    print("script ran", file=sys.stderr, flush=True)


class Doubles:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.float32(2 * i)


def init(worker_id):
    pass


def epoch(dataset, **kw):
    with DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="forkserver", **kw) as dl:
        return sorted(float(x) for b in dl for x in (b[0] if isinstance(b, (list, tuple)) else b))


if __name__ == "__main__":
    module = ArrayDataset(np.arange(8, dtype=np.float32))
    for name in sys.argv[1].split(","):
        dataset = Doubles() if name == "script" else module
        got = epoch(dataset, **({"worker_init_fn": init} if name == "init" else {}))
        print(name, got, flush=True)
        print("--", name, file=sys.stderr, flush=True)
"""


def run(tmp_path: Path, order: str) -> tuple[list[str], list[int]]:
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT_TEXT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), order], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    runs = [part.count("script ran") for part in proc.stderr.split("-- ")]  # how often the script ran before each loader's end
    return proc.stdout.splitlines(), runs


def test_workers_of_a_dataset_from_a_module_do_not_run_the_script(tmp_path):
    out, err = run(tmp_path, "module,module")
    assert out == [f"module {[float(i) for i in range(8)]}"] * 2
    assert err == [0, 0, 0]


def test_a_later_dataset_from_the_script_finds_it_run_in_its_workers(tmp_path):
    out, err = run(tmp_path, "module,script,init")
    assert out[1] == f"script {[float(2 * i) for i in range(8)]}" and out[2].startswith("init [0.0, 1.0")
    assert err == [0, 2, 2, 0]


def test_a_dataset_from_the_script_has_it_run_once_in_the_server_not_in_each_worker(tmp_path):
    out, err = run(tmp_path, "script,script")
    assert out == [f"script {[float(2 * i) for i in range(8)]}"] * 2
    assert err == [1, 0, 0]


def test_the_pickle_names_the_modules_of_its_classes_and_nothing_of_a_list_s_items():
    ds = ArrayDataset(np.zeros((4, 2), np.uint8))
    modules = pickled_modules([ds, [("a/b.jpg", 1)] * 3, None])
    assert modules is not None and "cupy_nwt.data.datasets" in modules and not modules & SCRIPT
    assert not names_script([ds, None])


def test_what_cannot_be_pickled_here_counts_as_the_script_s():
    assert pickled_modules([threading.Lock()]) is None
    assert names_script([threading.Lock()])


def test_without_the_script_the_server_imports_the_named_modules_and_not_torch():
    preload = forkserver_preload([object()], {"cupy_nwt.data.datasets", "numpy"})
    assert preload[:2] == ["cupy_nwt.loader.workers.server_main", "cupy_nwt.loader.workers.process_main"]
    assert "torch" not in preload and {"cupy_nwt.data.datasets", "numpy"} <= set(preload)
    assert forkserver_preload([object()], {"__main__"})[0] == "__main__"
