"""A machine without a /dev/shm mount (some VMs, minimal containers): the ring is anonymous shared memory and
needs none; where ``memfd_create`` is missing too (the /dev/shm fallback), one LoaderError that says so."""

from __future__ import annotations

import os

import pytest
from toy_data import Squares

import cupy_nwt.loader.ring.ring as shm
from cupy_nwt import DataLoader, LoaderError


def test_missing_dev_shm_does_not_matter_to_the_anonymous_ring(monkeypatch, tmp_path):
    missing = tmp_path / "no-shm-mount"
    monkeypatch.setattr(shm, "SHM_DIR", str(missing))
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cpu") as dl:
        got = [y.tolist() for _, y in dl]
    assert got == [list(range(b, b + 8)) for b in range(0, 64, 8)]
    assert not missing.exists()


def test_missing_dev_shm_is_a_loader_error_naming_it_and_the_bytes(monkeypatch, tmp_path):
    missing = tmp_path / "no-shm-mount"
    monkeypatch.setattr(shm, "SHM_DIR", str(missing))
    monkeypatch.delattr(os, "memfd_create")  # the fallback: a /dev/shm segment
    with DataLoader(Squares(64), batch_size=8, num_workers=2, device="cpu") as dl:
        with pytest.raises(LoaderError) as info:
            list(dl)
        assert dl.worker_pids() == []
    err = info.value
    assert isinstance(err, shm.ShmSpaceError)
    text = str(err)
    assert "\n" not in text
    assert f"{missing} does not exist (0 bytes free)" in text
    need = int(text.split("(")[1].split(" bytes")[0])
    assert need >= shm.HEADER_BYTES + 2 * shm.PAGE  # the header page and at least the slots' pages
    assert not missing.exists()  # nothing was created in its place


def test_full_dev_shm_names_free_and_needed_bytes(monkeypatch, tmp_path):
    import errno

    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(shm, "_shm_free", lambda: 12345)

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shm.os, "posix_fallocate", no_space)
    layout = shm.SlotLayout.for_batch((Squares(4)[0][0][None],), 8)
    with pytest.raises(LoaderError, match=rf"needs .* MiB of {tmp_path} \(\d+ bytes\) but only 0.0 MiB "
                                          r"\(12345 bytes\) are free"):
        shm.Ring(layout, 2)
    assert os.listdir(tmp_path) == []  # the half-made segment is gone
