"""A worker count the machine cannot hold is refused in one line before any worker starts; one it can hold
is said in the too-many-workers warning, and shows progress while it starts when that takes a while.

The limits come from ``capacity.read_limits``: tests hand it a made-up /proc tree or replace it, so no
test starts thousands of processes.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from cupy_nwt import ArgumentError, DataLoader
from cupy_nwt.loader.workers import capacity
from cupy_nwt.loader.workers.capacity import Limits, StartProgress

GIB = 1 << 30


def limits(**kw):
    base = {"user_tasks_left": None, "pids_left": 30_000, "pids_bound": "32,768 (pid_max), 2,768 in use",
            "fds_left": 1_000_000, "memory_bytes": 20 * GIB, "memory_bound": "in available memory (MemAvailable)"}
    return Limits(**{**base, **kw})


def test_a_count_beyond_memory_is_refused_naming_what_bounds_it():
    with pytest.raises(ArgumentError) as exc:
        capacity.check_worker_count(5000, "spawn", 2, limits())
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("num_workers=5000 is more than this machine can hold about ")
    assert "bound by memory" in msg and "20.0 GiB free" in msg and "10,000 slots" in msg


@pytest.mark.parametrize(("kw", "bound"), [
    ({"fds_left": 1000}, "files"), ({"pids_left": 600}, "pids"), ({"user_tasks_left": 300}, "tasks")])
def test_each_limit_can_bound_the_count(kw, bound):
    cap = capacity.capacity("fork", 2, 400, limits(**kw))
    assert f"bound by {bound}" in cap.line and cap.workers < 400
    with pytest.raises(ArgumentError, match=f"bound by {bound}"):
        capacity.check_worker_count(400, "fork", 2, limits(**kw))


def test_a_count_that_fits_returns_its_line():
    line = capacity.check_worker_count(64, "forkserver", 2, limits()).line
    assert line.startswith("this machine can hold about ") and "started by forkserver" in line and "128 slots" in line


def test_threads_count_tasks_only():
    cap = capacity.capacity("thread", 2, 100, limits(fds_left=10, memory_bytes=1))
    assert cap.workers == 30_000


def _tree(tmp_path, *, pid_max="4096", cgroup_max="300", cgroup_used="20"):
    proc = tmp_path / "proc"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/pid_max").write_text(pid_max + "\n")
    (proc / "sys/kernel/threads-max").write_text("190000\n")
    (proc / "loadavg").write_text("0.10 0.20 0.30 1/96 4242\n")
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    (proc / "self/fd").mkdir(parents=True)
    for i in range(5):
        (proc / "self/fd" / str(i)).write_text("")
    (proc / "self/cgroup").write_text("0::/job\n")
    (proc / "self/mountinfo").write_text("")
    group = tmp_path / "sys/fs/cgroup/job"
    group.mkdir(parents=True)
    (group / "pids.max").write_text(cgroup_max + "\n")
    (group / "pids.current").write_text(cgroup_used + "\n")
    return str(tmp_path)


def test_the_limits_are_read_from_proc_and_the_cgroup(tmp_path):
    lim = capacity.read_limits(_tree(tmp_path))
    assert lim.pids_left == 280 and "pids.max" in lim.pids_bound
    assert lim.memory_bytes == 4_000_000 * 1024
    lim = capacity.read_limits(_tree(tmp_path / "b", cgroup_max="max"))
    assert lim.pids_left == 4096 - 96 and "pid_max" in lim.pids_bound


def test_the_loader_refuses_a_typo_before_starting_anything(monkeypatch):
    monkeypatch.setattr(capacity, "read_limits", lambda root="/": limits(pids_left=900))
    children = _children()
    with pytest.raises(ArgumentError, match=r"^num_workers=5000 is more than this machine can hold about 300 "):
        DataLoader(np.zeros((8, 2), np.float32), batch_size=2, num_workers=5000, multiprocessing_context="fork")
    assert _children() <= children


def _children() -> set[str]:
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return set(f.read().split())


def test_a_count_near_what_the_machine_can_hold_is_said_in_the_warning(monkeypatch):
    n = (os.cpu_count() or 1) + 1
    room = (2 * n - 1) * capacity.TASKS_PER_WORKER  # the machine holds fewer than twice the count
    monkeypatch.setattr(capacity, "read_limits", lambda root="/": limits(pids_left=room))
    with pytest.warns(UserWarning, match=f"this machine can hold about {2 * n - 1} loader workers"):
        loader = DataLoader(np.zeros((8, 2), np.float32), batch_size=2, num_workers=n, multiprocessing_context="fork")
    loader.close()


def test_a_count_far_below_what_the_machine_can_hold_gets_the_short_warning(monkeypatch):
    monkeypatch.setattr(capacity, "read_limits", lambda root="/": limits())
    n = (os.cpu_count() or 1) + 1
    with pytest.warns(UserWarning) as seen:
        loader = DataLoader(np.zeros((8, 2), np.float32), batch_size=2, num_workers=n, multiprocessing_context="fork")
    loader.close()
    (message,) = [str(w.message) for w in seen]
    assert message.startswith(f"This DataLoader will create {n} worker processes in total.")  # torch's, for filters
    assert "can hold" not in message and message.endswith(f"num_workers={n - 1} or fewer avoids that")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_quick_start_says_nothing():
    clock, out = Clock(), io.StringIO()
    with StartProgress(16, "fork", clock=clock, stream=out) as p:
        for _ in range(16):
            clock.t += 0.01
            p.started()
    assert out.getvalue() == ""


def test_a_slow_start_shows_its_progress_and_its_end():
    clock, out = Clock(), io.StringIO()
    with StartProgress(1000, "spawn", clock=clock, stream=out) as p:
        for _ in range(1000):
            clock.t += 1 / 64  # exact in binary: the 192nd worker starts at 3.0 s
            p.started()
    lines = out.getvalue().splitlines()
    assert lines[0] == "cupy_nwt: starting loader workers by spawn 192/1000"
    assert lines[-1] == "cupy_nwt: 1000 loader workers started in 15.6 s"
    assert 4 <= len(lines) <= 7  # a line every few seconds, not one a worker


AT_THE_TASK_LIMIT = """
import sys
import numpy as np
import cupy_nwt

