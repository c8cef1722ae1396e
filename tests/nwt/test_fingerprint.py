"""Fingerprints of machine and work, and the saved-result store (locking, atomicity, lookups)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_nwt import cuda
from cupy_nwt.picks.fingerprint import (
    Fingerprint,
    MachineFingerprint,
    WorkFingerprint,
    machine_fingerprint,
    sample_nbytes,
    transform_name,
    work_fingerprint,
)
from cupy_nwt.picks.store import ResultStore, read_json
from cupy_nwt.reporting.tables import write_json
from cupy_nwt.system import cache_dir

MACHINE = MachineFingerprint("Some CPU", 16, 128, "NVIDIA H100", "Gen5 x16")
WORK = WorkFingerprint(3072, 128, "cupy_nwt.data.transforms.CifarTrainTransform", 2, True, "cuda")


def fp(**work) -> Fingerprint:
    d = WORK.to_dict() | work
    return Fingerprint(MACHINE, WorkFingerprint(**d))


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "env"))
    assert cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert cache_dir() == tmp_path / "env"
    monkeypatch.delenv("CUPY_NWT_CACHE_DIR")
    assert cache_dir().name == "cupy_nwt"


def test_key_is_stable_and_sensitive_to_every_field():
    assert fp().key == fp().key == Fingerprint.from_dict(json.loads(json.dumps(fp().to_dict()))).key
    keys = {fp().key, fp(sample_bytes=3073).key, fp(batch_size=256).key, fp(transform=None).key,
            fp(prefetch_factor=4).key, fp(pin_memory=False).key, fp(device="cpu").key}
    assert len(keys) == 7
    other_machine = Fingerprint(MachineFingerprint("Some CPU", 8, 128, "NVIDIA H100", "Gen5 x16"), WORK)
    assert other_machine.key != fp().key


def test_similar_means_same_machine_and_work_but_a_close_sample_size():
    base = fp()
    assert base.similar_to(fp(sample_bytes=3600))
    assert not base.similar_to(fp(sample_bytes=4000))  # 1.30x apart
    assert not base.similar_to(fp(sample_bytes=3600, batch_size=64))
    other_machine = Fingerprint(MachineFingerprint("Other", 16, 128, None, None), WORK)
    assert not base.similar_to(other_machine)


def test_from_dict_rejects_garbage():
    with pytest.raises(ValueError, match="fingerprint"):
        Fingerprint.from_dict({"machine": {}})


def test_sample_nbytes_walks_the_structure():
    img = np.zeros((32, 32, 3), np.uint8)
    assert sample_nbytes((img, 7)) == 3072 + 8
    assert sample_nbytes({"x": img, "y": 1.5, "raw": b"abcd"}) == 3072 + 8 + 4
    assert sample_nbytes([np.zeros(4, np.float32), np.zeros(2, np.int16)]) == 20


class _Flip:
    def __call__(self, batch, seed):
        return batch


def _fn(batch, seed):
    return batch


def test_transform_name_names_class_or_function():
    assert transform_name(None) is None
    assert transform_name(_Flip()) == f"{__name__}._Flip"
    assert transform_name(_fn) == f"{__name__}._fn"


def test_work_fingerprint_reads_one_sample_and_resolves_device():
    data = [(np.zeros((32, 32, 3), np.uint8), 1)] * 3
    w = work_fingerprint(data, batch_size=64, batch_transform=_Flip(), prefetch_factor=3, pin_memory=False,
                         device="cpu")
    assert w == WorkFingerprint(3080, 64, f"{__name__}._Flip", 3, False, "cpu", dataset="builtins.list")
    auto = work_fingerprint(data, batch_size=64, device="auto")
    assert auto.device == ("cuda" if cuda.gpu_status().available else "cpu")
    with pytest.raises(ValueError, match="device"):
        work_fingerprint(data, batch_size=64, device="tpu")
    with pytest.raises(ValueError, match="empty"):
        work_fingerprint([], batch_size=64)


def test_machine_fingerprint_without_and_with_a_gpu(monkeypatch):
    m = machine_fingerprint()
    assert m.usable_cpus >= 1 and m.memory_gib >= 0 and m.cpu_model
    link = cuda.PcieLink(1, 16, 5, 16, "nvml")  # idling at Gen1: the key must use the maximum
    info = cuda.DeviceInfo(0, "NVIDIA H100 80GB HBM3", "9.0", 80 << 30, 3, 132, "0000:01:00.0", link)
    monkeypatch.setattr(cuda, "gpu_status", lambda: cuda.GpuStatus(True, None, 1))
    monkeypatch.setattr(cuda, "device_info", lambda i=0: info)
    g = machine_fingerprint()
    assert (g.gpu_name, g.pcie) == ("NVIDIA H100 80GB HBM3", "Gen5 x16")


def test_store_put_get_find_remove(tmp_path):
    store = ResultStore(tmp_path)
    assert store.records() == {} and store.find(fp()) is None and not store.remove("nope")
    rec = {"best_workers": 6, "fingerprint": fp().to_dict()}
    store.put(fp().key, rec)
    assert store.get(fp().key) == rec
    assert store.find(fp()) == rec
    near = {"best_workers": 9, "fingerprint": fp(sample_bytes=3300).to_dict()}
    store.put(fp(sample_bytes=3300).key, near)
    # exact match wins; otherwise the nearest similar sample size
    assert store.find(fp())["best_workers"] == 6
    assert store.find(fp(sample_bytes=3400))["best_workers"] == 9
    assert store.find(fp(sample_bytes=3400), similar=False) is None
    assert store.find(fp(sample_bytes=9000)) is None
    assert store.remove(fp().key)
    assert set(store.records()) == {fp(sample_bytes=3300).key}
    assert not list(tmp_path.glob("*.tmp"))


def test_store_sets_a_foreign_or_broken_file_aside(tmp_path, caplog):
    store = ResultStore(tmp_path)
    store.path.write_text("{not json")
    assert store.records() == {} and not store.path.exists()
    assert "not valid JSON" in caplog.text and len(list(tmp_path.glob("num_workers.json.bad-*"))) == 1
    store.path.write_text('{"some": "thing"}')
    with pytest.raises(ValueError, match="not a cupy_nwt.num_workers/1 file; set aside as num_workers.json.bad-"):
        store.records(strict=True)
    store.put("k", {})
    assert store.records() == {"k": {}}


def test_single_file_roundtrip_and_missing(tmp_path):
    p = write_json({"a": 1}, tmp_path / "sub" / "r.json")
    assert read_json(p) == {"a": 1}
    assert [x.name for x in (tmp_path / "sub").iterdir()] == ["r.json"]  # no lock or temporary left
    with pytest.raises(FileNotFoundError, match="no saved result"):
        read_json(tmp_path / "missing.json")


_WRITER = """
import sys
from cupy_nwt.picks.store import ResultStore
store = ResultStore(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.put(f"{sys.argv[2]}-{i}", {"writer": sys.argv[2], "i": i})
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), f"w{k}", "15"]) for k in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    records = ResultStore(tmp_path).records()
    assert set(records) == {f"w{k}-{i}" for k in range(4) for i in range(15)}
    assert not [p for p in Path(tmp_path).iterdir() if p.suffix == ".tmp"]


