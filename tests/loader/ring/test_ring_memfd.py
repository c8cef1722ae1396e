"""The process ring in anonymous shared memory: made with the pool, handed to workers as they start, no name
in /dev/shm, freed with its last holder; memory (and cgroup limits) checked before it is promised; the
/dev/shm segment where ``memfd_create`` is missing, said once."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from toy_data import Squares

from cupy_nwt import DataLoader, RingMemoryError, ShmSpaceError
from cupy_nwt.loader.ring.memory import RingFile
from cupy_nwt.loader.ring.ring import SHM_DIR, Ring, SlotLayout, live_segments, segment_bytes
from cupy_nwt.system import available_memory

ROOT = Path(__file__).resolve().parents[3]
MiB = 2**20


def mapped_by(pid: int, name: str) -> bool:
    return f"/memfd:{name.removeprefix('memfd:')} " in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_get_the_ring_as_they_start_and_it_is_freed_with_the_loader(method):
    mine = os.getpid()
    dev_shm = set(os.listdir(SHM_DIR))
    with DataLoader(Squares(96), batch_size=8, num_workers=2, device="cpu", multiprocessing_context=method) as dl:
        it = iter(dl)
        labels = [next(it)[1].tolist(), next(it)[1].tolist()]  # in order: batch 0 from worker 0, 1 from worker 1
        (ring,) = live_segments(mine)
        assert ring.startswith("memfd:")
        assert segment_bytes(ring) == 4096 + 4 * dl.layout.slot_bytes
        pids = dl.worker_pids()
        assert len(pids) == 2 and all(mapped_by(pid, ring) for pid in pids)  # each has written into this file
        assert not {n for n in os.listdir(SHM_DIR) if n.startswith(f"cupy_nwt_{mine}_")} - dev_shm
        labels += [y.tolist() for _, y in it]
    assert labels == [list(range(b, b + 8)) for b in range(0, 96, 8)]
    assert live_segments(mine) == set()  # no descriptor, no mapping left anywhere: the kernel freed it


def test_a_ring_too_large_for_memory_is_refused_before_anything_is_allocated():
    layout = SlotLayout.for_batch((Squares(4)[0][0][None],), 8)
    # twice MemAvailable, whatever the cgroup says: other processes free memory while the test runs
    slots = 2 * available_memory() // layout.slot_bytes
    file = RingFile.create()
    assert file is not None
    try:
        with pytest.raises(RingMemoryError) as info:
            Ring(layout, slots, file=file)
        assert os.fstat(file.fd).st_size == 0  # not even promised
    finally:
        file.close()
    text = str(info.value)
    assert "\n" not in text and isinstance(info.value, ShmSpaceError)
    assert f"({4096 + slots * layout.slot_bytes} bytes) but only " in text
    assert "lower batch_size, num_workers or prefetch_factor" in text
    for kind in ({"shared": True}, {"shared": False}):  # the /dev/shm fallback and thread rings are checked too
        with pytest.raises(RingMemoryError):
            Ring(layout, slots, **kind)


def test_the_reserved_size_is_sealed_so_no_holder_can_cut_pages_from_another():
    layout = SlotLayout.for_batch((Squares(4)[0][0][None],), 8)
    file = RingFile.create()
    assert file is not None
    try:
        with Ring(layout, 2, file=file) as ring:
            file.settle()  # the pages are allocated on a thread beside the caller
            assert os.fstat(file.fd).st_blocks * 512 >= ring.nbytes  # every page allocated, not at first touch
            with pytest.raises(PermissionError):
                os.ftruncate(file.fd, 4096)
            with pytest.raises(PermissionError):
                os.ftruncate(file.fd, ring.nbytes * 2)
    finally:
        file.close()


def test_a_refused_allocation_is_a_ring_memory_error_once_settled(monkeypatch):
    def no_memory(fd, offset, length):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(os, "posix_fallocate", no_memory)
    layout = SlotLayout.for_batch((Squares(4)[0][0][None],), 8)
    file = RingFile.create()
    assert file is not None
    try:
        with Ring(layout, 2, file=file):  # the check passed: the pages are allocated beside the caller
            with pytest.raises(RingMemoryError, match=r"\(Cannot allocate memory\); lower batch_size"):
                file.settle()
            file.settle()  # said once
            assert not file.allocating
    finally:
        file.close()


# ---------------------------------------------------------------- where memfd_create is missing

FALLBACK = """
import logging, os, sys
sys.path.insert(0, {tests!r})
del os.memfd_create  # as on a system without it
from toy_data import Squares
from cupy_nwt import DataLoader
from cupy_nwt.system import available_memory
from cupy_nwt.loader.ring.ring import live_segments

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
    for _ in range(2):
        with DataLoader(Squares(48), batch_size=8, num_workers=2, device="cpu") as dl:
            it = iter(dl)
            next(it)
            print("RING", *sorted(live_segments(os.getpid())), flush=True)
            assert len(list(it)) == 5
    print("AFTER", *sorted(live_segments(os.getpid())), flush=True)
"""


def test_without_memfd_the_ring_is_a_dev_shm_segment_and_a_warning_says_so_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FALLBACK.format(tests=str(ROOT / "tests")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rings = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("RING")]
    assert len(rings) == 2 and all(len(r) == 1 and r[0].startswith("cupy_nwt_") for r in rings)  # /dev/shm names
    assert "AFTER" in out.stdout and out.stdout.split("AFTER")[1].split() == []  # unlinked with the loader
    said = [line for line in out.stderr.splitlines() if line.startswith("LOG ")]
    assert len(said) == 1 and "os.memfd_create is missing" in said[0] and "/dev/shm segment" in said[0]


def test_the_ring_cost_bench_times_each_kind_of_ring(tmp_path):
    out = tmp_path / "ring_cost.json"
    run = subprocess.Popen([sys.executable, str(ROOT / "bench" / "studies" / "does_the_ring_need_dev_shm" / "ring_cost.py"), "--rounds", "3", "--output", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    kinds = json.loads(out.read_text())["kinds"]
    assert set(kinds) == {"named", "memfd", "room"}
    assert all(k["wall_us_min"] > 0 and k["wall_us_median"] >= k["wall_us_min"] for k in kinds.values())
    assert live_segments(run.pid) == set()  # each ring it made, named or anonymous, is gone
