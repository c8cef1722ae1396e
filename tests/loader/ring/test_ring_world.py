"""The loader in the containers users run it in: a 64 MiB /dev/shm (Docker's default), an unusable one
(read-only, 4 KiB), and a scheduler SIGKILLing the whole process group mid-epoch.

Each case runs a user's script in a private mount namespace (``unshare -m``) with its own tmpfs on
/dev/shm, so the host's /dev/shm is never touched and what the script leaves there is seen before the
namespace goes. The pipeline is the one that fails with a /dev/shm ring: batches of 64 images of
3x224x224 float32 (38.5 MB), 2 workers, prefetch 2 (a 154 MB ring), on the host path and through the
GPU prefetcher (``test_prefetch``'s fake CUDA operations, imported from this folder: registered ring and
staging fallback).
Needs root and ``unshare``; skipped with the reason elsewhere.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests" / "loader" / "device"  # test_prefetch's fake CUDA operations
MOUNTS = {"64MiB": "size=64m", "unusable": "size=4k,ro"}
pytestmark = pytest.mark.slow  # a 154 MB ring per loader, 3 loaders a case: about 10 s a case on 2 busy CPUs

PIPELINE = """
import json, os, sys
sys.path[:0] = [{tests!r}, {toy_data!r}]
import numpy as np
from cupy_nwt import DataLoader
from cupy_nwt.loader import LoaderParts
from cupy_nwt.loader.ring.ring import live_segments, segment_bytes
from test_prefetch import LazyCuda

N = 3 * 64


class Images:
    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((3, 224, 224), i, np.float32), i


def epoch(method, ops=None):
    kw = dict(pin_memory=True, parts=LoaderParts(ops=ops)) if ops is not None else {{}}
    seen, ring = [], None
    with DataLoader(Images(), batch_size=64, num_workers=2, prefetch_factor=2, device="cpu" if ops is None else "cuda",
                    multiprocessing_context=method, **kw) as dl:
        for x, y in dl:
            if ops is not None:
                x, y = ops.consume((x, y))
            assert x.shape == (64, 3, 224, 224) and (x[:, 0, 0, 0] == y).all() and (x[:, 2, 223, 223] == y).all()
            seen += [int(v) for v in y]
            if ring is None:
                (ring,) = live_segments(os.getpid())
                ring = [ring, segment_bytes(ring)]
        pin = dl.pin_path if ops is not None else None
    return {{"complete": sorted(seen) == list(range(N)), "ring": ring, "pin_path": pin}}


if __name__ == "__main__":
    st = os.statvfs("/dev/shm")
    before = set(os.listdir("/dev/shm"))
    out = {{"dev_shm_bytes": st.f_blocks * st.f_frsize, "dev_shm_read_only": bool(st.f_flag & os.ST_RDONLY),
           "host": epoch(sys.argv[1]), "registered": epoch(sys.argv[1], LazyCuda()),
           "staging": epoch(sys.argv[1], LazyCuda(refuse_registration=True))}}
    out["new_in_dev_shm"] = sorted(set(os.listdir("/dev/shm")) - before)
    out["left"] = sorted(live_segments(os.getpid()))
    print(json.dumps(out))
"""

USER = """
import os, sys, time
{prelude}
import numpy as np
from cupy_nwt import DataLoader
from cupy_nwt.loader.ring.ring import live_segments


class SlowImages:
    def __len__(self):
        return 64 * 100

    def __getitem__(self, i):
        time.sleep(0.01)
        return np.full((3, 224, 224), i, np.float32), i


if __name__ == "__main__":
    loader = DataLoader(SlowImages(), batch_size=64, num_workers=2, prefetch_factor=2, device="cpu",
                        multiprocessing_context=sys.argv[1])
    for b, _ in enumerate(loader):
        if b == 1:
            print("pids", os.getpid(), *loader.worker_pids(), "rings", *live_segments(os.getpid()), flush=True)
"""

KILLER = """
import json, os, signal, subprocess, sys, time
import psutil
from cupy_nwt.loader.ring.ring import live_segments


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    before = set(os.listdir("/dev/shm"))
    user = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = user.stdout.readline().split()
    os.killpg(user.pid, signal.SIGKILL)  # docker kill, a job's time limit: every process of the group at once
    user.wait()
    main, workers = int(line[1]), [int(p) for p in line[2:line.index("rings")]]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"rings_mid_epoch": line[line.index("rings") + 1:], "workers": workers,
                      "alive": [p for p in workers if alive(p)], "rings_left": sorted(live_segments(main)),
                      "new_in_dev_shm": sorted(set(os.listdir("/dev/shm")) - before), "main": main}))
"""


@functools.cache
def namespace_problem() -> str | None:
    """Why a private mount namespace with its own /dev/shm cannot be had here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs on /dev/shm in a private mount namespace"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "-m", "--", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /dev/shm"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m cannot mount here: {probe.stderr.strip()[:200]}"


@pytest.fixture
def world():
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)


