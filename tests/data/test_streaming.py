"""ShardedTarStream: every sample once per epoch over ranks x workers, seeded two-level shuffles, clear
errors for too few shards and bad data, the reader lookup torch's and cupy_nwt's workers meet, resume."""

from __future__ import annotations

import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from toy_data import Squares

import cupy_nwt
from cupy_nwt.data.datasets import write_tar_shard
from cupy_nwt.data.streaming import ReaderSlot, ShardedTarStream, current_reader
from cupy_nwt.errors import CorruptImageError, DamagedArchiveError, LayoutError, StateError

SIZES = [5, 6, 7, 8, 9, 10, 11, 12]  # 8 shards of unequal length, 68 samples
N = sum(SIZES)
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")


def _images(ids: np.ndarray) -> np.ndarray:
    """2x2 images whose first pixel spells the sample id (PNG is lossless)."""
    img = np.zeros((len(ids), 2, 2, 3), np.uint8)
    img[:, 0, 0, 0], img[:, 0, 0, 1] = ids % 256, ids // 256
    return img


def sample_id(img) -> int:
    img = np.asarray(img)
    return int(img[0, 0, 0]) + 256 * int(img[0, 0, 1])


def write_shards(folder: Path, sizes: list[int], suffix: str = ".tar") -> list[Path]:
    paths, start = [], 0
    for k, n in enumerate(sizes):
        ids = np.arange(start, start + n)
        paths.append(write_tar_shard(folder / f"shard-{k:03d}{suffix}", _images(ids), ids % 3))
        start += n
    return paths


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    return write_shards(tmp_path_factory.mktemp("shards"), SIZES)


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def ids_of(samples) -> list[int]:
    out = []
    for img, label in samples:
        i = sample_id(img)
        assert label == i % 3  # the label travels with its own image
        out.append(i)
    return out


def read_all(stream: ShardedTarStream, world_size: int, num_workers: int) -> dict[tuple[int, int], list[int]]:
    """Every reader's delivery, as separate (rank, worker) processes would see it."""
    return {(r, w): ids_of(stream.iter_reader(ReaderSlot(r, world_size, w, num_workers, "explicit")))
            for r in range(world_size) for w in range(num_workers)}


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 1234])
def test_two_ranks_by_three_workers_deliver_every_sample_exactly_once_each_epoch(shards, seed, shuffle):
    stream = ShardedTarStream(shards, seed=seed, shuffle=shuffle, shuffle_buffer=4)
    for epoch in range(3):
        stream.set_epoch(epoch)
        got = read_all(stream, 2, 3)
        assert sorted(i for ids in got.values() for i in ids) == list(range(N))
        assert all(got.values())  # 8 shards for 6 readers: nobody idle


def test_ranks_get_equal_shard_counts_when_leftovers_can_be_spread(shards):
    stream = ShardedTarStream(shards)
    per_rank = [sum(len(stream.shards_for(ReaderSlot(r, 2, w, 3, "explicit"))) for w in range(3)) for r in range(2)]
    assert per_rank == [4, 4]  # 8 = 6 + 2 leftovers, one to each rank


def test_same_settings_same_order_other_epoch_or_seed_another(shards):
    def order(seed: int, epoch: int) -> list[int]:
        stream = ShardedTarStream(shards, seed=seed)
        stream.set_epoch(epoch)
        return ids_of(stream.iter_reader(ReaderSlot(1, 2, 2, 3, "explicit")))

    assert order(5, 0) == order(5, 0)
    assert order(5, 1) == order(5, 1)
    assert order(5, 0) != order(5, 1)
    assert order(5, 0) != order(6, 0)
    assert ShardedTarStream(shards, seed=5).shard_order() != ShardedTarStream(shards, seed=6).shard_order()


def test_the_buffer_mixes_samples_across_shards_and_no_shuffle_streams_in_order(shards):
    one = ReaderSlot(0, 1, 0, 1, "explicit")
    in_order = ids_of(ShardedTarStream(shards, shuffle=False).iter_reader(one))
    assert in_order == list(range(N))
    mixed = ShardedTarStream(shards, seed=3, shuffle_buffer=N).iter_reader(one)
    shard_of = np.repeat(np.arange(len(SIZES)), SIZES)
    first_ten = [int(shard_of[i]) for i in ids_of(mixed)][:10]
    assert len(set(first_ten)) > 2  # drawn from a buffer that holds many shards, not shard by shard


