"""The main process ends (SIGTERM, Ctrl-C, kill -9, or its main thread finishes beside a reading thread)
while its workers are busy: nothing is left behind, and nothing is printed but what the script's end prints.

Each test runs a script as a user would write it, in a subprocess, signals it while its workers are
stuck inside ``__getitem__`` (or have a queue of work), and checks the process table and the rings:
no worker outlives it, no ring stays (in /dev/shm, or held by any process), and a worker whose parent
died starts no more samples.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pids import alive

from cupy_nwt.loader.ring.ring import live_segments

ROOT = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 8.0  # "within seconds", generous for a loaded machine; not a timing claim

STUCK = """
import os, sys, time
import numpy as np
import cupy_nwt

LOG = sys.argv[1]

class Stuck:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        with open(LOG, "a") as f:
            f.write(f"{i}\\n")
        if i >= 8:
            time.sleep(600)  # stuck, as a worker deadlocked in a sample would be
        return np.full(4, i)

if __name__ == "__main__":
    {prelude}
    loader = cupy_nwt.DataLoader(Stuck(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context=sys.argv[2])
    for batch in loader:
        print("pids", *loader.worker_pids(), flush=True)
"""


@pytest.fixture(params=["fork", "forkserver"])
def method(request: pytest.FixtureRequest) -> str:
    """The start method the script asks for: fork (the default here) and forkserver (CUDA's, a GPU runtime's)."""
    return str(request.param)


def start(tmp_path: Path, script: str, method: str) -> tuple[subprocess.Popen[str], Path]:
    path, log = tmp_path / "train.py", tmp_path / "started.txt"
    path.write_text(script)
    log.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(path), str(log), method], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path, preexec_fn=as_at_a_terminal)
    return proc, log


def as_at_a_terminal() -> None:
    """Ctrl-C as a terminal delivers it: a suite started by ``cmd &`` from a script runs with SIGINT
    ignored, which its children inherit, and a Python started so never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def worker_pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("pids"), f"the script printed {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    return [int(p) for p in line.split()[1:]]


def segments_of(pid: int) -> set[str]:
    """The cupy_nwt rings process ``pid`` has mapped: a /dev/shm path, or ``memfd:<name>`` for anonymous memory."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    paths = {line.split(None, 5)[-1].split(" (deleted)")[0] for line in maps.splitlines() if "cupy_nwt_" in line}
    return {p if p.startswith("/dev/shm/") else "memfd:" + p.removeprefix("/memfd:") for p in paths}


def ring_exists(ring: str) -> bool:
    """A /dev/shm segment still has its name; an anonymous ring is still held or mapped by some process."""
    return ring in live_segments() if ring.startswith("memfd:") else os.path.exists(ring)


def wait_for(predicate, what: str, limit: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {limit} s: {what}")
        time.sleep(0.05)


def started(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()]


def stuck_setup(tmp_path: Path, method: str, prelude: str = "",
                script: str = STUCK) -> tuple[subprocess.Popen[str], list[int], set[str], Path]:
    """The script is running, both workers are inside a sample that never returns, the ring exists."""
    proc, log = start(tmp_path, script.replace("{prelude}", prelude), method)
    pids = worker_pids(proc)
    wait_for(lambda: len([i for i in started(log) if i >= 8]) >= 2, "both workers stuck in a sample", 60)
    rings = set().union(*(segments_of(p) for p in pids))
    assert rings, "the workers have the ring mapped"
    return proc, pids, rings, log


def cleanup(proc: subprocess.Popen[str], pids: list[int]) -> None:
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()


def assert_nothing_left(pids: list[int], rings: set[str]) -> None:
    wait_for(lambda: not any(alive(p) for p in pids), f"workers {pids} ended")
    wait_for(lambda: not any(ring_exists(r) for r in rings), f"ring(s) {rings} freed")


def test_sigterm_ends_stuck_workers_and_removes_the_ring(tmp_path, method):
    proc, pids, rings, _ = stuck_setup(tmp_path, method)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(GONE_WITHIN_S) == -signal.SIGTERM  # it still dies of SIGTERM, as without the loader
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


# STUCK, with a thread of the user's that takes a signal itself once told to: the kernel hands a process's
# signal to whichever of its threads it likes (numpy's BLAS threads are candidates too).
FROM_A_THREAD = STUCK.replace("if __name__", """import signal, threading

def take_signal(go, signum):
    while not os.path.exists(go):
        time.sleep(0.02)
    signal.pthread_kill(threading.get_ident(), signum)

if __name__""", 1)


def test_a_sigterm_delivered_to_another_thread_still_ends_the_script_and_its_workers(tmp_path, method):
    """The signal's Python handler runs only when the main thread next runs Python: a main thread
    waiting for its workers with no end in sight used to keep the script alive."""
    prelude = "threading.Thread(target=take_signal, args=(LOG + '.go', signal.SIGTERM), daemon=True).start()"
    proc, pids, rings, log = stuck_setup(tmp_path, method, prelude, FROM_A_THREAD)
    try:
        log.with_name(log.name + ".go").write_text("")
        assert proc.wait(GONE_WITHIN_S) == -signal.SIGTERM
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


# STUCK, iterated by a thread of the user's (a background prefetcher, an evaluation thread) while the main
# thread waits on it: signal handlers can be set only on the main thread, so the loader sets none. A daemon
# thread, as such readers are: Python waits at exit for a thread that is not (from 3.13 even after a Ctrl-C in
# ``join()``; before, that Ctrl-C let it go), and this one waits on workers stuck for good, with either loader.
IN_A_THREAD = STUCK.replace("""    for batch in loader:
        print("pids", *loader.worker_pids(), flush=True)
""", """    def read():
        for batch in loader:
            print("pids", *loader.worker_pids(), flush=True)

    import threading
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join()
""")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_a_loader_iterated_on_another_thread_leaves_nothing_when_the_script_is_ended(tmp_path, method, how):
    """The script dies of the signal; its workers end (noticing their parent is gone, or ended at its exit)
    and the ring goes with them."""
    proc, pids, rings, _ = stuck_setup(tmp_path, method, script=IN_A_THREAD)
    try:
        proc.send_signal(how)
        assert proc.wait(GONE_WITHIN_S) == -how
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


# IN_A_THREAD, whose main thread finishes (told to) while the reading thread waits on the stuck workers.
ENDS_BESIDE_A_READER = IN_A_THREAD.replace("    reader.join()\n", """    while not os.path.exists(LOG + ".go"):
        time.sleep(0.02)
""")


def test_a_script_that_ends_while_its_daemon_thread_waits_on_the_loader_ends_quietly(tmp_path, method):
    """The loader's finalizer at exit hangs up the reading thread, which parks until the interpreter ends; then
    the workers are stopped: exit status 0, nothing printed (it used to print the concurrent poll's RuntimeError
    and the reading thread's WorkerDiedError), nothing left."""
    assert ENDS_BESIDE_A_READER.count('LOG + ".go"') == 1
    proc, pids, rings, log = stuck_setup(tmp_path, method, script=ENDS_BESIDE_A_READER)
    try:
        log.with_name(log.name + ".go").write_text("")
        assert proc.wait(GONE_WITHIN_S) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


def test_a_script_ends_soon_while_its_daemon_thread_is_inside_a_main_process_sample(tmp_path):
    """Without workers the reading thread runs the dataset's code itself and cannot answer the hang-up: the
    close at exit gives up on it after a second instead of holding the exit (it waited 10 s)."""
    script = ENDS_BESIDE_A_READER.replace("num_workers=2", "num_workers=0").replace(", multiprocessing_context=sys.argv[2]", "")
    assert "num_workers=0" in script and "multiprocessing_context" not in script
    proc, log = start(tmp_path, script.replace("{prelude}", ""), "fork")
    try:
        assert worker_pids(proc) == []
        wait_for(lambda: any(i >= 8 for i in started(log)), "the reading thread stuck in a sample", 60)
        log.with_name(log.name + ".go").write_text("")
        assert proc.wait(GONE_WITHIN_S) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        cleanup(proc, [])


ON_TORCH = IN_A_THREAD.replace(
    'cupy_nwt.DataLoader(Stuck(), batch_size=4, num_workers=2, device="cpu", multiprocessing_context=sys.argv[2])',
    'torch.utils.data.DataLoader(Stuck(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[2])').replace(
    "for batch in loader:\n            print(\"pids\", *loader.worker_pids(), flush=True)",
    "it = iter(loader)\n        for batch in it:\n            print(\"pids\", *[w.pid for w in it._workers], flush=True)").replace(
    "import cupy_nwt", "import torch.utils.data")


@pytest.mark.parametrize("loader", ["torch", "cupy_nwt"])
def test_a_ctrl_c_beside_a_loader_iterated_on_another_thread_says_only_keyboard_interrupt(tmp_path, loader):
    """torch's loader, read by a thread of the script, ends on a Ctrl-C with the KeyboardInterrupt (under load its
    reading thread may add a traceback of its own as the interpreter ends: torch is held to the interrupt only);
    ours with the KeyboardInterrupt alone: its close at exit hangs up the reading thread (which then parks) before
    it stops the workers. It used to poll the pipes that thread was polling (RuntimeError: concurrent poll())."""
    if loader == "torch":
        pytest.importorskip("torch", reason="the torch side of the case needs torch")
    script = ON_TORCH if loader == "torch" else IN_A_THREAD
    assert script.count("reader.join()") == 1 and ("torch.utils.data.DataLoader" in script) == (loader == "torch")
    proc, log = start(tmp_path, script.replace("{prelude}", ""), "fork")
    pids = worker_pids(proc)
    try:
        wait_for(lambda: len([i for i in started(log) if i >= 8]) >= 2, "both workers stuck in a sample", 60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(GONE_WITHIN_S) == -signal.SIGINT
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "KeyboardInterrupt" in err, err[-3000:]
        if loader == "cupy_nwt":
            assert err.count("Traceback") == 1 and "Error" not in err, err[-3000:]
    finally:
        cleanup(proc, pids)


def test_a_ctrl_c_delivered_to_another_thread_raises_beside_thread_workers(tmp_path):
    """The same for thread workers, which wait on a queue: KeyboardInterrupt while both are stuck in a sample."""
    prelude = "threading.Thread(target=take_signal, args=(LOG + '.go', signal.SIGINT), daemon=True).start()"
    script = FROM_A_THREAD.replace('multiprocessing_context=sys.argv[2]', 'worker_type="thread"')
    proc, log = start(tmp_path, script.replace("{prelude}", prelude), "thread")
    try:
        assert worker_pids(proc) == []
        wait_for(lambda: len([i for i in started(log) if i >= 8]) >= 2, "both worker threads stuck in a sample", 60)
        log.with_name(log.name + ".go").write_text("")
        assert proc.wait(GONE_WITHIN_S) == -signal.SIGINT
        assert proc.stderr is not None and "KeyboardInterrupt" in proc.stderr.read()
    finally:
        cleanup(proc, [])


def test_ctrl_c_raises_keyboard_interrupt_and_cleans_up(tmp_path, method):
    proc, pids, rings, _ = stuck_setup(tmp_path, method)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(GONE_WITHIN_S) == -signal.SIGINT  # Python's exit for an uncaught KeyboardInterrupt
        assert proc.stderr is not None and "KeyboardInterrupt" in proc.stderr.read()
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


@pytest.mark.parametrize("handler", ["sys.exit(3)", "(loader.close(), sys.exit(3))"], ids=["exits", "closes-then-exits"])
def test_a_users_sigterm_handler_stays_in_charge(tmp_path, method, handler):
    """A preemption handler as jobs write them, which may close the loader first: the handler runs on the
    thread it interrupted, inside ``next()``, so that close runs as the call unwinds (it used to raise
    "generator already executing" from the handler, and the job exited 1, not 3)."""
    prelude = f"import signal; signal.signal(signal.SIGTERM, lambda *a: {handler})"
    proc, pids, rings, _ = stuck_setup(tmp_path, method, prelude)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(GONE_WITHIN_S) == 3  # the user's handler ran, and its exit unwound the loader
        assert proc.stderr is not None and proc.stderr.read() == ""
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)


QUEUED = """
import sys, time
import numpy as np
import cupy_nwt

LOG = sys.argv[1]

class Slow:
    def __len__(self):
        return 400

    def __getitem__(self, i):
        with open(LOG, "a") as f:
            f.write(f"{i}\\n")
        time.sleep(0.2)
        return np.full(4, i)

if __name__ == "__main__":
    loader = cupy_nwt.DataLoader(Slow(), batch_size=4, num_workers=2, prefetch_factor=4, device="cpu",
                                 multiprocessing_context=sys.argv[2])
    for n, batch in enumerate(loader):
        if n == 0:
            print("pids", *loader.worker_pids(), flush=True)
        time.sleep(1.0)  # the training step: the workers run ahead, their queues fill
"""


def test_workers_of_a_killed_parent_start_no_more_samples(tmp_path, method):
    proc, log = start(tmp_path, QUEUED, method)
    pids = worker_pids(proc)
    try:
        wait_for(lambda: len(started(log)) >= 16, "the workers ran ahead", 60)
        rings = set().union(*(segments_of(p) for p in pids))
        proc.kill()
        proc.wait()
        at_kill = len(started(log))
        assert_nothing_left(pids, rings)
        # each worker may have been about to open one sample as the parent died; not a queue's worth
        assert len(started(log)) <= at_kill + len(pids)
    finally:
        cleanup(proc, pids)


def test_a_worker_stuck_in_a_sample_ends_when_its_parent_is_killed(tmp_path, method):
    proc, pids, rings, _ = stuck_setup(tmp_path, method)
    try:
        proc.kill()
        proc.wait()
        assert_nothing_left(pids, rings)
    finally:
        cleanup(proc, pids)
