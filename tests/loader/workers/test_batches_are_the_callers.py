"""A batch a worker hands over is the caller's: editing it in the loop edits neither the dataset nor a
later batch, and a buffer ``collate_fn`` reuses never shows through. Process workers get this from their
pipe; thread workers, which share the dataset's memory, copy what a pipe would (``workers.thread``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cupy_nwt import DataLoader

pytestmark = pytest.mark.usefixtures("worker_type")


class Table:
    """An in-memory map-style dataset: each sample is a row of one array (a view, as indexing gives)."""

    def __init__(self, rows: int = 8, width: int = 4) -> None:
        self.data = np.arange(rows * width, dtype=np.float32).reshape(rows, width)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[i]


class Ragged(Table):
    """Samples of different lengths with their tags: every batch is made outside the ring."""

    def __getitem__(self, i: int) -> dict:
        return {"x": self.data[i, : 1 + i % 4], "tags": self.tags[i]}

    def __init__(self) -> None:
        super().__init__()
        self.tags = [["a", str(i)] for i in range(len(self.data))]


def normalise_in_place(loader: DataLoader) -> list[float]:
    firsts = []
    for x in loader:
        firsts.append(float(np.asarray(x).reshape(-1)[0]))
        x -= 1000  # as a training step's in-place normalisation
    return firsts


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_an_in_place_edit_of_a_sample_in_the_loop_leaves_the_dataset_and_the_next_epoch_alone(persistent_workers):
    ds = Table()
    loader = DataLoader(ds, batch_size=None, num_workers=2, device="cpu", persistent_workers=persistent_workers)
    first = normalise_in_place(loader)
    second = normalise_in_place(loader)
    loader.close()
    assert np.array_equal(ds.data, Table().data)
    assert first == second == [float(4 * i) for i in range(8)]


def test_edits_of_ragged_batches_and_their_tags_stay_in_the_loop():
    ds = Ragged()

    def pad(samples):
        out = np.zeros((len(samples), 4), np.float32)
        for row, s in zip(out, samples):
            row[: len(s["x"])] = s["x"]
        return {"x": out, "tags": [s["tags"] for s in samples], "parts": [s["x"] for s in samples]}

    loader = DataLoader(ds, batch_size=3, num_workers=2, device="cpu", collate_fn=pad)
    for _ in range(3):
        for batch in loader:
            for part in batch["parts"]:
                part += 1
            for tags in batch["tags"]:
                tags.append("seen")
    loader.close()
    fresh = Ragged()
    assert np.array_equal(ds.data, fresh.data)
    assert ds.tags == fresh.tags


_local = threading.local()


def collate_into_buffer(samples):
    """A collate_fn that fills one buffer of its worker's again and again, as allocation-shy code does."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) != len(samples):
        buf = _local.buf = np.empty((len(samples), 4), np.float32)
    np.stack(samples, out=buf)
    return buf


def test_a_collate_fn_that_reuses_its_buffer_still_gives_every_batch_its_own_samples():
    loader = DataLoader(Table(rows=64), batch_size=8, num_workers=2, device="cpu", collate_fn=collate_into_buffer)
    kept = list(loader)
    read_in_the_loop = [float(b[0, 0]) for b in loader]
    loader.close()
    expected = [float(4 * i) for i in range(0, 64, 8)]
    assert [float(b[0, 0]) for b in kept] == expected
    assert read_in_the_loop == expected


class Readings:
    """Masked arrays, as sensor data marks missing values: the mask is part of the sample."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> np.ma.MaskedArray:
        return np.ma.masked_array([1.0, -999.0, 3.0 + i], mask=[False, True, False])


def test_a_sample_of_an_array_subclass_keeps_its_class_and_its_mask():
    loader = DataLoader(Readings(), batch_size=None, num_workers=2, device="cpu", output="numpy")
    got = list(loader)
    loader.close()
    assert [type(x) for x in got] == [np.ma.MaskedArray] * 4
    assert [float(x.mean()) for x in got] == [2.0 + i / 2 for i in range(4)]
