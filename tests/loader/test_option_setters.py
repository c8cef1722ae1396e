"""Options are checked wherever they are set: an attribute set after construction runs the constructor's
check, and a refused value leaves the loader as it was (its options, its batches)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt import ArgumentError, CupyNwtError, DataLoader, NoGPUError

DATA = np.arange(40, dtype=np.int64)

# (attribute, a refused value, the exception types a caller may catch it by, words of the message)
REFUSED = [
    ("timeout", -1, (ValueError,), "timeout"),
    ("num_workers", -1, (ValueError,), "num_workers"),
    ("num_workers", "many", (ValueError,), "num_workers"),
    ("prefetch_factor", 0, (ValueError,), "prefetch_factor"),
    ("pin_memory", "yes", (ValueError,), "pin_memory"),
    ("pin_memory_device", 3, (ValueError,), "pin_memory_device"),
    ("collate_fn", 3, (ValueError,), "collate_fn"),
    ("batch_transform", "no", (ValueError,), "batch_transform"),
    ("worker_init_fn", 1.5, (ValueError,), "worker_init_fn"),
    ("worker_type", "fiber", (ValueError,), "worker_type"),
    ("device", "tpu", (ValueError,), "device"),
    ("device_id", -2, (ValueError,), "device_id"),
    ("output", "tensorflow", (ValueError,), "output"),
    ("seed", -1, (ValueError,), "seed"),
    ("generator", -1, (ValueError,), "generator"),
    ("generator", "g", (ValueError,), "generator"),
    ("stall_warning_s", -5, (ValueError,), "stall_warning_s"),
    ("in_order", "sometimes", (TypeError,), "in_order"),
    ("zero_copy", None, (TypeError,), "zero_copy"),
    ("rank_layout", (0, 2), (TypeError,), "rank_layout"),
]


def _loader() -> DataLoader:
    return DataLoader(DATA, batch_size=8, shuffle=True, seed=3, device="cpu")


@pytest.mark.parametrize(("name", "value", "bases", "words"), REFUSED, ids=lambda v: str(v)[:20])
def test_a_refused_set_raises_as_the_constructor_would_and_changes_nothing(name, value, bases, words):
    loader = _loader()
    before, batches = loader.options, [b.tolist() for b in loader]
    with pytest.raises(CupyNwtError, match=words) as info:
        setattr(loader, name, value)
    assert isinstance(info.value, bases)
    assert loader.options is before
    loader.set_epoch(0)
    assert [b.tolist() for b in loader] == batches


def test_the_constructor_refuses_the_same_values():
    for name, value, bases, words in REFUSED:
        if name in ("rank_layout", "device_id"):  # not constructor arguments: rank/world_size and device say them
            continue
        with pytest.raises((CupyNwtError, *bases), match=words):
            DataLoader(DATA, **{"batch_size": 8, "device": "cpu", name: value})


def test_a_device_the_machine_lacks_is_refused_on_set():
    loader = _loader()
    before = loader.options
    with pytest.raises((NoGPUError, ArgumentError)):
        loader.device = "cuda:1"
    assert loader.options is before and loader.device == "cpu"


def test_accepted_sets_take_effect_on_the_next_iteration():
    loader = _loader()
    first = [b.tolist() for b in loader]
    loader.timeout = 5
    loader.prefetch_factor = 4
    loader.collate_fn = None
    assert (loader.timeout, loader.prefetch_factor) == (5.0, 4)
    loader.timeout = 0
    assert loader.timeout == 0  # torch's "no limit"
    loader.seed = 4
    loader.set_epoch(0)
    again = [b.tolist() for b in loader]
    assert sorted(sum(again, [])) == sorted(sum(first, [])) and again != first  # another seed, another order


def test_settings_fixed_at_construction_stay_fixed():
    loader = _loader()
    for name in ("batch_size", "sampler", "dataset", "drop_last"):
        with pytest.raises(ValueError, match=f"{name} attribute should not be set"):
            setattr(loader, name, None)


def test_a_generator_set_after_construction_is_drawn_from_as_the_constructor_draws_from_it():
    """torch lets ``loader.generator`` be set (only the six sampling attributes are fixed); the next iteration
    draws its order from it, and the same generator state gives the same order as given to the constructor."""
    loader = _loader()
    loader.generator = np.random.default_rng(5)
    assert isinstance(loader.generator, np.random.Generator)
    made = DataLoader(DATA, batch_size=8, shuffle=True, generator=np.random.default_rng(5), device="cpu")
    assert (loader.seed, [b.tolist() for b in loader]) == (made.seed, [b.tolist() for b in made])
    loader.generator = None
    assert loader.generator is None and sorted(np.concatenate([b for b in loader]).tolist()) == DATA.tolist()


def test_torchdata_s_snapshot_every_n_steps_is_accepted_checked_and_read_back():
    assert DataLoader(DATA, batch_size=8, device="cpu").snapshot_every_n_steps == 1
    assert DataLoader(DATA, batch_size=8, device="cpu", snapshot_every_n_steps=None).snapshot_every_n_steps is None
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        DataLoader(DATA, batch_size=8, device="cpu", snapshot_every_n_steps=-1)