class Rows:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(4, i, np.float32)

if __name__ == "__main__":
    group = sys.argv[1]
    with open(group + "/pids.current") as f:
        in_use = int(f.read())
    with open(group + "/pids.max", "w") as f:
        f.write(str(in_use))  # no room for another task (a thread of the script's that ends makes room for one)
    try:
        list(cupy_nwt.DataLoader(Rows(), batch_size=8, num_workers=2, device="cpu", worker_type=sys.argv[2]))
    except cupy_nwt.LoaderError as exc:
        print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_a_job_at_its_cgroup_s_task_limit_is_told_so_in_one_line(tmp_path, worker_type):
    """A container's pids.max (or a user's ulimit -u) reached by the workers: the loader's one line naming the
    limits, not fork's BlockingIOError or "can't start new thread" from one of its threads."""
    import subprocess
    import sys

    pids = "/sys/fs/cgroup/pids"
    if os.name != "posix" or not os.access(pids, os.W_OK) or not os.path.exists(f"{pids}/cgroup.procs"):
        pytest.skip("needs a writable cgroup v1 pids controller, as root")
    group = f"{pids}/cupy_nwt_test_{os.getpid()}_{worker_type}"
    os.mkdir(group)
    try:
        script = tmp_path / "job.py"
        script.write_text(AT_THE_TASK_LIMIT)
        run = subprocess.run(["bash", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "job", sys.executable,
                              str(script), group, worker_type], capture_output=True, text=True, timeout=120, check=False,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    finally:
        os.rmdir(group)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    said = run.stdout.strip()
    assert said.startswith("LoaderError no more processes or threads can start: loader worker")
    assert "pids.max" in said and "\n" not in said
