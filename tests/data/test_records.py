"""pack_records: records back exactly as given, cheap to pickle, and shared by forked workers without copying.

The memory test forks a reader that takes every record in a shuffled order for three epochs and
reports its private memory (USS) after each: a list of dicts is copied page by page as reference
counts are written, the packed form is not. Bounds are generous and nothing is timed.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import pickletools
import random

import numpy as np
import psutil
import pytest

import cupy_nwt
from cupy_nwt.data.records import PackedRecords, pack_records

MB = 1 << 20


def _varied(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = ["", "a", "naïve", "日本語", "emoji 🙂", "x" * 300, "\x00nul", "tab\tnew\nline"]
    out = []
    for i in range(n):
        out.append({
            "id": i,
            "big": rng.choice([2 ** 62, -(2 ** 63), 0]),
            "score": rng.choice([0.0, -1.5, math.inf, 1e-300, rng.random()]),
            "flag": rng.random() < 0.5,
            "name": rng.choice(words),
            "raw": bytes(rng.randrange(256) for _ in range(rng.randrange(6))),
            "tags": [rng.randrange(-5, 5) for _ in range(rng.randrange(4))],
            "weights": tuple(rng.random() for _ in range(rng.randrange(3))),
            "nested": [[i], [i, i + 1], []] if i % 2 else [],
            "maybe": None if i % 3 == 0 else rng.random(),
            "pixels": np.full((2, rng.randrange(1, 4)), i % 256, dtype=np.uint8),
            "mixed": rng.choice([1, "one", 1.0, None, (1, "a")]),
        })
        if i % 5 == 0:
            del out[-1]["score"]
        if i % 7 == 0:
            out[-1]["rare"] = {"k": i}
    return out


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if type(x) is not type(y):
            return False
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or not np.array_equal(x, y):
                return False
        elif x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


def test_records_come_back_equal_with_their_types():
    records = _varied(500)
    packed = cupy_nwt.pack_records(records)
    assert isinstance(packed, PackedRecords) and len(packed) == 500
    for i, r in enumerate(records):
        assert _same(packed[i], r), i
    assert _same(packed[-1], records[-1]) and _same(packed[np.int64(3)], records[3])
    kinds = packed.kinds
    assert kinds["id"] == "int" and kinds["big"] == "int" and kinds["flag"] == "bool" and kinds["name"] == "str"
    assert kinds["raw"] == "bytes" and kinds["tags"] == "list[int]" and kinds["weights"] == "tuple[float]"
    assert kinds["maybe"] == "float" and kinds["pixels"] == "ndarray[uint8]"
    assert kinds["nested"] == kinds["mixed"] == kinds["rare"] == "pickled"  # still shared, decoded per read
    # an array read is a copy: changing it cannot change the dataset
    packed[1]["pixels"][:] = 99
    assert _same(packed[1], records[1])


def test_edges_of_the_types():
    records = [{"n": 2 ** 64, "s": "\ud800", "l": [1, 2.0], "e": []}, {"n": 1, "s": "", "l": [], "e": []}]
    packed = pack_records(records)
    assert packed.kinds["n"] == "pickled"  # beyond int64: kept exactly
    assert packed.kinds["l"] == "pickled"  # int and float mixed: types kept
    assert [packed[i] for i in range(2)] == records
    assert packed[0]["s"] == "\ud800" and packed[1]["e"] == []
    assert len(pack_records([])) == 0
    with pytest.raises(IndexError):
        packed[2]
    with pytest.raises(IndexError):
        packed[-3]
    with pytest.raises(TypeError, match="mappings"):
        pack_records([("a", 1)])


def test_pickles_as_raw_buffers_for_spawned_workers():
    records = [{"id": i, "name": f"item-{i}", "tags": [i, i + 1], "score": i / 3} for i in range(20_000)]
    packed = pack_records(records)
    blob = pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < 1.1 * packed.nbytes + 20_000  # the arrays' bytes, not an object per record
    # a few dozen pickle operations in all, where the list takes several per record
    assert sum(1 for _ in pickletools.genops(blob)) < 500
    assert sum(1 for _ in pickletools.genops(pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL))) > 100_000
    again = pickle.loads(blob)
    assert [again[i] for i in (0, 777, 19_999)] == [records[i] for i in (0, 777, 19_999)]


def test_a_pickle_cut_edited_or_of_another_layout_is_one_error_not_wrong_records(tmp_path):
    """Saved to a file and read back: arrays whose offsets no longer cut them in order, or a layout this version
    does not read, raise one DataError instead of records made of the wrong bytes."""
    records = [{"id": i, "name": f"r{i}", "pixels": np.full((2, 1 + i % 3), i, np.uint8)} for i in range(40)]
    path = tmp_path / "records.pkl"
    path.write_bytes(pickle.dumps(pack_records(records), protocol=pickle.HIGHEST_PROTOCOL))
    again = pickle.loads(path.read_bytes())
    assert again[0]["name"] == "r0" and again[39]["pixels"].shape == (2, 1)
    name_offsets = np.cumsum([0] + [len(r["name"]) for r in records], dtype=np.int64)  # where each name starts
    blob = path.read_bytes()
    assert blob.count(name_offsets[1:9].tobytes()) == 1
    edited = blob.replace(name_offsets[1:9].tobytes(), np.array([7, *name_offsets[2:9]], np.int64).tobytes())
    with pytest.raises(cupy_nwt.DataError, match=r"PackedRecords: the pickle is damaged.*key 'name'.*offsets") as exc:
        pickle.loads(edited)
    assert "\n" not in str(exc.value)
    state = pack_records(records).__getstate__()
    for changed in ({**state, "format": 99}, {k: v for k, v in state.items() if k != "_n"}):
        with pytest.raises(cupy_nwt.DataError, match="pack the records again"):
            PackedRecords.__new__(PackedRecords).__setstate__(changed)
    older = PackedRecords.__new__(PackedRecords)
    older.__setstate__({k: v for k, v in state.items() if k != "format"})  # the layout before the field: read
    assert older[7]["name"] == "r7"


def _read_epochs(dataset, epochs: int, conn) -> None:
    me = psutil.Process()
    order = list(range(len(dataset)))
    uss = [me.memory_full_info().uss]
    for epoch in range(epochs):
        random.Random(epoch).shuffle(order)
        for i in order:
            dataset[i]
        uss.append(me.memory_full_info().uss)
    conn.send(uss)
    conn.close()


def _worker_uss(dataset, epochs: int = 3) -> list[int]:
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_read_epochs, args=(dataset, epochs, there))
    p.start()
    there.close()
    try:
        return here.recv()
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
            p.join()


class _ListDataset:
    def __init__(self, records: list[dict]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict:
        return self.records[i]


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_forked_reader_does_not_copy_the_packed_records():
    records = [{"id": i, "label": i % 10, "score": i * 0.5, "name": f"sample-{i:07d}", "tags": [i % 7, i % 11]}
               for i in range(100_000)]
    packed = pack_records(records)
    plain = _worker_uss(_ListDataset(records))
    shared = _worker_uss(packed)
    plain_growth, packed_growth = plain[-1] - plain[0], shared[-1] - shared[0]
    assert packed_growth < 10 * MB, [u / MB for u in shared]
    assert plain_growth > packed_growth + 15 * MB, ([u / MB for u in plain], [u / MB for u in shared])
    # and it stops growing: the last two epochs add (almost) nothing
    assert shared[-1] - shared[1] < 2 * MB
