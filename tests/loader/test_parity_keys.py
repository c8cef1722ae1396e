"""PyTorch's contract on what a sampler yields and on what a failing dataset raises: the same cases
on cupy_nwt's DataLoader and, where torch is installed, on PyTorch's (as ``test_parity.py`` does).

* Whatever object a sampler or batch sampler yields reaches ``__getitem__`` / ``__getitems__`` as it
  is: ints, NumPy ints, tuples, lists, strings. The datasets below return ``repr`` of the key they
  were given, so a changed key shows in the batch.
* An exception raised by the dataset, ``collate_fn`` or ``worker_init_fn`` reaches the caller as an
  instance of its own type (where that type can be built from a message): ``except KeyError``
  around the loop catches it with either loader; cupy_nwt's is a ``WorkerError`` too.
"""

from __future__ import annotations

import numpy as np
import pytest
from parity_backends import is_torch

import cupy_nwt

pytestmark = pytest.mark.usefixtures("worker_type")

try:
    import torch.utils.data as tud
except ImportError:
    tud = None

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:
    StatefulDataLoader = None

class Echo:
    """Sample for key k: ``repr(k)``; any key is valid."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, key):
        return repr(key)


class EchoMany(Echo):
    """``__getitems__`` names the type of the batch object it was given and each key in it."""

    def __getitems__(self, keys):
        return [f"{type(keys).__name__}:{k!r}" for k in keys]


class Table:
    """A dict-like dataset: string keys only."""

    def __init__(self) -> None:
        self.rows = {name: i for i, name in enumerate("abcdefgh")}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: str) -> str:
        return f"{key}={self.rows[key]}"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("kwargs", "want"), [
    ({"batch_size": None, "sampler": [[0, 1, 2], [3, 4]]}, ["[0, 1, 2]", "[3, 4]"]),
    ({"batch_size": None, "sampler": [(0, 1), "x", 7]}, ["(0, 1)", "'x'", "7"]),
    ({"batch_size": 2, "sampler": [(0, 1), (2, 3), (4, 5)]}, [["(0, 1)", "(2, 3)"], ["(4, 5)"]]),
    ({"batch_size": 2, "sampler": ["a", "b", "c"]}, [["'a'", "'b'"], ["'c'"]]),
    ({"batch_size": 2, "sampler": [np.int64(3), np.int32(1)]}, [[repr(np.int64(3)), repr(np.int32(1))]]),
    ({"batch_size": 2, "sampler": [3, 1, 4]}, [["3", "1"], ["4"]]),
    ({"batch_sampler": [[(0, 1), (2, 3)], [[4, 5]]]}, [["(0, 1)", "(2, 3)"], ["[4, 5]"]]),
], ids=["unbatched-lists", "unbatched-mixed", "tuples", "strings", "numpy-ints", "ints", "batch-sampler"])
def test_the_sampler_s_objects_reach_getitem_unchanged(backend, num_workers, kwargs, want):
    assert list(backend(Echo(), num_workers=num_workers, **kwargs)) == want


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_gets_the_batch_sampler_s_batch_as_it_is(backend, num_workers):
    loader = backend(EchoMany(), batch_sampler=[(1, 2), ["a", (0, 1)]], num_workers=num_workers)
    assert list(loader) == [["tuple:1", "tuple:2"], ["list:'a'", "list:(0, 1)"]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dict_like_dataset_takes_string_keys(backend, num_workers):
    got = list(backend(Table(), batch_size=3, sampler=list("hgfedcba"), num_workers=num_workers))
    assert got == [["h=7", "g=6", "f=5"], ["e=4", "d=3", "c=2"], ["b=1", "a=0"]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_string_key_is_named_in_the_error(num_workers):
    loader = cupy_nwt.DataLoader(Table(), batch_size=2, sampler=["a", "zz", "b"], num_workers=num_workers, device="cpu")
    with pytest.raises(KeyError) as ei:
        list(loader)
    assert isinstance(ei.value, cupy_nwt.WorkerError) and ei.value.sample_index == "zz"
    assert "failed on batch 0 at sample index 'zz'" in str(ei.value)


def stateful(backend):
    """The loader with ``state_dict()``: cupy_nwt's, or torchdata's beside torch's."""
    if is_torch(backend):
        if StatefulDataLoader is None:
            pytest.skip("torchdata is not installed")
        return StatefulDataLoader
    return backend


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_of_keys_resumes_by_position(backend, num_workers):
    """A plain list of keys has no ``state_dict()``: the loader resumes by how much was taken."""
    make = stateful(backend)
    keys = list("hgfedcba")
    whole = list(make(Table(), batch_size=2, sampler=keys, num_workers=num_workers))
    loader = make(Table(), batch_size=2, sampler=keys, num_workers=num_workers)
    it = iter(loader)
    head = [next(it), next(it)]
    state = loader.state_dict()
    del it
    again = make(Table(), batch_size=2, sampler=keys, num_workers=num_workers)
    again.load_state_dict(state)
    assert head + list(again) == whole and len(whole) == 4


# -- exceptions


class MyDataError(Exception):
    """A user's own exception class, built from a message as any plain subclass is."""


class NeedsTwo(Exception):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} ({code})")


