"""Mapping and sequence types other than dict, list, tuple and namedtuple, as torch's collate takes them.

A batch of ``OrderedDict``, ``UserDict`` (a tokenizer's output), list-subclass or ``range`` samples is
collated item by item and made again as the samples' type where that type can be made from its items;
a batch that carries more than its items (attributes, slots) crosses the ring as its items, its
attributes beside them, and comes back exactly as it left.
"""

from __future__ import annotations

from collections import OrderedDict, UserDict, UserList, deque
from collections.abc import Mapping

import numpy as np
import pytest

from cupy_nwt import DataLoader
from cupy_nwt.errors import BatchStructureError
from cupy_nwt.loader.ring.collate import default_collate
from cupy_nwt.loader.ring.tree import join, split


class Tagged(dict):
    pass


class Row(list):
    pass


class Pair(tuple):
    pass


class Encoding(UserDict):
    """Like transformers' BatchEncoding: a UserDict that may carry attributes beside its items."""

    def __init__(self, data=None, encodings=None) -> None:
        super().__init__(data)
        self.encodings = encodings


class Fields(UserDict):
    """A UserDict that holds nothing but its items."""


class Needs(dict):
    """A mapping whose constructor wants more than its items: torch copies the first sample instead."""

    def __init__(self, tag, *args) -> None:
        super().__init__(*args)
        self.tag = tag


class Slotted(list):
    __slots__ = ("note",)


@pytest.mark.parametrize("make, kind", [
    (lambda i: Tagged(a=i, b=np.float32(i)), Tagged),
    (lambda i: OrderedDict([("z", i), ("a", np.arange(2) + i)]), OrderedDict),
    (lambda i: Encoding({"ids": np.arange(3) + i}), Encoding),
    (lambda i: Row([i, np.full(2, i)]), Row),
    (lambda i: UserList([i, 2 * i]), UserList),
    (lambda i: deque([i, i + 1]), deque),
    (lambda i: Pair((i, "s%d" % i)), Pair),
    (lambda i: range(i, i + 2), list),
    (lambda i: Fields(a=i), Fields),
    (lambda i: Needs("t", {"a": i}), Needs),
])
def test_the_batch_has_the_samples_type_where_it_can_be_made_from_its_items(make, kind):
    samples = [make(i) for i in range(3)]
    batch = default_collate(samples)
    assert type(batch) is kind
    first = next(iter(batch.values() if hasattr(batch, "values") else batch))
    assert len(first) == 3


def test_items_collate_position_by_position_and_key_by_key():
    batch = default_collate([OrderedDict([("z", i), ("a", np.arange(2) + i)]) for i in range(3)])
    assert list(batch) == ["z", "a"] and batch["z"].tolist() == [0, 1, 2]
    assert batch["a"].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert [f.tolist() for f in default_collate([range(i, i + 2) for i in range(3)])] == [[0, 1, 2], [1, 2, 3]]
    assert default_collate([Pair((i, "s%d" % i)) for i in range(2)])[1] == ("s0", "s1")


def test_a_mutable_container_is_a_copy_of_the_batchs_first_sample_with_its_items():
    batch = default_collate([Needs(f"t{i}", {"a": i}) for i in range(3)])
    assert batch.tag == "t0" and batch["a"].tolist() == [0, 1, 2]
    batch = default_collate([Encoding({"ids": np.arange(2)}, encodings=[i]) for i in range(2)])
    assert batch.encodings == [0] and batch["ids"].tolist() == [[0, 1], [0, 1]]


def test_samples_of_two_mapping_types_with_one_structure_batch_as_the_first():
    batch = default_collate([{"a": 1}, OrderedDict(a=2), Tagged(a=3)])
    assert type(batch) is dict and batch["a"].tolist() == [1, 2, 3]


def test_a_sample_of_another_structure_is_named_with_its_type():
    with pytest.raises(BatchStructureError, match=r"sample index 1 has the structure Tagged\(\{'b': array\}\), "
                                                  r"expected Tagged\(\{'a': array\}\)"):
        default_collate([Tagged(a=1), Tagged(b=2)])


@pytest.mark.parametrize("kind", [Fields, Tagged, OrderedDict])
def test_a_container_of_items_only_crosses_as_arrays_and_comes_back_its_type(kind):
    batch = kind({"ids": np.zeros((2, 3)), "mask": np.ones((2, 3), np.int64)})
    treedef, arrays, objects = split(batch)
    assert len(arrays) == 2 and objects == []
    back = join(treedef, arrays, objects)
    assert type(back) is kind and list(back) == ["ids", "mask"] and back["mask"].sum() == 6