def test_fewer_shards_than_readers_is_refused_naming_both_counts(shards):
    stream = ShardedTarStream(shards[:5])
    with pytest.raises(LayoutError, match=r"5 shard\(s\) for 6 readers \(2 rank\(s\) x 3 worker\(s\)\).*"
                                          r"at least 6 shards.*fewer workers or ranks"):
        stream.iter_reader(ReaderSlot(0, 2, 1, 3, "explicit"))
    with pytest.raises(ValueError):  # a LayoutError is a ValueError
        next(iter(ShardedTarStream(shards[:5], rank=0, world_size=6)))


def test_allow_empty_readers_leaves_some_idle_and_still_delivers_everything_once(shards):
    stream = ShardedTarStream(shards[:5], allow_empty_readers=True)
    got = read_all(stream, 2, 3)
    assert sorted(i for ids in got.values() for i in ids) == list(range(sum(SIZES[:5])))
    assert sum(1 for ids in got.values() if not ids) == 1


def _garble_member(path: Path, k: int) -> str:
    """Overwrite member k's image data with garbage, keeping the tar whole; returns its name."""
    with tarfile.open(path) as tf:
        m = tf.getmembers()[k]
    with open(path, "r+b") as f:
        f.seek(m.offset_data)
        f.write(b"\x89PNG not really" + bytes(m.size - 15))
    return m.name


def test_a_corrupt_member_raises_naming_the_shard_and_the_member(tmp_path):
    paths = write_shards(tmp_path, [4, 4])
    name = _garble_member(paths[1], 2)
    with pytest.raises(CorruptImageError) as err:
        ids_of(ShardedTarStream(paths, shuffle=False, rank=0, world_size=1))
    assert str(paths[1]) in str(err.value) and repr(name) in str(err.value)


def test_a_cut_shard_raises_naming_it_and_the_byte_offset(tmp_path):
    paths = write_shards(tmp_path, [4, 4])
    data = paths[0].read_bytes()
    paths[0].write_bytes(data[:1500])
    with pytest.raises(DamagedArchiveError, match=r"damaged archive at byte offset \d+") as err:
        ids_of(ShardedTarStream(paths, rank=0, world_size=1))
    assert err.value.path == str(paths[0])


def test_gzip_shards_stream_like_plain_ones(tmp_path):
    paths = write_shards(tmp_path, [3, 4, 5], suffix=".tar.gz")
    stream = ShardedTarStream(paths, cache_dir=tmp_path / "cache")
    got = read_all(stream, 1, 3)
    assert sorted(i for ids in got.values() for i in ids) == list(range(12))


def test_bad_shard_lists_are_refused(shards, tmp_path):
    with pytest.raises(TypeError, match="list of shard paths"):
        ShardedTarStream(str(shards[0]))
    with pytest.raises(FileNotFoundError, match="nope.tar"):
        ShardedTarStream([shards[0], tmp_path / "nope.tar"])
    with pytest.raises(ValueError, match="listed twice"):
        ShardedTarStream([shards[0], shards[1], shards[0]])
    with pytest.raises(LayoutError, match="both rank= and world_size="):
        ShardedTarStream(shards, rank=1)


def test_one_shard_under_two_spellings_is_refused_as_listed_twice(shards, tmp_path, monkeypatch):
    """A relative and an absolute path, or a link, name one file: its samples would come twice an epoch."""
    monkeypatch.chdir(shards[0].parent)
    with pytest.raises(ValueError, match=rf"listed twice.*{shards[0].name} \(the same file as {shards[0]}\)"):
        ShardedTarStream([shards[0], Path(shards[0].name), *shards[1:]])
    (tmp_path / "link.tar").symlink_to(shards[2])
    with pytest.raises(ValueError, match=r"listed twice.*link\.tar"):
        ShardedTarStream([*shards, tmp_path / "link.tar"])