class FailsAt:
    """Sample 5 raises ``kind``; the rest are their index."""

    def __init__(self, kind: type[Exception], n: int = 8) -> None:
        self.kind, self.n = kind, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == 5:
            raise self.kind("no sample 5") if self.kind is not NeedsTwo else NeedsTwo("no sample 5", 7)
        return i


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", [KeyError, NotImplementedError, MyDataError, IndexError, OSError],
                         ids=lambda k: k.__name__)
def test_the_dataset_s_exception_type_reaches_the_caller(backend, num_workers, kind, worker_type):
    it = iter(backend(FailsAt(kind), batch_size=2, num_workers=num_workers))
    assert [np.asarray(next(it)).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(kind) as ei:
        next(it)
    assert "no sample 5" in str(ei.value)
    assert [np.asarray(b).tolist() for b in it] == [[6, 7]]  # and iteration goes on
    if not is_torch(backend):
        err = ei.value
        assert isinstance(err, cupy_nwt.WorkerError) and isinstance(err, RuntimeError)
        assert err.batch_index == 2 and err.sample_index == 5 and err.exc_type == kind.__name__
        where = (f"the main process (pid {err.pid})" if num_workers == 0 else f"loader worker thread {err.worker_id}"
                 if worker_type == "thread" else f"loader worker {err.worker_id} (pid {err.pid})")
        assert f"{where} failed on batch 2 at sample index 5" in str(err)
        assert "Traceback (most recent call last)" in str(err) and "__getitem__" in str(err)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_type_that_needs_more_than_a_message_arrives_as_a_runtime_error(backend, num_workers):
    if is_torch(backend) and num_workers == 0:
        pytest.skip("torch raises the dataset's exception itself without workers")
    with pytest.raises(RuntimeError, match="no sample 5") as ei:
        list(backend(FailsAt(NeedsTwo), batch_size=2, num_workers=num_workers))
    if not is_torch(backend):
        assert type(ei.value) is cupy_nwt.WorkerError


def failing_collate(samples):
    raise MyDataError(f"cannot collate {len(samples)} samples")


def failing_init(worker_id):
    raise MyDataError(f"worker {worker_id} cannot start")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_fn_s_exception_type_reaches_the_caller(backend, num_workers):
    with pytest.raises(MyDataError, match="cannot collate 2 samples") as ei:
        next(iter(backend(FailsAt(KeyError), batch_size=2, num_workers=num_workers, collate_fn=failing_collate)))
    if not is_torch(backend):
        assert isinstance(ei.value, cupy_nwt.WorkerError) and ei.value.batch_index == 0
        assert "failing_collate" in str(ei.value)


def test_a_worker_init_fn_s_exception_type_reaches_the_caller(backend):
    with pytest.raises(MyDataError, match="cannot start") as ei:
        list(backend(FailsAt(KeyError), batch_size=2, num_workers=1, worker_init_fn=failing_init))
    if not is_torch(backend):
        assert isinstance(ei.value, cupy_nwt.WorkerError) and ei.value.worker_id == 0
        assert "failed on worker_init_fn" in str(ei.value) and "failing_init" in str(ei.value)


def failing_transform(batch, seed):
    raise NotImplementedError("no transform yet")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_transform_s_exception_type_reaches_the_caller(num_workers):
    loader = cupy_nwt.DataLoader(FailsAt(KeyError), batch_size=2, num_workers=num_workers, device="cpu",
                                 batch_transform=failing_transform)
    with pytest.raises(NotImplementedError, match="no transform yet") as ei:
        next(iter(loader))
    assert isinstance(ei.value, cupy_nwt.WorkerError) and "failing_transform" in str(ei.value)


def test_except_worker_error_still_catches_every_failure():
    loader = cupy_nwt.DataLoader(FailsAt(KeyError), batch_size=2, num_workers=0, device="cpu")
    caught = []
    for _ in range(2):
        try:
            list(loader)
        except cupy_nwt.WorkerError as err:
            caught.append(type(err))
    assert caught[0] is caught[1] and issubclass(caught[0], KeyError)


# -- an iterable dataset longer than its __len__


class LongerThanSaid(tud.IterableDataset if tud is not None else object):  # type: ignore[misc]
    """Says 3, yields 6 (every worker's replica yields them all)."""

    def __len__(self) -> int:
        return 3

    def __iter__(self):
        return iter(range(6))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_iterable_longer_than_its_len_warns_once_after_len_was_asked(backend, num_workers):
    import warnings  # noqa: PLC0415

    loader = backend(LongerThanSaid(), batch_size=None, num_workers=num_workers)
    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        assert len(list(loader)) == 6
    assert not [w for w in before if "was reported to be" in str(w.message)], "no warning before len(loader)"
    assert len(loader) == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(loader)) == 6
    said = [str(w.message) for w in caught if "was reported to be" in str(w.message)]
    assert said and said[0].startswith("Length of IterableDataset ") and "but 4 samples have been fetched" in said[0]
    assert ("For multiprocessing data-loading" in said[0]) == (num_workers > 0)
    if not is_torch(backend):
        assert len(said) == 1 and "cupy_nwt: warned once per epoch" in said[0]