class Frozen(Mapping):
    """An immutable mapping that holds its items in an attribute, as a user's Mapping does."""

    def __init__(self, items) -> None:
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Stamped(Frozen):
    """An immutable mapping that holds more than what its items make: a fresh stamp each time it is made."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self.stamp = object()


@pytest.mark.parametrize("batch", [
    Encoding({"ids": np.zeros(2)}, encodings=["e0", "e1"]),
    Encoding({"ids": np.zeros(2)}),
    Needs("t", {"a": np.zeros(2)}),
    Slotted([np.zeros(2)]),
    Frozen({"a": np.zeros(2)}),
], ids=["attribute", "attribute-none", "constructor", "slots", "immutable"])
def test_a_container_with_more_than_its_items_crosses_as_arrays_and_comes_back_exact(batch):
    """Its items are ring arrays, so they are joined in the framework the loader gives like any field; its
    attributes travel beside them (a mutable one's emptied copy) or are made again by its constructor."""
    if isinstance(batch, Slotted):
        batch.note = "kept"
    treedef, arrays, objects = split(batch)
    assert len(arrays) == 1 and arrays[0] is next(iter(batch.values() if isinstance(batch, Mapping) else batch))
    assert len(objects) == (0 if isinstance(batch, Frozen) else 1)
    back = join(treedef, [np.ones(2)], objects)
    assert type(back) is type(batch) and len(back) == 1
    assert not isinstance(back, Mapping) or list(back) == list(batch)
    assert [np.asarray(v).tolist() for v in (back.values() if isinstance(back, Mapping) else back)] == [[1.0, 1.0]]
    own = {k: v for k, v in vars(batch).items() if k not in ("data", "_items")} if hasattr(batch, "__dict__") else {}
    assert {k: getattr(back, k) for k in own} == own
    assert getattr(back, "note", None) == getattr(batch, "note", None)


def test_a_container_its_items_do_not_make_again_travels_whole():
    batch = Stamped({"a": np.zeros(2)})
    treedef, arrays, objects = split(batch)
    assert arrays == [] and objects == [batch] and join(treedef, arrays, objects) is batch


class Texts:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return Encoding({"ids": np.full(3, i)}, encodings=[f"enc{i}"])


def with_encodings(samples):
    """A user's collate_fn: the batch carries each batch's own encodings, as a tokenizer's would."""
    return Encoding({"ids": np.stack([s["ids"] for s in samples])}, encodings=[e for s in samples for e in s.encodings])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_batch_keeps_its_own_attributes_through_the_workers(num_workers):
    got = list(DataLoader(Texts(), batch_size=2, num_workers=num_workers, collate_fn=with_encodings, device="cpu"))
    assert [b.encodings for b in got] == [[f"enc{i}", f"enc{i + 1}"] for i in range(0, 8, 2)]
    assert [b["ids"][:, 0].tolist() for b in got] == [[i, i + 1] for i in range(0, 8, 2)]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.usefixtures("worker_type")
def test_default_collate_of_user_dicts_through_the_workers(num_workers, persistent):
    """Each batch a copy of its first sample (its attributes included, as torch's default_collate makes
    it), in the workers' first batches and in those made into the ring after them, epoch after epoch."""
    with DataLoader(Texts(), batch_size=2, num_workers=num_workers, device="cpu",
                    persistent_workers=persistent and num_workers > 0) as loader:
        for _ in range(2):
            got = list(loader)
            assert [type(b) for b in got] == [Encoding] * 4
            assert [b["ids"][:, 0].tolist() for b in got] == [[i, i + 1] for i in range(0, 8, 2)]
            assert [b.encodings for b in got] == [[f"enc{i}"] for i in range(0, 8, 2)]


class Noted(UserDict):
    """Items only, except the samples the dataset gives a note."""


class SomeNoted:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        sample = Noted(x=np.full(2, i))
        if i in (4, 7):
            sample.note = f"note {i}"
        return sample


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_whose_first_sample_has_attributes_gets_them_as_under_torch(num_workers):
    """The first batch's layout holds the type with no attributes; batch 2 starts with a noted sample, so
    it is a copy of that sample (torch's rule), while batch 3's noted sample is not its first."""
    got = list(DataLoader(SomeNoted(), batch_size=2, num_workers=num_workers, device="cpu"))
    assert [type(b) for b in got] == [Noted] * 4
    assert [getattr(b, "note", None) for b in got] == [None, None, "note 4", None]
    assert [b["x"][:, 0].tolist() for b in got] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_container_with_attributes_gives_its_fields_in_the_framework_asked_for(num_workers):
    """A tokenizer's output in a torch loop: its fields were NumPy arrays, sent pickled inside the container."""
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    got = list(DataLoader(Texts(), batch_size=4, num_workers=num_workers, collate_fn=with_encodings, device="cpu",
                          output="torch"))
    assert [type(b["ids"]) for b in got] == [torch.Tensor] * 2
    assert [b["ids"][:, 0].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.encodings for b in got] == [[f"enc{i}" for i in range(4)], [f"enc{i}" for i in range(4, 8)]]
    frozen = DataLoader([Frozen({"x": np.full(2, i)}) for i in range(4)], batch_size=2, num_workers=num_workers,
                        device="cpu", output="torch")
    assert [(type(b), type(b["x"])) for b in frozen] == [(Frozen, torch.Tensor)] * 2
