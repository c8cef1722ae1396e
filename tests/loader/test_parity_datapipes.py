"""torch DataPipes (``torch.utils.data.datapipes``, still shipped with torch 2.x) through both loaders.

torch's loader applies its ``shuffle`` to the pipe's shufflers, seeds them alike in every reader,
and sets the pipe's ``sharding_filter`` to each worker's (and rank's) share: each element comes
once. The same cases run on cupy_nwt's loader and on torch's, as ``test_parity.py`` does.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import cupy_nwt

tud = pytest.importorskip("torch.utils.data", reason="DataPipes are torch's: torch is not installed")
IterableWrapper = pytest.importorskip("torch.utils.data.datapipes.iter").IterableWrapper
from slow_pipes import SlowToScan  # noqa: E402 - torch is there: the lines above skip without it

pytestmark = pytest.mark.usefixtures("worker_type")
N = 20


def pipe(shuffler: bool = True):
    dp = IterableWrapper(range(N))
    return (dp.shuffle() if shuffler else dp).sharding_filter()


def elements(loader) -> list[int]:
    return [int(x) for b in loader for x in np.asarray(b).reshape(-1)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_false_turns_the_pipe_s_shuffler_off_and_each_element_comes_once(backend, num_workers):
    assert elements(backend(pipe(), batch_size=None, num_workers=num_workers, shuffle=False)) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_true_is_applied_and_each_element_comes_once(backend, num_workers):
    got = elements(backend(pipe(), batch_size=None, num_workers=num_workers, shuffle=True))
    assert sorted(got) == list(range(N)) and got != list(range(N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_pipe_s_own_shuffler_and_batches_split_over_workers(backend, num_workers):
    batches = [np.asarray(b).tolist() for b in backend(pipe(), batch_size=3, num_workers=num_workers)]
    assert sorted(x for b in batches for x in b) == list(range(N))
    assert [len(b) for b in batches] == ([3] * 6 + [2] if num_workers == 0 else [3] * 6 + [1, 1])


def test_shuffle_true_on_a_pipe_without_a_shuffler_adds_one(backend):
    """torch 2.13 warns that it adds a shuffler, then loads from the pipe it was given (its local
    variable gets the new graph after ``self.dataset`` was set): unshuffled. cupy_nwt loads from the
    graph torch's ``apply_shuffle_settings`` returns, as the warning says. Each element once on both."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = backend(pipe(shuffler=False), batch_size=None, num_workers=2, shuffle=True)
    assert any("does not contain a `Shuffler`" in str(w.message) for w in caught)
    got = elements(loader)
    assert sorted(got) == list(range(N))
    assert (got == list(range(N))) == (backend is tud.DataLoader)


def test_persistent_workers_reshuffle_each_epoch_and_a_seed_repeats_them():
    def epochs(seed):
        loader = cupy_nwt.DataLoader(pipe(), batch_size=None, num_workers=2, persistent_workers=True, seed=seed,
                                     device="cpu")
        with loader:
            return [elements(loader) for _ in range(2)]

    first, second = epochs(3)
    assert sorted(first) == sorted(second) == list(range(N)) and first != second
    assert epochs(3) == [first, second]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_and_workers_share_the_pipe_each_element_once(num_workers):
    """torch numbers the readers worker-major (worker w of rank r is w * world_size + r); both ranks
    shuffle alike (one seed), so their shares are disjoint every epoch."""
    def rank(r):
        loader = cupy_nwt.DataLoader(pipe(), batch_size=None, num_workers=num_workers, seed=5, rank=r, world_size=2,
                                     device="cpu")
        return [elements(loader) for _ in range(2)]

    a, b = rank(0), rank(1)
    for epoch in range(2):
        assert sorted(a[epoch] + b[epoch]) == list(range(N)) and len(a[epoch]) == len(b[epoch]) == N // 2
    assert a[0] != a[1]


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_the_same_torch_manual_seed_before_two_epochs_gives_the_same_order(backend, num_workers, persistent):
    """PyTorch's ``test_shuffler_iterdatapipe``: without ``seed`` or ``generator`` the loader draws the
    pipe's shared seed from torch's default generator at each ``iter()``."""
    import torch

    loader = backend(pipe(), batch_size=None, num_workers=num_workers, shuffle=True,
                     persistent_workers=persistent)
    runs = []
    for seed in (123, 123, 321):
        torch.manual_seed(seed)
        runs.append(elements(loader))
    assert runs[0] == runs[1] and sorted(runs[0]) == list(range(N))
    assert runs[2] != runs[0] and sorted(runs[2]) == list(range(N))


@pytest.mark.parametrize("num_workers", [2, 4])
def test_readers_that_shard_their_pipes_at_once_each_get_their_share(backend, num_workers):
    """torch walks a pipe's graph through a hook set on the pipe classes, one for the whole process:
    thread workers walking their copies at once must not cross (one would fail, or walk without the hook
    and miss its sharding filter, reading every element)."""
    dp = SlowToScan(IterableWrapper(range(N)).sharding_filter())
    for _ in range(2):
        assert sorted(elements(backend(dp, batch_size=None, num_workers=num_workers))) == list(range(N))


def test_workers_started_while_another_loader_shards_its_pipe_get_the_whole_pipe():
    """Two loaders iterated at once from two threads of one program. A thread worker's copy of the pipe
    goes through the pipe classes' pickling hooks, which the other loader's walk sets for the whole
    process meanwhile (a copy then is a stub); a worker forked then inherits the hooks set, and its own
    walk fails."""
    def epochs(results: list) -> None:
        for _ in range(4):
            loader = cupy_nwt.DataLoader(SlowToScan(IterableWrapper(range(N)).sharding_filter()), batch_size=None,
                                         num_workers=2, device="cpu")
            results.append(sorted(elements(loader)))

    beside: list = []
    other = threading.Thread(target=epochs, args=(beside,))
    other.start()
    mine: list = []
    epochs(mine)
    other.join()
    assert mine == beside == [list(range(N))] * 4
