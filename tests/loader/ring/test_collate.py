"""Collation rules: NumPy scalar fields (what ArrayDataset rows hold) stay strict on the fast path; str
and bytes are gathered as torch gathers them."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import MutableMapping, MutableSequence

import numpy as np
import pytest

from cupy_nwt import DataLoader
from cupy_nwt.errors import BatchLayoutError
from cupy_nwt.loader.ring.collate import default_collate


def test_numpy_scalar_fields_collate_to_their_own_dtype():
    samples = [(np.full((2, 2), i, np.uint8), np.int64(i), np.float32(i / 2)) for i in range(5)]
    images, labels, halves = default_collate(samples)
    assert images.shape == (5, 2, 2) and labels.dtype == np.int64 and halves.dtype == np.float32
    assert labels.tolist() == [0, 1, 2, 3, 4] and halves.tolist() == [0, 0.5, 1, 1.5, 2]


def test_a_numpy_scalar_of_another_dtype_is_named():
    samples = [(np.zeros(3, np.uint8), np.int64(i)) for i in range(6)]
    samples[4] = (samples[4][0], np.int32(4))
    with pytest.raises(BatchLayoutError, match=r"sample index 14, field \[1\].*int64.*int32") as info:
        default_collate(samples, indices=range(10, 16))
    assert info.value.sample_index == 14


@pytest.mark.parametrize("first", [True, False])
def test_an_int_too_large_for_int64_is_named_in_any_sample(first):
    """torch raises a ValueError for it; the first sample's was a bare OverflowError naming nothing."""
    samples = [(np.zeros(2), i) for i in range(3)]
    at = 0 if first else 2
    samples[at] = (samples[at][0], 2 ** 70)
    with pytest.raises(BatchLayoutError, match=rf"sample index {at + 5}") as info:
        default_collate(samples, indices=range(5, 8))
    assert info.value.sample_index == at + 5 and isinstance(info.value, ValueError)


Point = namedtuple("Point", "xy name")


def text_samples(i: int) -> list:
    return [(np.zeros(1), f"t{i}"), {"name": f"d{i}", "pair": [b"b%d" % i, i]}, Point(np.float32(i), f"p{i}"), f"s{i}"]


