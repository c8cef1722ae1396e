"""A Ctrl-C that lands while the loader stops its workers (a notebook cell interrupted as its loop's ``break``
or a ``close()`` waits for workers busy in a slow sample) still ends them and frees the ring: the process
lives on (a notebook's kernel), so nothing may wait for its exit. torch's loader ends its workers the same way.

The script checks itself after the interrupt and a ``close()``: its workers' pids gone from the process
table (not running, not zombies), and no ring or shared-array memory held by any descriptor of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, signal, sys, threading, time
import numpy as np
import cupy_nwt

class Slow:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i in (8, 12):
            time.sleep(2)  # a slow sample: a network read, a large decode
        return np.full(4, i)

def held():
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return [link for link in links if link.startswith("/memfd:cupy_nwt")]

if __name__ == "__main__":
    how = sys.argv[2]
    loader = cupy_nwt.DataLoader(Slow(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context=sys.argv[1],
                                 persistent_workers=how == "close")
    pids = []
    try:
        for i, batch in enumerate(loader):
            pids = loader.worker_pids()
            if i == 1:
                if how == "break":  # the stop the break starts waits for the workers in their slow samples
                    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                break
        if how == "close":
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            loader.close()
    except KeyboardInterrupt:
        pass
    loader.close()
    left = [p for p in pids if os.path.exists(f"/proc/{p}")]
    print("left", left, held(), flush=True)
"""


@pytest.mark.parametrize("how", ["break", "close"])
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_ctrl_c_while_the_workers_are_stopped_still_ends_them_and_frees_the_ring(tmp_path, method, how):
    script = tmp_path / "cell.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), method, how], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, preexec_fn=lambda: __import__("signal").signal(2, 0))
    assert done.stdout == "left [] []\n", done.stderr
