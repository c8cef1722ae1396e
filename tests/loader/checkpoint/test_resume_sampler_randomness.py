"""torch's random samplers keep no state of their own, yet a training script resumed from a checkpoint must
get the rest of the saved epoch: each drew its epoch from its ``generator`` (or torch's global one), and
the state of that generator is saved and drawn from again (``cupy_nwt.loader.checkpoint.sampler_randomness``).
torchdata 0.11's StatefulDataLoader repeats and loses samples in these cases, so the uninterrupted run is the
reference here."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from cupy_nwt.errors import StateError
from cupy_nwt.loader import DataLoader

torch = pytest.importorskip("torch", reason="torch's samplers are the case")
tud = pytest.importorskip("torch.utils.data", reason="torch's samplers are the case")

pytestmark = pytest.mark.usefixtures("worker_type")

N = 10


def _td_random(generator: Any) -> Any:
    sampler = pytest.importorskip("torchdata.stateful_dataloader.sampler", reason="torchdata's sampler is the case")
    return sampler.RandomSampler(range(N), generator=generator)


def _seeded() -> Any:
    return torch.Generator().manual_seed(1)


SAMPLERS: dict[str, Callable[[], dict[str, Any]]] = {
    "RandomSampler(generator)": lambda: {"sampler": tud.RandomSampler(range(N), generator=_seeded()), "batch_size": 3},
    "RandomSampler()": lambda: {"sampler": tud.RandomSampler(range(N)), "batch_size": 3},
    "SubsetRandomSampler()": lambda: {"sampler": tud.SubsetRandomSampler(list(range(N))), "batch_size": 3},
    "WeightedRandomSampler(generator)": lambda: {
        "sampler": tud.WeightedRandomSampler([1.0] * N, N, replacement=False, generator=_seeded()), "batch_size": 3},
    "BatchSampler(RandomSampler(generator))": lambda: {
        "batch_sampler": tud.BatchSampler(tud.RandomSampler(range(N), generator=_seeded()), 3, False)},
    "BatchSampler(torchdata RandomSampler)": lambda: {"batch_sampler": tud.BatchSampler(_td_random(_seeded()), 3, False)},
}

OWN_GENERATOR = {k for k in SAMPLERS if "generator" in k or "torchdata" in k}


def ids(batches: Any) -> list[list[int]]:
    return [b.tolist() for b in batches]


def loader(kind: str, num_workers: int) -> DataLoader:
    return DataLoader(list(range(N)), num_workers=num_workers, device="cpu", **SAMPLERS[kind]())


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 3])
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_a_script_resumed_in_its_second_epoch_gets_the_rest_of_it_and_the_next_as_uninterrupted(kind, stop, num_workers):
    torch.manual_seed(7)
    dl = loader(kind, num_workers)
    whole = [ids(dl) for _ in range(3)]
    dl.close()

    torch.manual_seed(7)  # the first run: one epoch, part of the next, a checkpoint, then it is killed
    dl = loader(kind, num_workers)
    assert ids(dl) == whole[0]
    it = iter(dl)
    head = [next(it).tolist() for _ in range(stop)]
    saved = json.dumps(dl.state_dict())
    it.close()
    dl.close()

    torch.manual_seed(7)  # the resumed script seeds as it did, builds its sampler anew and loads the checkpoint
    again = loader(kind, num_workers)
    again.load_state_dict(json.loads(saved))
    rest = ids(again)
    if stop == 0 and kind not in OWN_GENERATOR:  # nothing delivered: its lent generator's seed is drawn anew
        assert sorted(sum(rest, [])) == list(range(N))
    else:
        assert head + rest == whole[1]
    after = ids(again)
    if kind in OWN_GENERATOR:  # the sampler's generator goes on as in the uninterrupted run
        assert after == whole[2]
    else:  # torch's global one is the script's, left as the script has it: another order of every sample
        assert sorted(sum(after, [])) == list(range(N))
    again.close()


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_a_checkpoint_taken_between_epochs_resumes_the_next_epoch_as_uninterrupted(kind):
    torch.manual_seed(3)
    dl = loader(kind, 0)
    whole = [ids(dl) for _ in range(2)]
    dl.close()
    torch.manual_seed(3)
    dl = loader(kind, 0)
    ids(dl)
    saved = json.dumps(dl.state_dict())
    dl.close()
    torch.manual_seed(3)
    again = loader(kind, 0)
    again.load_state_dict(json.loads(saved))
    if kind in OWN_GENERATOR:
        assert ids(again) == whole[1]
    else:  # given no generator: the next epoch's seed is drawn when it begins, here from the resumed script's
        assert sorted(sum(ids(again), [])) == list(range(N))
    again.close()


@pytest.mark.parametrize("mid_epoch", [True, False])
def test_a_mid_epoch_state_saved_before_the_sampler_s_randomness_was_kept_says_its_order_is_lost(mid_epoch):
    dl = loader("RandomSampler(generator)", 0)
    it = iter(dl)
    if mid_epoch:
        next(it)
    saved = dl.state_dict()
    it.close()
    dl.close()
    old = {k: v for k, v in saved.items() if k != "sampler_randomness"}  # as an earlier cupy_nwt saved it
    again = loader("RandomSampler(generator)", 0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again.load_state_dict(old)
        again.load_state_dict(saved)  # this version's state: no warning
    said = [w for w in seen if "sampler_randomness" in str(w.message) or "drawn afresh" in str(w.message)]
    assert len(said) == (1 if mid_epoch else 0)
    if mid_epoch:
        assert said[0].filename == __file__  # it points at the script's load_state_dict
    again.close()


def test_the_script_s_own_torch_random_stream_is_not_moved_by_the_resumed_sampler_s_draw():
    dl = loader("RandomSampler()", 0)
    it = iter(dl)
    next(it)
    saved = dl.state_dict()
    it.close()
    dl.close()
    again = loader("RandomSampler()", 0)
    again.load_state_dict(saved)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    batches = iter(again)
    next(batches)
    assert torch.equal(torch.get_rng_state(), before)
    batches.close()
    again.close()


def test_a_resume_is_exact_while_the_script_s_threads_draw_from_torch_s_global_generator():
    """A sampler given no generator is lent one seeded from a draw saved with the state: its resumed epoch does
    not depend on torch's global generator, which thread workers' random augmentations draw from meanwhile (a
    swap of the global state for the draw repeated and lost samples in a third of such resumes)."""
    import threading

    stop = threading.Event()

    def augment() -> None:
        while not stop.is_set():
            torch.rand(64)

    drawing = [threading.Thread(target=augment, daemon=True) for _ in range(2)]
    for t in drawing:
        t.start()
    try:
        for trial in range(20):
            dl = DataLoader(list(range(200)), batch_size=8, sampler=tud.RandomSampler(range(200)), device="cpu")
            it = iter(dl)
            head = [next(it).tolist() for _ in range(1 + trial % 5)]
            saved = dl.state_dict()
            rest_uninterrupted = [b.tolist() for b in it]
            dl.close()
            again = DataLoader(list(range(200)), batch_size=8, sampler=tud.RandomSampler(range(200)), device="cpu")
            again.load_state_dict(saved)
            assert [b.tolist() for b in again] == rest_uninterrupted, trial
            assert sorted(sum(head + rest_uninterrupted, [])) == list(range(200))
            again.close()
    finally:
        stop.set()
        for t in drawing:
            t.join()


@pytest.mark.parametrize(("kind", "bad", "says"), [
    ("RandomSampler(generator)", 12, "expected null or base64 text, got int"),
    ("RandomSampler(generator)", "AAAA", "another length"),
    ("RandomSampler(generator)", "not base64!", "expected base64 text"),
    ("RandomSampler()", "AAAA", "expected null or the seed lent to this sampler"),
    ("RandomSampler()", True, "expected null or the seed lent to this sampler"),
])
def test_a_damaged_generator_state_is_refused_when_loaded_and_the_loader_is_left_as_it_was(kind, bad, says):
    dl = loader(kind, 0)
    first = ids(dl)
    state = dl.state_dict()
    state["sampler_randomness"] = bad
    with pytest.raises(StateError, match=says) as caught:
        dl.load_state_dict(state)
    assert "\n" not in str(caught.value)
    assert len(sum(ids(dl), [])) == N and ids(dl) != first  # it goes on with its own next epochs
    dl.close()


def _distributed(batched: bool) -> dict[str, Any]:
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(12), num_replicas=1, rank=0, shuffle=True, seed=0)
    return {"batch_sampler": tud.BatchSampler(sampler, 2, False)} if batched else {"sampler": sampler, "batch_size": 2}


def _epoch_sampler(kw: dict[str, Any]) -> Any:
    return kw["sampler"] if "sampler" in kw else kw["batch_sampler"].sampler


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batched", [False, True])
def test_a_resumed_script_that_forgets_set_epoch_still_gets_the_rest_of_the_saved_epoch(batched, num_workers):
    """A ``DistributedSampler`` draws from (seed, epoch): its epoch as the saved epoch began is saved and set
    again mid-epoch, so the delivered batches are skipped from that epoch's order (torchdata 0.11 skips them
    from epoch 0's, repeating three samples of 12 and losing three)."""
    kw = _distributed(batched)
    dl = DataLoader(list(range(12)), num_workers=num_workers, device="cpu", **kw)
    _epoch_sampler(kw).set_epoch(1)
    whole = ids(dl)
    it = iter(dl)
    head = [next(it).tolist() for _ in range(3)]
    saved = json.dumps(dl.state_dict())
    it.close()
    dl.close()
    kw = _distributed(batched)  # the resumed script builds its sampler anew and does not call set_epoch(1)
    again = DataLoader(list(range(12)), num_workers=num_workers, device="cpu", **kw)
    again.load_state_dict(json.loads(saved))
    assert head + ids(again) == whole
    again.close()


def test_a_set_epoch_called_after_a_state_saved_between_epochs_is_the_script_s_to_make():
    kw = _distributed(False)
    dl = DataLoader(list(range(12)), device="cpu", **kw)
    ids(dl)
    saved = dl.state_dict()
    dl.close()
    kw = _distributed(False)
    again = DataLoader(list(range(12)), device="cpu", **kw)
    again.load_state_dict(saved)
    _epoch_sampler(kw).set_epoch(5)
    expected = list(_epoch_sampler(kw))
    assert sum(ids(again), []) == expected
    again.close()