def test_str_and_bytes_are_gathered_as_torch_gathers_them():
    """A tuple inside a sequence (torch transposes the samples with zip), a list in a mapping or alone."""
    pair, mapping, point, alone = default_collate([text_samples(i) for i in range(3)])
    assert pair[1] == ("t0", "t1", "t2") and mapping["name"] == ["d0", "d1", "d2"]
    assert mapping["pair"][0] == (b"b0", b"b1", b"b2") and point.name == ("p0", "p1", "p2")
    assert default_collate([f"s{i}" for i in range(2)]) == ["s0", "s1"] and alone == ("s0", "s1", "s2")
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")

    def kinds(x):
        if isinstance(x, (np.ndarray, torch.Tensor)):
            return "array"
        if isinstance(x, dict):
            return {k: kinds(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields") and all(isinstance(v, (str, bytes)) for v in x):
            return (type(x), len(x))
        return [kinds(v) for v in x]

    samples = [text_samples(i) for i in range(3)]
    assert kinds(default_collate(samples)) == kinds(torch.utils.data.default_collate(samples))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_str_tuple_crosses_the_workers_as_a_tuple(num_workers):
    samples = [(np.full(2, i), f"name{i}") for i in range(6)]
    got = list(DataLoader(samples, batch_size=3, num_workers=num_workers, device="cpu"))
    assert [b[1] for b in got] == [("name0", "name1", "name2"), ("name3", "name4", "name5")]


class KeysInTurn:
    """Dict samples whose keys come in another order from sample to sample (records read from JSON), flat
    and nested: torch's collate looks each key up, so the order does not matter to the values."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        inner = {"a": i, "b": np.full(2, i)} if i % 2 == 0 else {"b": np.full(2, i), "a": i}
        return {"x": np.full(3, i, np.float32), "y": float(i), "m": inner} if i < 4 else \
            {"m": inner, "y": float(i), "x": np.full(3, i, np.float32)}


def _picture(batches) -> list:
    """Each batch's keys in order, outer and inner, and its values as lists."""
    return [(list(b), list(b["m"]), np.asarray(b["x"]).tolist(), np.asarray(b["y"]).tolist(),
             np.asarray(b["m"]["a"]).tolist(), np.asarray(b["m"]["b"]).tolist()) for b in batches]


@pytest.mark.usefixtures("worker_type")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dict_keys_in_another_order_collate_by_key_in_the_batch_s_first_samples_order(num_workers):
    """As torch's default_collate: values by key, each batch's keys in its first sample's order."""
    tud = pytest.importorskip("torch.utils.data", reason="torch's loader is the reference here")
    with DataLoader(KeysInTurn(), batch_size=2, num_workers=num_workers, device="cpu", output="numpy") as loader:
        got = _picture(loader)
    assert got == _picture(tud.DataLoader(KeysInTurn(), batch_size=2, num_workers=0))
    assert [keys for keys, *_ in got] == [["x", "y", "m"]] * 2 + [["m", "y", "x"]] * 2


class Record(MutableMapping):
    """A mapping keeping its items in an attribute, with no ``__copy__`` (requests' CaseInsensitiveDict is
    one): a shallow copy shares the items."""

    def __init__(self, items=()) -> None:
        self.items_ = dict(items)

    def __getitem__(self, key):
        return self.items_[key]

    def __setitem__(self, key, value) -> None:
        self.items_[key] = value

    def __delitem__(self, key) -> None:
        del self.items_[key]

    def __iter__(self):
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


class Row(MutableSequence):
    """The same for a sequence."""

    def __init__(self, items=()) -> None:
        self.items_ = list(items)

    def __getitem__(self, i):
        return self.items_[i]

    def __setitem__(self, i, value) -> None:
        self.items_[i] = value

    def __delitem__(self, i) -> None:
        del self.items_[i]

    def __len__(self) -> int:
        return len(self.items_)

    def insert(self, i, value) -> None:
        self.items_.insert(i, value)


class KeptRows:
    """A dataset holding its samples in memory, as one that caches them does."""

    def __init__(self, kind: type) -> None:
        self.rows = [kind({"x": np.full(2, i, np.float32), "y": i}) if kind is Record else
                     kind([np.full(2, i, np.float32), i]) for i in range(12)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]


@pytest.mark.usefixtures("worker_type")
@pytest.mark.parametrize("kind", [Record, Row])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_container_whose_copy_shares_its_items_is_batched_and_the_samples_kept(kind, num_workers):
    """Making the batch's container emptied the first sample itself (and the dataset's own row): every batch
    failed (a KeyError, or a structure error), and the dataset was left with empty rows."""
    data = KeptRows(kind)
    with DataLoader(data, batch_size=3, num_workers=num_workers, device="cpu", output="numpy") as loader:
        batches = [b for _ in range(2) for b in loader]
    assert [type(b) for b in batches] == [kind] * 8
    fields = [(b["x"], b["y"]) if kind is Record else (b[0], b[1]) for b in batches[:4]]
    got = [(np.asarray(x)[:, 0].tolist(), np.asarray(y).tolist()) for x, y in fields]
    assert got == [([3.0 * k, 3.0 * k + 1, 3.0 * k + 2], [3 * k, 3 * k + 1, 3 * k + 2]) for k in range(4)]
    assert all(len(row) == 2 for row in data.rows)


class SeriesRows:
    """Rows as pandas Series whose labels come in another order from row to row (read from differently
    ordered sources): stacked by position, column "a" would hold some rows' "b"."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        pd = pytest.importorskip("pandas")
        row = {"a": float(i), "b": -100.0 - i}
        return {"row": pd.Series(row if i % 2 == 0 else dict(reversed(row.items()))), "y": i}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_labelled_pandas_field_is_refused_as_torch_refuses_it(num_workers):
    pytest.importorskip("pandas")
    with pytest.raises(BatchLayoutError, match=r"sample index 0: a Series field is labelled \(pandas\)"):
        next(iter(DataLoader(SeriesRows(), batch_size=4, num_workers=num_workers, device="cpu")))


def test_a_torch_dataset_s_tensors_are_stacked_and_one_of_another_dtype_or_shape_is_named():
    """A torch dataset unchanged (a tensor and a 0-d label per sample) is stacked by torch into the batch's
    memory; a tensor of another dtype is an error naming its sample, never cast into the first's dtype."""
    torch = pytest.importorskip("torch", reason="the samples are torch tensors")

    class Tensors:
        def __init__(self, odd=None):
            self.odd = odd

        def __len__(self):
            return 8

        def __getitem__(self, i):
            image = torch.full((2, 3), float(i))
            if i == 5 and self.odd == "dtype":
                image = image.double()
            if i == 5 and self.odd == "shape":
                image = torch.zeros(3, 2)
            return image, torch.tensor(i)

    (images, labels), = [b for b in DataLoader(Tensors(), batch_size=8, device="cpu")]
    assert images.dtype == torch.float32 and images.shape == (8, 2, 3) and labels.tolist() == list(range(8))
    assert images[:, 0, 0].tolist() == [float(i) for i in range(8)]
    for odd, got in (("dtype", "dtype torch.float64|dtype float64"), ("shape", r"shape \(3, 2\)")):
        with pytest.raises(BatchLayoutError, match=rf"sample index 5, field \[0\]: expected .*got .*({got})"):
            list(DataLoader(Tensors(odd), batch_size=8, device="cpu"))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_conjugate_and_negative_tensor_views_are_batched_by_value_as_torch_batches_them(num_workers):
    """``x.conj()`` of a complex tensor is a lazy view NumPy cannot read; torch's loader stacks its values in
    the main process, so a dataset returning one gets the same batch here, in workers too, not a refusal."""
    torch = pytest.importorskip("torch", reason="the samples are torch tensors")
    tud = pytest.importorskip("torch.utils.data", reason="torch's loader is the reference here")

    class Conjugates(tud.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            z = torch.full((3,), complex(i, 1.0))
            return z.conj(), z.conj().imag  # the imaginary part of a conjugate view has the negative bit

    def batches(loader):
        return [(z.clone(), im.clone()) for z, im in loader]

    ours = batches(DataLoader(Conjugates(), batch_size=4, num_workers=num_workers, device="cpu"))
    theirs = batches(tud.DataLoader(Conjugates(), batch_size=4))  # torch 2.13's workers fail on these views
    assert len(ours) == len(theirs) == 2
    for (z, im), (tz, tim) in zip(ours, theirs):
        assert z.dtype == tz.dtype and torch.equal(z, tz) and torch.equal(im, tim)
        assert im[0, 0].item() == -1.0