def test_named_class_directories_need_the_class_list(tmp_path):
    ids = np.arange(6)
    path = write_tar_shard(tmp_path / "named.tar", _images(ids), ids % 2, class_names=["cat", "dog"])
    with pytest.raises(ValueError, match=r"'cat' is not an integer and not in classes="):
        list(ShardedTarStream([path], rank=0, world_size=1))
    labels = {sample_id(img): y for img, y in ShardedTarStream([path], classes=["dog", "cat"], rank=0, world_size=1)}
    assert labels == {i: 1 - i % 2 for i in range(6)}


def test_no_file_stays_open_after_an_epoch_or_an_abandoned_one(shards):
    fds = len(os.listdir("/proc/self/fd"))
    stream = ShardedTarStream(shards, shuffle_buffer=20, rank=0, world_size=1)
    assert len(ids_of(stream)) == N
    it = iter(stream)
    next(it)
    assert len(os.listdir("/proc/self/fd")) > fds
    it.close()
    assert len(os.listdir("/proc/self/fd")) == fds


# --- which reader am I ---------------------------------------------------------------------------


def test_current_reader_outside_any_worker_is_worker_0_of_1_on_the_launchers_rank(monkeypatch):
    assert current_reader() == ReaderSlot(0, 1, 0, 1, "single")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert current_reader() == ReaderSlot(1, 4, 0, 1, "torchrun")
    assert current_reader(rank=3, world_size=4) == ReaderSlot(3, 4, 0, 1, "explicit")
    with pytest.raises(LayoutError):
        current_reader(rank=1)


class ReaderTags(Squares):
    """Each sample's label is the reader lookup's answer where the sample was made."""

    def __getitem__(self, i: int):
        s = current_reader()
        return np.zeros(1, np.uint8), s.worker * 1000 + s.num_workers * 100 + s.rank * 10 + s.world_size


def test_current_reader_in_real_cupy_nwt_workers():
    with cupy_nwt.DataLoader(ReaderTags(24), batch_size=2, num_workers=2, device="cpu") as dl:
        tags = set(np.concatenate([y for _, y in dl]).tolist())
    workers = tags - {101}  # the main process may make the first batch itself: worker 0 of 1
    assert workers and workers <= {201, 1201}



class ExplicitReader(Squares):
    """The explicit rank and world size win over the worker's."""

    def __getitem__(self, i: int):
        s = current_reader(rank=0, world_size=2)
        return np.zeros(1, np.uint8), s.worker * 1000 + s.num_workers * 100 + s.rank * 10 + s.world_size


@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_current_reader_reads_the_workers_rank_layout_and_explicit_arguments_win(worker_type):
    layout = {"rank": 1, "world_size": 2}  # the loader's layout reaches the reader through get_worker_info()
    with cupy_nwt.DataLoader(ReaderTags(24), batch_size=2, num_workers=3, device="cpu", shuffle=False,
                             worker_type=worker_type, **layout) as dl:
        assert set(np.concatenate([y for _, y in dl]).tolist()) == {312, 1312, 2312}
    with cupy_nwt.DataLoader(ExplicitReader(24), batch_size=2, num_workers=3, device="cpu", shuffle=False,
                             worker_type=worker_type, **layout) as dl:
        assert set(np.concatenate([y for _, y in dl]).tolist()) == {302, 1302, 2302}

# --- torch's DataLoader --------------------------------------------------------------------------


def _torch_view(stream: ShardedTarStream):
    torch_data = pytest.importorskip("torch.utils.data")

    class View(torch_data.IterableDataset):
        def __iter__(self):
            return iter(stream)

    return View()


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on a 2-CPU box
@pytest.mark.parametrize("world_size", [1, 2])
def test_torch_dataloader_workers_deliver_every_sample_once(shards, world_size):
    torch_data = pytest.importorskip("torch.utils.data")
    delivered = []
    for rank in range(world_size):
        stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8, rank=rank, world_size=world_size)
        stream.set_epoch(2)
        loader = torch_data.DataLoader(_torch_view(stream), num_workers=3, batch_size=None,
                                       multiprocessing_context="fork")
        delivered += ids_of((img.numpy(), int(y)) for img, y in loader)
    assert sorted(delivered) == list(range(N))