class _FirstUnreadable:
    """Rows of 12 bytes whose first ``bad`` samples raise, as a corrupt image would."""

    def __init__(self, bad: int, n: int = 20) -> None:
        self.bad, self.n = bad, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i < self.bad:
            raise OSError(f"sample {i} is corrupt")
        return np.zeros(3, np.float32)


def test_an_unreadable_first_sample_is_passed_over_and_recorded(caplog):
    clean = work_fingerprint(_FirstUnreadable(0), batch_size=8, device="cpu")
    assert clean.sized_by is None and clean.sample_bytes == 12
    old = dataclasses.replace(clean, dataset=None)  # as saved before the dataset was keyed
    assert Fingerprint(MACHINE, old).key == "59d3587adf356079"  # the key saved before sized_by existed
    with caplog.at_level("INFO", logger="cupy_nwt.tuner"):
        work = work_fingerprint(_FirstUnreadable(2), batch_size=8, device="cpu")
    assert (work.sample_bytes, work.sized_by) == (12, "sample 2")
    assert "samples 0..1 could not be read (OSError: sample 0 is corrupt); sample 2 sized the work" in caplog.text
    again = work_fingerprint(_FirstUnreadable(2), batch_size=8, device="cpu")
    assert Fingerprint(MACHINE, work).key == Fingerprint(MACHINE, again).key != Fingerprint(MACHINE, clean).key
    assert Fingerprint(MACHINE, work).similar_to(Fingerprint(MACHINE, clean))


def test_no_readable_sample_keys_by_the_datasets_type_and_length():
    work = work_fingerprint(_FirstUnreadable(20), batch_size=8, device="cpu")
    assert work.sample_bytes == 0
    assert work.sized_by == f"no sample (0..7 unreadable): {__name__}._FirstUnreadable of 20"
    back = Fingerprint.from_dict(json.loads(json.dumps(Fingerprint(MACHINE, work).to_dict())))
    assert back.work == work
    longer = work_fingerprint(_FirstUnreadable(30, n=30), batch_size=8, device="cpu")
    assert Fingerprint(MACHINE, longer).key != Fingerprint(MACHINE, work).key
