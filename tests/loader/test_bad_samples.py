"""``on_bad_sample="skip"``: a sample that fails to read or decode is left out of its batch, counted in
``stats()``, logged once with its file and reason; past ``max_bad_samples`` the epoch stops. Off by
default. Every case runs with process workers, thread workers (the ``worker_type`` fixture) and none."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import cupy_nwt
from cupy_nwt.errors import ArgumentError, CorruptImageError, TooManyBadSamplesError

pytestmark = pytest.mark.usefixtures("worker_type")
N = 12
WORKERS = [0, 2]


class Flaky:
    """Samples ``i`` (an int64 array of i); those in ``bad`` fail as a corrupt image file does."""

    def __init__(self, bad: set[int], other: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.bad, self.other = set(bad), set(other)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise CorruptImageError(f"/data/img{i}.png: cannot identify image file", i)
        if i in self.other:
            raise RuntimeError(f"a bug in __getitem__ at {i}")
        return np.full(2, i, np.int64)

    def sample_source(self, i: int) -> str:
        return f"/data/img{i}.png"


def rows(loader) -> list[list[int]]:
    return [np.asarray(b)[:, 0].tolist() for b in loader]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_off_by_default_a_bad_sample_fails_its_batch(num_workers):
    loader = cupy_nwt.DataLoader(Flaky({5}), batch_size=4, num_workers=num_workers, device="cpu")
    with pytest.raises(CorruptImageError, match="img5.png"):
        list(loader)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_skip_leaves_bad_samples_out_of_shorter_batches_and_counts_each(num_workers, caplog):
    loader = cupy_nwt.DataLoader(Flaky({1, 6}), batch_size=4, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip")
    with caplog.at_level(logging.WARNING, logger="cupy_nwt.loader"):
        got = rows(loader)
    assert got == [[0, 2, 3], [4, 5, 7], [8, 9, 10, 11]]  # each good sample once, in order
    stats = loader.stats()
    assert stats.skipped_samples == 2
    assert sorted((b.key, b.source, b.batch_index) for b in stats.bad_samples) == [(1, "/data/img1.png", 0),
                                                                                (6, "/data/img6.png", 1)]
    assert all(b.reason.startswith("CorruptImageError: /data/img") for b in stats.bad_samples)
    logged = [r.getMessage() for r in caplog.records if "skipped a bad sample" in r.getMessage()]
    assert len(logged) == 2 and all("cannot identify" in line for line in logged)  # as they arrive
    assert sorted(b["key"] for b in stats.to_dict()["bad_samples"]) == [1, 6]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_batch_whose_every_sample_is_bad_does_not_come(num_workers):
    loader = cupy_nwt.DataLoader(Flaky({4, 5, 6, 7}), batch_size=4, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip")
    assert rows(loader) == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert loader.stats().skipped_samples == 4
    assert rows(loader) == [[0, 1, 2, 3], [8, 9, 10, 11]]  # the next epoch alike


@pytest.mark.parametrize("num_workers", WORKERS)
def test_unbatched_a_bad_sample_is_simply_not_delivered(num_workers):
    loader = cupy_nwt.DataLoader(Flaky({3}), batch_size=None, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip")
    assert [int(np.asarray(x)[0]) for x in loader] == [i for i in range(N) if i != 3]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_past_max_bad_samples_the_epoch_stops_with_one_line(num_workers):
    loader = cupy_nwt.DataLoader(Flaky({1, 9}), batch_size=4, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip", max_bad_samples=1)
    it = iter(loader)
    assert np.asarray(next(it))[:, 0].tolist() == [0, 2, 3]
    assert np.asarray(next(it))[:, 0].tolist() == [4, 5, 6, 7]
    with pytest.raises(TooManyBadSamplesError) as caught:
        next(it)
    message = str(caught.value)
    assert "\n" not in message and "max_bad_samples=1" in message and "/data/img9.png" in message
    with pytest.raises(StopIteration):
        next(it)
    assert rows(cupy_nwt.DataLoader(Flaky({1}), batch_size=4, num_workers=num_workers, device="cpu",
                                    on_bad_sample="skip", max_bad_samples=1)) == [[0, 2, 3], [4, 5, 6, 7],
                                                                                    [8, 9, 10, 11]]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_other_errors_still_fail_their_batch(num_workers):
    loader = cupy_nwt.DataLoader(Flaky({1}, other={6}), batch_size=4, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip")
    it = iter(loader)
    assert np.asarray(next(it))[:, 0].tolist() == [0, 2, 3]
    with pytest.raises(RuntimeError, match="a bug in __getitem__ at 6"):
        next(it)
    assert np.asarray(next(it))[:, 0].tolist() == [8, 9, 10, 11]  # iteration goes on, as PyTorch's does


@pytest.mark.parametrize("num_workers", WORKERS)
def test_resuming_after_a_dropped_batch_gives_exactly_the_rest(num_workers):
    def loader():
        return cupy_nwt.DataLoader(Flaky({2, 3}), batch_size=2, num_workers=num_workers, device="cpu",
                                   shuffle=True, seed=7, on_bad_sample="skip")

    whole = rows(loader())
    first = loader()
    it = iter(first)
    head = [np.asarray(next(it))[:, 0].tolist() for _ in range(2)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + rows(resumed) == whole
    assert sorted(x for b in whole for x in b) == [i for i in range(N) if i not in (2, 3)]


def test_the_options_are_checked_where_set():
    with pytest.raises(ArgumentError, match="on_bad_sample must be 'raise' or 'skip'"):
        cupy_nwt.DataLoader(Flaky(set()), on_bad_sample="ignore", device="cpu")
    with pytest.raises(ArgumentError, match="needs on_bad_sample='skip'"):
        cupy_nwt.DataLoader(Flaky(set()), max_bad_samples=3, device="cpu")
    with pytest.raises(ArgumentError, match="max_bad_samples"):
        cupy_nwt.DataLoader(Flaky(set()), on_bad_sample="skip", max_bad_samples=-1, device="cpu")

    class Stream(cupy_nwt.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ArgumentError, match="map-style"):
        cupy_nwt.DataLoader(Stream(), on_bad_sample="skip", device="cpu")


@pytest.mark.parametrize("num_workers", WORKERS)
def test_an_image_folder_with_a_corrupt_file(tmp_path, num_workers):
    from cupy_nwt.data import ImageFolder, encode_png

    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            (tmp_path / c / f"{i}.png").write_bytes(encode_png(np.full((4, 4, 3), i, np.uint8)))
    (tmp_path / "b" / "1.png").write_bytes(b"not a png at all")
    data = ImageFolder(tmp_path)
    loader = cupy_nwt.DataLoader(data, batch_size=3, num_workers=num_workers, device="cpu", on_bad_sample="skip")
    sizes = [len(np.asarray(images)) for images, _labels in loader]
    assert sizes == [3, 2]
    (bad,) = loader.stats().bad_samples
    assert bad.source.endswith("b/1.png") and bad.reason.startswith("CorruptImageError")


class FlakyBatched(Flaky):
    """Reads whole batches (``__getitems__``): one bad sample fails the call, so skipping reads them one by one."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_batched_dataset_s_bad_sample_is_found_one_by_one(num_workers):
    loader = cupy_nwt.DataLoader(FlakyBatched({5}), batch_size=4, num_workers=num_workers, device="cpu",
                                 on_bad_sample="skip")
    assert rows(loader) == [[0, 1, 2, 3], [4, 6, 7], [8, 9, 10, 11]]
    assert [b.key for b in loader.stats().bad_samples] == [5]