# --- resume -------------------------------------------------------------------------------------


def test_state_dict_round_trip_resumes_each_reader_exactly_where_it_was(shards):
    slot = ReaderSlot(1, 2, 0, 3, "explicit")
    full = ids_of(ShardedTarStream(shards, seed=4, shuffle_buffer=5).iter_reader(slot))
    assert len(full) > 10
    for cut in (0, 1, 7, len(full) - 1, len(full)):
        stream = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
        it = stream.iter_reader(slot)
        head = ids_of(next(it) for _ in range(cut))
        state = json.loads(json.dumps(stream.state_dict()))  # plain, JSON-ready
        fresh = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
        fresh.load_state_dict(state)
        assert head + ids_of(fresh.iter_reader(slot)) == full, cut


def test_merged_states_of_all_readers_resume_an_epoch_exactly_once(shards):
    slots = [ReaderSlot(r, 2, w, 3, "explicit") for r in range(2) for w in range(3)]
    seen, merged = [], {}
    for k, slot in enumerate(slots):
        stream = ShardedTarStream(shards, seed=9, shuffle_buffer=3)
        stream.set_epoch(1)
        it = stream.iter_reader(slot)
        seen += ids_of(next(it) for _ in range(k))
        copy = pickle.loads(pickle.dumps(stream))  # a stream mid-epoch still pickles (no open files)
        merged.update(stream.state_dict()["readers"])
        assert copy.epoch == 1
    resumed = ShardedTarStream(shards, seed=9, shuffle_buffer=3)
    resumed.load_state_dict({**stream.state_dict(), "readers": merged})
    assert resumed.epoch == 1
    resumed.set_epoch(1)  # a training loop's top of the epoch it resumes: the loaded state stays
    rest = [i for slot in slots for i in ids_of(resumed.iter_reader(slot))]
    assert sorted(seen + rest) == list(range(N))


def test_a_state_of_another_shard_list_is_refused_in_one_line(shards, tmp_path):
    """The same count of shards in another order (an unsorted glob) or under other names: the saved positions
    would read other samples, some twice and some never."""
    stream = ShardedTarStream(shards, seed=4, shuffle_buffer=3, rank=0, world_size=1)
    it = iter(stream)
    head = ids_of(next(it) for _ in range(10))
    state = json.loads(json.dumps(stream.state_dict()))
    (tmp_path / "renamed.tar").write_bytes(shards[-1].read_bytes())
    for other in ([shards[1], shards[0], *shards[2:]], [*shards[:-1], tmp_path / "renamed.tar"]):
        with pytest.raises(ValueError, match=r"another shard list.*same order") as exc:
            ShardedTarStream(other, seed=4, shuffle_buffer=3).load_state_dict(state)
        assert "\n" not in str(exc.value)
    moved = tmp_path / "moved"
    moved.mkdir()
    copies = [moved / p.name for p in shards]
    for p, q in zip(shards, copies):
        q.write_bytes(p.read_bytes())
    again = ShardedTarStream(copies, seed=4, shuffle_buffer=3, rank=0, world_size=1)
    again.load_state_dict(state)  # the same names in another folder: the same list
    assert sorted(head + ids_of(again)) == list(range(N))


def test_a_state_is_refused_under_other_settings_or_another_layout(shards):
    stream = ShardedTarStream(shards, seed=4)
    it = stream.iter_reader(ReaderSlot(0, 2, 0, 3, "explicit"))
    next(it)
    state = stream.state_dict()
    with pytest.raises(ValueError, match=r"seed 4 \(now 5\)"):
        ShardedTarStream(shards, seed=5).load_state_dict(state)
    other = ShardedTarStream(shards, seed=4)
    other.load_state_dict(state)
    with pytest.raises(LayoutError, match="taken with 6 readers"):
        other.iter_reader(ReaderSlot(0, 1, 0, 2, "explicit"))
    other.load_state_dict(state)
    other.set_epoch(1)  # another epoch: the state is dropped and reader 0 starts from its beginning
    assert len(ids_of(other.iter_reader(ReaderSlot(0, 2, 0, 3, "explicit")))) == sum(
        SIZES[s] for s in other.shards_for(ReaderSlot(0, 2, 0, 3, "explicit")))