def in_namespace(options: str, script: Path, *args: str, timeout: float = 240) -> dict:
    """Run ``script`` in a private mount namespace whose /dev/shm is a fresh tmpfs mounted with ``options``."""
    shell = f'mount -t tmpfs -o {options} tmpfs /dev/shm && exec "$0" "$@"'
    out = subprocess.run(["unshare", "-m", "--", "sh", "-c", shell, sys.executable, str(script), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=script.parent,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.usefixtures("world")
@pytest.mark.parametrize("mount", list(MOUNTS))
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_full_epoch_of_imagenet_batches_with_a_small_or_unusable_dev_shm(tmp_path, mount, method):
    script = tmp_path / "train.py"
    script.write_text(PIPELINE.format(tests=str(TESTS), toy_data=str(ROOT / "tests")))
    got = in_namespace(MOUNTS[mount], script, method)
    if mount == "64MiB":
        assert got["dev_shm_bytes"] == 64 * 2**20 and not got["dev_shm_read_only"]
    else:
        assert got["dev_shm_read_only"]
    for path in ("host", "registered", "staging"):
        run = got[path]
        assert run["complete"], path
        name, nbytes = run["ring"]
        assert name.startswith("memfd:") and nbytes > 150e6  # the 154 MB ring, over twice the 64 MiB
    assert got["registered"]["pin_path"] == "registered" and got["staging"]["pin_path"] == "staging"
    assert got["new_in_dev_shm"] == [] and got["left"] == []


@pytest.mark.usefixtures("world")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_sigkill_to_the_process_group_mid_epoch_leaves_no_ring_and_no_worker(tmp_path, method):
    (tmp_path / "user.py").write_text(USER.format(prelude=""))
    (tmp_path / "killer.py").write_text(KILLER)
    got = in_namespace(MOUNTS["64MiB"], tmp_path / "killer.py", str(tmp_path / "user.py"), method)
    assert len(got["workers"]) == 2 and got["alive"] == []
    assert [r for r in got["rings_mid_epoch"] if r.startswith("memfd:")], got  # the ring existed, in memory
    assert got["rings_left"] == [] and got["new_in_dev_shm"] == []


@pytest.mark.usefixtures("world")
def test_the_dev_shm_fallback_is_what_such_a_kill_leaves_behind(tmp_path):
    """Where memfd_create is missing, the segment outlives a SIGKILLed group (the resource tracker dies too)."""
    (tmp_path / "user.py").write_text(USER.format(prelude="del os.memfd_create"))
    (tmp_path / "killer.py").write_text(KILLER)
    got = in_namespace("size=512m", tmp_path / "killer.py", str(tmp_path / "user.py"), "fork")
    assert got["alive"] == []
    assert got["new_in_dev_shm"] == got["rings_mid_epoch"] and got["new_in_dev_shm"][0].startswith(
        f"cupy_nwt_{got['main']}_")


# ---------------------------------------------------------------- a real cgroup limit (v1 here, v2 where mounted)

LIMITED = """
import json, sys
import numpy as np
from cupy_nwt import DataLoader, RingMemoryError


class Images:
    def __len__(self):
        return 64 * 4

    def __getitem__(self, i):
        return np.full((3, 64, 64), i, np.float32), i


if __name__ == "__main__":
    # 48 slots of 64 images of 3x64x64 float32: a 151 MB ring, over the group's whole 128 MiB
    loader = DataLoader(Images(), batch_size=64, num_workers=2, prefetch_factor=24, device="cpu")
    try:
        next(iter(loader))
        print(json.dumps({"error": None}))
    except RingMemoryError as exc:
        print(json.dumps({"error": str(exc), "workers": loader.worker_pids()}))
"""


def own_memory_cgroup() -> tuple[Path, str] | None:
    """This process's memory cgroup folder and its limit file's name, where a child group may be made in it."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the memory controller must be delegated to the children
            folder, limit = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
            subtree = folder / "cgroup.subtree_control"
            usable = subtree.exists() and "memory" in subtree.read_text().split()
        elif "memory" in controllers.split(","):
            folder, limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
            usable = (folder / limit).exists()
        else:
            continue
        if usable and os.access(folder, os.W_OK):
            return folder, limit
    return None


@pytest.fixture
def limited_group():
    found = own_memory_cgroup()
    if found is None:
        pytest.skip("needs root and a memory cgroup (v1, or v2 with the memory controller delegated) it may write")
    parent, limit = found
    group = parent / f"cupy_nwt_test_{os.getpid()}"
    group.mkdir()
    try:
        (group / limit).write_text(str(128 * 2**20))
        yield group, limit
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # its last process is still leaving
                time.sleep(0.1)


def test_a_ring_over_the_cgroup_limit_is_refused_in_one_line_before_any_worker_writes(tmp_path, limited_group):
    group, limit = limited_group
    script = tmp_path / "train.py"
    script.write_text(LIMITED)
    shell = f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"'
    out = subprocess.run(["sh", "-c", shell, sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["error"] is not None and got["workers"] == []
    assert "\n" not in got["error"] and "lower batch_size, num_workers or prefetch_factor" in got["error"]
    assert f"under the cgroup memory limit {group / limit} (128.0 MiB, " in got["error"]
