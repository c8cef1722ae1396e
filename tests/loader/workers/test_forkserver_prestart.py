"""forkserver's server starts when a loader that will use it is made, not at its first ``iter()``, so its start
(a fresh interpreter importing ``__main__`` again and the preload) runs while the caller goes on; a loader
of another start method starts none. And a machine without a CUDA driver is told so without importing CuPy,
which a loader's first batch would otherwise wait seconds for."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, sys, time
import numpy as np
from cupy_nwt import DataLoader


def servers():
    # children running multiprocessing's forkserver (one just spawned shows its command line once exec'd)
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = f.read().split()
    lines = {}
    for _ in range(200):
        for kid in kids:
            if not lines.get(kid):
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    lines[kid] = f.read()
        if all(lines.values()):
            break
        time.sleep(0.05)
    return sum(b"multiprocessing.forkserver" in line for line in lines.values())


if __name__ == "__main__":
    method = sys.argv[1]
    loader = DataLoader(np.arange(8, dtype=np.float32), batch_size=4, num_workers=1, multiprocessing_context=method)
    made = servers()
    batches = [b.tolist() for b in loader]
    print(made, batches)
"""


def run(tmp_path: Path, method: str) -> str:
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), method], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_forkserver_loader_starts_the_server_when_made(tmp_path):
    assert run(tmp_path, "forkserver") == "1 [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]"


def test_a_fork_loader_starts_no_server(tmp_path):
    assert run(tmp_path, "fork") == "0 [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]"


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_driver_present(), reason="a CUDA driver is installed here: CuPy is asked")
def test_no_driver_is_found_without_importing_cupy():
    pytest.importorskip("cupy")
    code = "import sys; from cupy_nwt import cuda; s = cuda.gpu_status(); print(s.available, 'cupy' in sys.modules, s.reason)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CUPY_NWT_DISABLE_GPU", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.strip() == "False False no usable GPU: no NVIDIA driver is installed (libcuda was not found)"


TWO_THREADS = """
import os, threading
import numpy as np
from cupy_nwt import DataLoader


class Ids:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.int64(i)


def read(got, k, together):
    together.wait()
    loader = DataLoader(Ids(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context="forkserver")
    got[k] = sorted(int(x) for b in loader for x in b)


if __name__ == "__main__":
    got, together = {}, threading.Barrier(2)
    readers = [threading.Thread(target=read, args=(got, k, together)) for k in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    print(got[0] == got[1] == list(range(16)), os.environ.get("CUPY_NWT_FORKSERVER_SCRIPT"))
"""


def test_loaders_made_at_once_in_two_threads_leave_the_environment_as_it_was(tmp_path):
    """The server's start tells it the script through the environment for a moment: two loaders asking at
    once must not leave it set for every process the program starts later (the second used to put back the
    first one's value)."""
    (tmp_path / "two.py").write_text(TWO_THREADS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    env.pop("CUPY_NWT_FORKSERVER_SCRIPT", None)
    proc = subprocess.run([sys.executable, str(tmp_path / "two.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "None"]


WALKED_MEANWHILE = """
import os, threading, time
import torch.utils.data as tud
from torch.utils.data.datapipes.iter import IterableWrapper
from slow_pipes import SlowToScan

from cupy_nwt import DataLoader

if __name__ != "__main__":  # imported as the workers' __mp_main__: by the server once, or by each worker
    with open("imports.txt", "a") as f:
        f.write(f"{os.getpid()}\\n")


class Numbers(tud.IterDataPipe):
    def __iter__(self):
        return iter(range(32))


def walk(stop):
    while not stop.is_set():
        for _ in DataLoader(SlowToScan(IterableWrapper(range(8)).sharding_filter()), batch_size=None, num_workers=2,
                            worker_type="thread", device="cpu"):
            pass


if __name__ == "__main__":
    stop = threading.Event()
    walker = threading.Thread(target=walk, args=(stop,))
    walker.start()
    time.sleep(0.3)
    try:
        loader = DataLoader(Numbers().sharding_filter().map(abs), batch_size=None, num_workers=2, device="cpu",
                            multiprocessing_context="forkserver")
        print(sorted(int(x) for x in loader) == list(range(32)))
    finally:
        stop.set()
        walker.join()
"""


def test_the_server_learns_the_script_while_another_thread_walks_a_pipe(tmp_path):
    """The server imports the script once when a worker needs it (the dataset's class is defined there), as
    told by a pickle of the dataset that notes its classes. Taken while another thread walks a pipe, that
    pickle went through torch's walk hooks, noted nothing of the script, and each worker ran it instead."""
    pytest.importorskip("torch", reason="the pipes are torch's")
    (tmp_path / "walked.py").write_text(WALKED_MEANWHILE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "loader")]),
           "PYTHONWARNINGS": "ignore"}
    for _ in range(2):
        (tmp_path / "imports.txt").unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, str(tmp_path / "walked.py")], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=240)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["True"]
        assert len((tmp_path / "imports.txt").read_text().split()) == 1
