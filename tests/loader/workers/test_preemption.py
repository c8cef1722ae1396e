"""A job preempted as schedulers do it: SIGTERM to the whole process group (SLURM's, Kubernetes'), caught
by a handler that sets a flag, the loader's state saved after the step in progress, the job resumed.

The workers get the signal too. They leave it to the main process, as they leave Ctrl-C, so the save finds
them serving; torch's workers die of it, and its ``next()`` raises that a worker was killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pids import wait_gone

ROOT = Path(__file__).resolve().parents[3]

TRAIN = """
import json, os, signal, sys, time
import numpy as np
import cupy_nwt

class Slow:
    def __len__(self):
        return 160

    def __getitem__(self, i):
        time.sleep(0.01)  # the loop waits on data: the signal finds it inside next()
        return np.full(3, i, np.float32), i

preempted = False

def on_sigterm(signum, frame):
    global preempted
    preempted = True

if __name__ == "__main__":
    checkpoint, method = sys.argv[1], sys.argv[2]
    loader = cupy_nwt.DataLoader(Slow(), batch_size=8, shuffle=True, seed=0, num_workers=2, device="cpu",
                                 multiprocessing_context=method)
    seen = []
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            saved = json.load(f)
        seen = saved["seen"]
        loader.load_state_dict(saved["loader"])
    signal.signal(signal.SIGTERM, on_sigterm)
    for images, labels in loader:
        seen += [int(v) for v in labels]
        print("pids", *loader.worker_pids(), flush=True)
        if preempted:
            with open(checkpoint, "w") as f:
                json.dump({"seen": seen, "loader": loader.state_dict()}, f)
            sys.exit(143)
    print("seen", json.dumps(seen), flush=True)
"""


def run(tmp_path: Path, method: str, preempt_after: int | None) -> tuple[int, list[int], str]:
    """The job once; ``preempt_after`` batches in, SIGTERM to its process group. Its exit status, the samples
    it saw in all (read back from its last line, or its checkpoint), and its stderr."""
    script, checkpoint = tmp_path / "train.py", tmp_path / "checkpoint.json"
    script.write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(checkpoint), method], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    pids: set[int] = set()
    try:
        for n, line in enumerate(proc.stdout, 1):
            if line.startswith("pids"):
                pids.update(int(p) for p in line.split()[1:])
            if n == preempt_after:
                os.killpg(proc.pid, signal.SIGTERM)
            if line.startswith("seen"):
                return proc.wait(60), json.loads(line.split(" ", 1)[1]), proc.stderr.read()
        code = proc.wait(60)
        assert wait_gone(pids) == []  # no worker outlives the preempted job
        return code, json.loads(checkpoint.read_text())["seen"] if checkpoint.exists() else [], proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_job_preempted_by_sigterm_to_its_group_saves_at_the_next_step_and_resumes_exactly(tmp_path, method):
    (tmp_path / "uninterrupted").mkdir()
    code, whole, err = run(tmp_path / "uninterrupted", method, None)
    assert code == 0 and sorted(whole) == list(range(160)), err
    code, head, err = run(tmp_path, method, preempt_after=5)
    assert code == 143 and err == "", err  # the handler saved and exited; no worker died under it
    code, seen, err = run(tmp_path, method, None)
    assert code == 0 and err == "", err
    assert len(head) >= 5 * 8 and seen[: len(head)] == head
    assert seen == whole  # the rest of the epoch, exactly: no sample twice, none lost
