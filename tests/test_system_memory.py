"""What this process may still take: available memory and the headroom under every cgroup limit, asked by
whatever is about to hold many bytes (the ring, a synthetic set's build, a data file read whole, an open
search), so that a container's limit refuses in one line what its OOM killer would otherwise end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from cupy_nwt import system
from cupy_nwt.data import open_dataset
from cupy_nwt.data._synthetic import check_synthetic_room
from cupy_nwt.errors import ArgumentError, DataFileError
from cupy_nwt.nwt.footprint import search_memory_limit
from cupy_nwt.system import Room, memory_room

MiB = 2**20


# ---------------------------------------------------------------- cgroup limits, on made-up trees


def tree(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str], available_kib: int = 8 << 20) -> str:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal: 16777216 kB\nMemAvailable: {available_kib} kB\n")
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return str(tmp_path)


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNT = "35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory\n"


def test_cgroup_v2_the_tightest_limit_of_the_group_and_its_ancestors_bounds_the_ring(tmp_path):
    g = "sys/fs/cgroup/job.slice"
    root = tree(tmp_path, "0::/job.slice/step\n", V2_MOUNT, {
        f"{g}/memory.max": f"{1024 * MiB}\n", f"{g}/memory.current": f"{900 * MiB}\n",
        f"{g}/memory.stat": f"anon {700 * MiB}\nactive_file {100 * MiB}\ninactive_file {50 * MiB}\n",
        f"{g}/step/memory.max": "max\n", f"{g}/step/memory.current": f"{800 * MiB}\n",
    })
    room = memory_room(root)
    assert room.bytes == 1024 * MiB - (900 - 150) * MiB  # page cache counts as free: the kernel reclaims it
    assert room.bound.startswith(f"under the cgroup memory limit {root}/{g}/memory.max (1024.0 MiB")


def test_cgroup_v1_limit_and_a_container_whose_mount_root_is_its_own_group(tmp_path):
    mount = V1_MOUNT.replace(" / /sys", " /docker/abc /sys")  # no cgroup namespace: the mount shows the group
    root = tree(tmp_path, "4:memory:/docker/abc\n3:cpu:/docker/abc\n", mount, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{512 * MiB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{200 * MiB}\n",
        "sys/fs/cgroup/memory/memory.stat": f"total_inactive_file {40 * MiB}\ntotal_active_file 0\n",
    })
    assert memory_room(root).bytes == (512 - 160) * MiB


def test_no_cgroup_limit_leaves_available_memory_as_the_bound(tmp_path):
    root = tree(tmp_path, "4:memory:/x\n0::/\n", V1_MOUNT + V2_MOUNT, {
        "sys/fs/cgroup/memory/x/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/x/memory.usage_in_bytes": "4096\n", "sys/fs/cgroup/memory.max": "max\n",
    }, available_kib=3 << 20)
    room = memory_room(root)
    assert room.bytes == 3 << 30 and room.bound == "in available memory (MemAvailable)"


V1_CPU_MOUNT = "36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct\n"


@pytest.fixture
def node_of_64(monkeypatch):
    monkeypatch.setattr(system, "affinity_cpus", lambda: frozenset(range(64)))


def test_a_cpu_quota_on_the_job_s_group_or_an_ancestor_bounds_the_usable_cpus(tmp_path, node_of_64):
    """SLURM's cgroup/v2 puts the job's quota on the job's folder, not the mount's root (which was all that
    was read: a container given two of a node's 64 cores was searched at 64 workers)."""
    g = "sys/fs/cgroup/job_42"
    root = tree(tmp_path, "0::/job_42/step_0/user/task_0\n", V2_MOUNT, {
        f"{g}/cpu.max": "250000 100000\n", f"{g}/step_0/cpu.max": "max 100000\n",
        f"{g}/step_0/user/task_0/cpu.max": "max 100000\n",
    })
    assert system.usable_cpus(root) == 2  # 2.5 CPUs a period: two whole ones


@pytest.mark.parametrize(("quota", "cpus"), [("50000", 1), ("800000", 8), ("-1", 64)])
def test_a_cgroup_v1_cfs_quota_bounds_the_usable_cpus_and_half_a_core_is_one(tmp_path, node_of_64, quota, cpus):
    root = tree(tmp_path, "3:cpu,cpuacct:/docker/abc\n", V1_CPU_MOUNT, {
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": f"{quota}\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    assert system.usable_cpus(root) == cpus


def test_the_memory_limit_is_the_smallest_of_the_group_and_its_ancestors(tmp_path):
    g = "sys/fs/cgroup/job.slice"
    root = tree(tmp_path, "0::/job.slice/step\n", V2_MOUNT, {
        f"{g}/memory.max": f"{1024 * MiB}\n", f"{g}/step/memory.max": f"{4096 * MiB}\n",
    })
    assert system.memory_limit(root) == 1024 * MiB
    assert system.memory_limit(tree(tmp_path / "none", "0::/\n", V2_MOUNT, {"sys/fs/cgroup/memory.max": "max\n"})) is None


def test_info_shows_the_container_s_memory_not_the_host_s(monkeypatch):
    from cupy_nwt.system import host_info

    monkeypatch.setattr(system, "memory_limit", lambda root="/": 1024 * MiB)
    monkeypatch.setattr(system, "memory_room", lambda root="/": Room(700 * MiB, "under the cgroup memory limit x"))
    host = host_info()
    assert (host.memory_total_bytes, host.memory_available_bytes) == (1024 * MiB, 700 * MiB)


# ---------------------------------------------------------------- a container's limit bounds every big holder

LIMIT = Room(4 * MiB, "under the cgroup memory limit /sys/fs/cgroup/job/memory.max (64.0 MiB, 60.0 MiB in use)")


@pytest.fixture
def container(monkeypatch):
    """A machine with gigabytes available whose cgroup leaves 4 MiB: the limit, not MemAvailable, must bound."""
    monkeypatch.setattr(system, "available_memory", lambda root="/": 64 << 30)
    monkeypatch.setattr(system, "cgroup_rooms", lambda root="/": [LIMIT])


def test_a_synthetic_set_the_container_cannot_build_is_refused_naming_its_limit(container, tmp_path):
    with pytest.raises(ArgumentError, match=r"need at least .* of memory to build, more than the 4 MiB free "
                                            r"under the cgroup memory limit /sys/fs/cgroup/job/memory.max"):
        check_synthetic_room(50_000, cache_dir=tmp_path)


def test_a_data_file_the_container_cannot_read_whole_is_refused_naming_its_limit(container, tmp_path):
    path = tmp_path / "big.npz"
    np.savez(path, images=np.zeros((8, MiB), np.uint8), labels=np.zeros(8, np.int64))
    with pytest.raises(DataFileError, match=r"big.npz.*bytes free under the cgroup memory limit"):
        open_dataset(path)


def test_an_open_search_grows_a_loader_only_into_the_containers_room(container):
    own = psutil.Process().memory_info().rss
    assert search_memory_limit() < own + 64 * MiB  # its own memory plus half of 4 MiB, not half of what is available
