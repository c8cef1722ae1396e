"""A resumed epoch names its batches as the uninterrupted epoch does: a failed batch's error, a skipped
sample's record and a stall say the epoch's batch, not its place among the batches left after the resume.

Each case is a user's loop: the epoch run whole, then run again stopped after one batch, saved, and
resumed by a new loader; both must name sample 5's batch (batch 2 of ``[0, 1], [2, 3], [4, 5], [6, 7]``).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cupy_nwt import DataLoader, WorkerError
from cupy_nwt.errors import CorruptImageError


class FailsAtFive:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 5:
            raise KeyError(i)
        return np.full(1, i, np.uint8)


class CorruptAtFive(FailsAtFive):
    def __getitem__(self, i: int) -> np.ndarray:
        if i == 5:
            raise CorruptImageError(f"/data/img{i}.png: cannot identify image file", i)
        return np.full(1, i, np.uint8)


class Stream:
    def __iter__(self):
        return iter(np.full(1, i, np.uint8) for i in range(8))


def collate_failing_at_five(samples):
    batch = np.stack(samples)
    if 5 in batch:
        raise KeyError(5)
    return batch


def failures(loader: DataLoader) -> list[tuple[int | None, bool]]:
    """(batch_index, the message names the same batch) of each failed batch of an epoch, going on past it."""
    seen = []
    it = iter(loader)
    while True:
        try:
            next(it)
        except StopIteration:
            return seen
        except WorkerError as exc:
            seen.append((exc.batch_index, f"failed on batch {exc.batch_index}" in str(exc)))


def resumed(make, run):
    """``run`` on the whole epoch, and on a new loader resumed after the first batch."""
    with make() as whole:
        uninterrupted = run(whole)
    with make() as first:
        it = iter(first)
        next(it)
        state = first.state_dict()
    with make() as second:
        second.load_state_dict(state)
        return uninterrupted, run(second)


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("how", ["own sampler", "shuffled", "user sampler", "stream"])
def test_a_failed_batch_of_a_resumed_epoch_is_named_as_in_the_whole_epoch(how, nw):
    if how == "stream":
        def make():
            return DataLoader(Stream(), batch_size=2, num_workers=min(nw, 1), device="cpu",
                              collate_fn=collate_failing_at_five)
    else:
        kwargs = {"shuffle": True, "seed": 3} if how == "shuffled" else \
            {"sampler": list(range(8))} if how == "user sampler" else {}

        def make():
            return DataLoader(FailsAtFive(), batch_size=2, num_workers=nw, device="cpu", **kwargs)
    uninterrupted, after_resume = resumed(make, failures)
    assert len(uninterrupted) == 1 and uninterrupted[0][1], uninterrupted
    if how != "shuffled":
        assert uninterrupted == [(2, True)]
    assert after_resume == uninterrupted


def test_a_skipped_sample_of_a_resumed_epoch_is_recorded_in_its_epoch_batch(caplog):
    def make():
        return DataLoader(CorruptAtFive(), batch_size=2, num_workers=2, device="cpu", on_bad_sample="skip")

    def run(loader):
        list(loader)
        return [(b.epoch, b.batch_index, b.key) for b in loader.stats().bad_samples]

    with caplog.at_level(logging.WARNING, logger="cupy_nwt"):
        uninterrupted, after_resume = resumed(make, run)
    assert uninterrupted == after_resume == [(0, 2, 5)]
    warned = [r.getMessage() for r in caplog.records if "skipped a bad sample" in r.getMessage()]
    assert len(warned) == 2 and all("batch 2 of epoch 0" in m for m in warned), warned
