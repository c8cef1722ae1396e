"""The docs' resume recipe (docs/loader.md), for real: a training loop SIGKILLed mid-epoch and restarted from its last
checkpoint trains on exactly the samples an uninterrupted run trains on, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from cupy_nwt.loader.ring.ring import live_segments

ROOT = Path(__file__).resolve().parents[3]


def recipe() -> str:
    """The ``train_resumable.py`` block of docs/loader.md, as a reader would paste it."""
    text = (ROOT / "docs" / "loader.md").read_text(encoding="utf-8")
    m = re.search(r"```python\n(# train_resumable\.py\n.*?)```", text, re.S)
    assert m, "docs/loader.md lost its resume recipe"
    return m.group(1)


def start(folder: Path, step_s: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), STEP_S=step_s)
    return subprocess.Popen([sys.executable, "train_resumable.py"], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_epoch_then_resume_trains_on_the_uninterrupted_samples(tmp_path):
    runs = []  # the three runs' pids: their rings carry them (other runs on the machine may own rings too)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):
        d.mkdir()
        (d / "train_resumable.py").write_text(recipe())
    p = start(whole, "0")
    runs.append(p.pid)
    assert p.wait(120) == 0, p.stderr.read() if p.stderr else ""
    expected = json.loads((whole / "final.json").read_text())

    p = start(cut, "0.01")
    runs.append(p.pid)
    ckpt = cut / "ckpt.json"
    deadline = time.monotonic() + 60
    while True:  # kill once a checkpoint is mid-way through the first epoch
        assert time.monotonic() < deadline and p.poll() is None, "no mid-epoch checkpoint appeared"
        if ckpt.exists():
            state = json.loads(ckpt.read_text())["loader"]
            if state["delivered"] >= 10:
                break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    assert not (cut / "final.json").exists()
    saved = json.loads(ckpt.read_text())
    assert 0 < len(saved["model"]["seen"]) < len(expected["seen"])

    p = start(cut, "0")
    runs.append(p.pid)
    assert p.wait(120) == 0, p.stderr.read() if p.stderr else ""
    resumed = json.loads((cut / "final.json").read_text())
    assert resumed["seen"] == expected["seen"]
    assert resumed["w"] == expected["w"]
    deadline = time.monotonic() + 10  # the killed run's workers notice their parent is gone
    while any(live_segments(pid) for pid in runs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [ring for pid in runs for ring in live_segments(pid)] == []