@pytest.mark.parametrize("field, value, match", [
    ("cursor", -1, r"readers\[1\]\.cursor=-1: must be from 0"),
    ("cursor", 10**9, r"cursor=1000000000: must be from 0"),
    ("member", -3, r"member=-3: must be >= 0"),
    ("buffer", [[0, -1]], r"buffer\[0\]\[1\]=-1: must be >= 0"),
    ("buffer", [[7, 0]], r"buffer\[0\]=\[7, 0\]: not a member reader 1 has reached"),
    ("rng", {"state": 1}, r"rng=.*not a PCG64 random state"),
    ("readers", True, r"readers=True: expected an integer"),
])
def test_a_damaged_reader_position_is_refused_naming_its_field(shards, field, value, match):
    """A position taken as it is would deliver other samples without a word (a negative index reads from the
    end, a foreign reference another reader's sample); the stream keeps its state when one is refused."""
    slot = ReaderSlot(0, 1, 1, 3, "explicit")
    stream = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
    it = stream.iter_reader(slot)
    next(it)
    state = json.loads(json.dumps(stream.state_dict()))
    state["readers"]["1"][field] = value
    fresh = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
    fresh.set_epoch(2)
    with pytest.raises(StateError, match=match) as exc:
        fresh.load_state_dict(state)
    assert "\n" not in str(exc.value) and fresh.epoch == 2
    assert len(ids_of(fresh.iter_reader(slot))) == sum(SIZES[s] for s in fresh.shards_for(slot))


def test_a_member_past_its_shard_is_refused_when_the_reader_reaches_it(shards):
    slot = ReaderSlot(0, 1, 0, 2, "explicit")
    stream = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
    it = stream.iter_reader(slot)
    next(it)
    state = stream.state_dict()
    state["readers"][0]["member"] = 999
    fresh = ShardedTarStream(shards, seed=4, shuffle_buffer=5)
    fresh.load_state_dict(state)
    with pytest.raises(StateError, match=r"member 999 of .*shard-\d+\.tar is past the shard's \d+ members"):
        list(fresh.iter_reader(slot))


# --- cupy_nwt's own DataLoader --------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")  # 3 workers on a 2-CPU box
@pytest.mark.parametrize("world_size", [1, 2])
def test_cupy_nwt_dataloader_workers_deliver_every_sample_once(shards, world_size):
    """The stream meets the loader's iterable support directly: each worker reads its own shards."""
    from cupy_nwt import DataLoader

    delivered = []
    for rank in range(world_size):
        stream = ShardedTarStream(shards, seed=11, shuffle_buffer=8, rank=rank, world_size=world_size)
        stream.set_epoch(2)
        with DataLoader(stream, batch_size=4, num_workers=3, device="cpu") as loader:
            for images, labels in loader:
                delivered += ids_of(zip(images, labels.tolist()))
    assert sorted(delivered) == list(range(N))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_given_to_the_loader_share_the_shards_without_workers_too(shards, num_workers):
    """DataLoader(rank=, world_size=) reading a stream in its own process (num_workers=0) reads that
    rank's share, as its workers would: two ranks together deliver every sample once."""
    from cupy_nwt import DataLoader

    delivered = []
    for rank in range(2):
        with DataLoader(ShardedTarStream(shards, seed=11, shuffle_buffer=8), batch_size=4, num_workers=num_workers,
                        rank=rank, world_size=2, device="cpu") as loader:
            for images, labels in loader:
                delivered += ids_of(zip(images, labels.tolist()))
    assert sorted(delivered) == list(range(N))


def test_current_reader_in_a_stream_read_without_workers_is_the_loaders_rank():
    class Tags:
        def __iter__(self):
            s = current_reader()
            yield s.rank * 10 + s.world_size

    with cupy_nwt.DataLoader(Tags(), batch_size=None, num_workers=0, rank=2, world_size=3, device="cpu") as dl:
        assert list(dl) == [23]
    assert current_reader() == ReaderSlot(0, 1, 0, 1, "single")  # the main process's own code: no loader reading
