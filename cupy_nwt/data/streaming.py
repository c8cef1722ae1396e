"""Sharded tar streaming: a list of tar shards split across (rank, worker), shuffled at two levels.

WebDataset's design, on local shards: the unit of distribution is the shard, not the sample. Each
of ``world_size x num_workers`` *readers* gets every readers-th shard of the epoch's shard order, so
the readers' shards are disjoint and cover the list: every sample is delivered exactly once per
epoch. A bounded buffer then shuffles samples across the shards a reader has open.

Unlike WebDataset, the buffer holds *references* (shard index, member index), not decoded images:
an image is read and decoded only when it leaves the buffer. The buffer costs a few bytes a slot
(no start-up "initial" fill to trade against randomness), and a reader's whole position is a
handful of integers, which is what ``state_dict()`` saves.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import check_callable, check_int
from .._worker_info import get_worker_info, main_reader_ranks
from ..errors import (
    ArgumentError,
    ArgumentTypeError,
    DamagedArchiveError,
    DataError,
    LayoutError,
    MissingPathError,
    StateError,
)
from ..ranks import rank_layout
from ..system import cache_dir as default_cache_dir
from ._images import Transform, transformed_image
from ._stream_state import checked_positions, past_end
from ._tar_shards import class_directory, gunzip_cached, image_members, integer_label, is_gzip

__all__ = ["ReaderSlot", "ShardedTarStream", "current_reader"]

STATE_VERSION = 1
_SHARD_STREAM, _BUFFER_STREAM = 0, 1  # tags that keep the two random streams apart


@dataclass(frozen=True)
class ReaderSlot:
    """One reader of a stream: worker ``worker`` of ``num_workers`` on rank ``rank`` of ``world_size``.

    Readers are numbered worker-major (``index = worker * world_size + rank``) so that when the
    shards do not divide evenly, the readers with one shard more are spread over the ranks rather
    than all on rank 0: ranks in lockstep (DDP) then differ by at most one shard's samples.
    """

    rank: int
    world_size: int
    worker: int
    num_workers: int
    # where the numbers came from: "explicit", "cupy_nwt worker", "torch worker", "cupy_nwt loader", "single", a launcher
    source: str

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, ge=1)
        check_int("rank", self.rank, ge=0, le=self.world_size - 1)
        check_int("num_workers", self.num_workers, ge=1)
        check_int("worker", self.worker, ge=0, le=self.num_workers - 1)

    @property
    def index(self) -> int:
        return self.worker * self.world_size + self.rank

    @property
    def count(self) -> int:
        return self.world_size * self.num_workers

    def describe(self) -> str:
        return (f"reader {self.index} of {self.count} ({self.world_size} rank(s) x {self.num_workers} worker(s), "
                f"from {self.source})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "index": self.index, "count": self.count}


def current_reader(rank: int | None = None, world_size: int | None = None) -> ReaderSlot:
    """Which reader this process is: the one contract between a stream and whatever loader runs it.

    Worker id and count: from ``cupy_nwt.get_worker_info()`` in a cupy_nwt worker, else from
    ``torch.utils.data.get_worker_info()`` in a torch worker (torch is never imported here: only
    asked if already loaded), else worker 0 of 1. Rank and world size: the explicit arguments, else
    the worker info's ``rank`` / ``world_size`` (cupy_nwt's loader gives them), else those of the cupy_nwt
    loader reading the stream in this process without workers, else the launcher's environment
    (``cupy_nwt.ranks.rank_layout``).

    Args:
        rank: this rank, overriding the worker info and the launcher.
        world_size: the number of ranks, overriding them too.
    """
    if (rank is None) != (world_size is None):
        raise LayoutError("give both rank= and world_size=, or neither (then they are looked up)")
    info, source = get_worker_info(), "cupy_nwt worker"
    if info is None:
        torch_data = sys.modules.get("torch.utils.data")
        info = torch_data.get_worker_info() if torch_data is not None else None
        source = "torch worker"
    worker, num_workers = (0, 1) if info is None else (int(info.id), int(info.num_workers))
    if rank is not None and world_size is not None:
        return ReaderSlot(rank, world_size, worker, num_workers, "explicit")
    info_rank, info_world = getattr(info, "rank", None), getattr(info, "world_size", None)
    if info_rank is not None and info_world is not None:
        return ReaderSlot(int(info_rank), int(info_world), worker, num_workers, source)
    loader_ranks = main_reader_ranks() if info is None else None
    if loader_ranks is not None:
        return ReaderSlot(*loader_ranks, 0, 1, "cupy_nwt loader")
    layout = rank_layout()
    return ReaderSlot(layout.rank, layout.world_size, worker, num_workers,
                      source if info is not None else layout.launcher)


def _listed_twice(paths: list[Path]) -> list[str]:
    """The shards listed more than once, however spelled (a relative and an absolute path, a link): one file
    read by two readers would deliver its samples twice."""
    first: dict[tuple[int, int], Path] = {}
    twice: dict[str, None] = {}
    for p in paths:
        st = p.stat()
        seen = first.setdefault((st.st_dev, st.st_ino), p)
        if seen is not p:
            twice[str(p) if p == seen else f"{p} (the same file as {seen})"] = None
    return list(twice)


def _names_digest(paths: list[Path]) -> str:
    """The shard list's file names in order, hashed: a state resumes only on the list it indexes (the same
    names, in the same order; another folder is fine)."""
    return hashlib.sha256("\0".join(p.name for p in paths).encode("utf-8", "surrogateescape")).hexdigest()[:16]


class _ShardIndex:
    """The image members of one shard (``image_members``, the archive checked whole), their labels, an open file."""

    def __init__(self, path: Path, tar_path: Path, classes: Mapping[str, int] | None) -> None:
        self.path = path
        names, offsets, sizes, labels = [], [], [], []
        for m in image_members(tar_path, path):
            names.append(os.fsencode(m.name))
            offsets.append(m.offset)
            sizes.append(m.size)
            labels.append(_label(path, m.name, classes))
        self.names = np.array(names, dtype=bytes)
        self.offsets = np.array(offsets, dtype=np.int64)
        self.sizes = np.array(sizes, dtype=np.int64)
        self.labels = np.array(labels, dtype=np.int64)
        self.fd = os.open(tar_path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.labels)

    def source(self, j: int) -> str:
        return f"{self.path} member {os.fsdecode(self.names[j])!r}"

    def read(self, j: int) -> bytes:
        size, offset = int(self.sizes[j]), int(self.offsets[j])
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise DamagedArchiveError(self.path, offset + len(data), f"member {os.fsdecode(self.names[j])!r} is cut: "
                                      f"{len(data)} of {size} bytes (the file shrank after it was indexed?)")
        return data

    def close(self) -> None:
        os.close(self.fd)


def _label(path: Path, name: str, classes: Mapping[str, int] | None) -> int:
    """The label of member ``<class>/<file>``: its place in ``classes``, else the directory read as
    ``TarImageDataset`` reads it (``integer_label``)."""
    cls = class_directory(name)
    if cls is None:
        raise DataError(f"{path} member {name!r} is not inside a class directory, so it has no label "
                        "(expected <class>/<file>)")
    if classes is not None and cls in classes:
        return classes[cls]
    label = integer_label(cls, f"{path} member {name!r}")
    if label is not None:
        return label
    raise DataError(f"{path} member {name!r}: class directory {cls!r} is not an integer and not in classes= "
                    "(every shard must label the same way, so pass the full list of class names)")


class _Reader:
    """One reader's walk through its shards for one epoch; its fields are its whole position.

    ``cursor`` indexes the reader's shard list, ``member`` the next member of that shard to enter the
    buffer, ``buffer`` holds (shard, member) references not yet delivered. Shard indexes stay open
    while the buffer refers to them, so a reader holds at most a few shards open.
    """

    def __init__(self, stream: ShardedTarStream, slot: ReaderSlot, shards: list[int],
                 position: Mapping[str, Any] | None) -> None:
        self.stream, self.slot, self.shards = stream, slot, shards
        self.rng = np.random.default_rng([stream.seed, stream.epoch, _BUFFER_STREAM, slot.index])
        self.size = stream.shuffle_buffer if stream.shuffle else 1
        self.cursor, self.member = 0, 0
        self.buffer: list[tuple[int, int]] = []
        if position is not None:
            self.cursor, self.member = int(position["cursor"]), int(position["member"])
            self.buffer = [(int(s), int(j)) for s, j in position["buffer"]]
            self.rng.bit_generator.state = position["rng"]
        self.refs = Counter(s for s, _ in self.buffer)
        self.open: dict[int, _ShardIndex] = {}

    def _shard(self, s: int) -> _ShardIndex:
        if s not in self.open:
            self.open[s] = self.stream.open_shard(s)
        return self.open[s]

    def _fill(self) -> bool:
        """Move one reference into the buffer; False when the reader's shards are used up."""
        while self.cursor < len(self.shards):
            s = self.shards[self.cursor]
            if self.member > len(self._shard(s)):
                past_end(str(self.stream.shards[s]), self.member, len(self._shard(s)))
            if self.member < len(self._shard(s)):
                self.buffer.append((s, self.member))
                self.refs[s] += 1
                self.member += 1
                return True
            self.cursor, self.member = self.cursor + 1, 0
            self._release(s)
        return False

    def _release(self, s: int) -> None:
        current = self.shards[self.cursor] if self.cursor < len(self.shards) else None
        if self.refs[s] == 0 and s != current and s in self.open:
            self.open.pop(s).close()

    def next(self) -> tuple[int, int] | None:
        """The next (shard, member) to deliver, or None at the end of the reader's epoch."""
        while len(self.buffer) < self.size and self._fill():
            pass
        if not self.buffer:
            return None
        k = int(self.rng.integers(len(self.buffer))) if len(self.buffer) > 1 else 0
        self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
        ref = self.buffer.pop()
        self.refs[ref[0]] -= 1
        return ref

    def sample(self, ref: tuple[int, int]) -> tuple[Any, int]:
        s, j = ref
        shard = self._shard(s)
        if j >= len(shard):
            past_end(str(shard.path), j, len(shard))
        img = transformed_image(shard.read(j), shard.source(j), None, self.stream.transform)
        label = int(shard.labels[j])
        self._release(s)
        return img, label

    def position(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "shard": self.shards[self.cursor] if self.cursor < len(self.shards) else None,
                "member": self.member, "buffer": [list(r) for r in self.buffer], "rng": self.rng.bit_generator.state}

    def close(self) -> None:
        for shard in self.open.values():
            shard.close()
        self.open.clear()


class ShardedTarStream:
    """Samples ``(image uint8 HWC, label)`` streamed from tar shards, each delivered once per epoch.

    Every rank builds it with the same shard list, ``seed`` and epoch (``set_epoch`` before each
    epoch, as with ``DistributedSampler``); each reader (see ``current_reader``) then takes every
    readers-th shard of the epoch's shard order. With ``shuffle`` the shard order is a permutation
    drawn from (seed, epoch) and each reader's samples pass through a ``shuffle_buffer``-slot buffer
    seeded from (seed, epoch, reader); without it shards and members stream in order. The same
    settings give the same order. Fewer shards than readers is refused with a ``LayoutError`` (a
    ``ValueError``) unless ``allow_empty_readers``: some readers would deliver nothing.

    Shards are indexed lazily, by the reader that reaches them, and checked whole (a damaged shard
    raises ``DamagedArchiveError`` with its name and byte offset); an image that does not decode
    raises ``CorruptImageError`` naming shard and member. Labels are the member's directory, an
    integer (what ``write_tar_shard`` writes) or a name in ``classes``. .tar.gz shards are
    decompressed once into ``cache_dir``. The sample count per rank differs by up to one shard when
    the shards do not divide evenly among readers.

    ``rank``/``world_size`` override the launcher's layout. cupy_nwt's ``DataLoader`` calls
    ``set_epoch`` with its own epoch on every worker's copy (persistent workers included) before
    each epoch, so epochs reshuffle without a call of yours (``loader.set_epoch`` picks one). For
    torch's ``DataLoader``, wrap it in a ``torch.utils.data.IterableDataset`` whose ``__iter__``
    returns ``iter(stream)``; torch never calls ``set_epoch``, and with ``persistent_workers`` a
    ``set_epoch`` in the main process does not reach the workers' copies.

    Args:
        shards: tar (or .tar.gz) shard paths, the same list on every rank.
        shuffle: permute shards and samples per epoch (else stream in order).
        seed: the shuffle's seed, the same on every rank.
        shuffle_buffer: slots of each reader's sample buffer: larger mixes more, costs memory.
        transform: applied to each image (HWC uint8).
        classes: class names, for members whose directory is a name rather than an integer label.
        rank: this rank (default: the launcher's).
        world_size: the number of ranks (default: the launcher's).
        allow_empty_readers: accept fewer shards than readers (some deliver nothing).
        cache_dir: where .tar.gz shards are decompressed once.
    """

    def __init__(self, shards: Sequence[str | os.PathLike[str]], *, shuffle: bool = True, seed: int = 0,
                 shuffle_buffer: int = 1000, transform: Transform | None = None,
                 classes: Sequence[str] | None = None, rank: int | None = None, world_size: int | None = None,
                 allow_empty_readers: bool = False, cache_dir: str | os.PathLike[str] | None = None) -> None:
        if isinstance(shards, (str, os.PathLike)):
            raise ArgumentTypeError("ShardedTarStream takes a list of shard paths, e.g. sorted(glob('data-*.tar')), "
                            f"not one path ({str(shards)!r})")
        self.shards = [Path(p) for p in shards]
        if not self.shards:
            raise ArgumentError("ShardedTarStream: the shard list is empty")
        missing = [str(p) for p in self.shards if not p.is_file()]
        if missing:
            raise MissingPathError(f"ShardedTarStream: {len(missing)} shard(s) missing: {', '.join(missing[:5])}")
        dupes = _listed_twice(self.shards)
        if dupes:
            raise ArgumentError(f"ShardedTarStream: shard(s) listed twice would be delivered twice: {', '.join(dupes)}")
        if (rank is None) != (world_size is None):
            raise LayoutError("give both rank= and world_size=, or neither (then they are looked up)")
        self.shuffle = bool(shuffle)
        self.seed = check_int("seed", seed, ge=0)
        self.shuffle_buffer = check_int("shuffle_buffer", shuffle_buffer, ge=1)
        self.rank = check_int("rank", rank, ge=0, optional=True)
        self.world_size = check_int("world_size", world_size, ge=1, optional=True)
        check_callable("transform", transform, optional=True)
        self.transform = transform
        self.classes = None if classes is None else {c: i for i, c in enumerate(classes)}
        self.allow_empty_readers = bool(allow_empty_readers)
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.epoch = 0
        self._reader: _Reader | None = None
        self._restore: dict[int, dict[str, Any]] = {}

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch``; every rank must call it with the same value for exactly-once delivery.

        A state loaded for this same epoch is kept (a training loop calls ``set_epoch`` at the top of
        the epoch it resumes); for another epoch it is dropped.
        """
        epoch = check_int("epoch", epoch, ge=0)
        if epoch != self.epoch:
            self._restore = {}
        self.epoch = epoch

    def shard_order(self) -> list[int]:
        """This epoch's shard order (indexes into ``shards``), the same on every rank."""
        return self._order(self.epoch)

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.shards)))
        rng = np.random.default_rng([self.seed, epoch, _SHARD_STREAM, 0])
        return [int(i) for i in rng.permutation(len(self.shards))]

    def shards_for(self, slot: ReaderSlot) -> list[int]:
        """The shards ``slot`` reads this epoch, in reading order; refuses a layout that starves readers."""
        if len(self.shards) < slot.count and not self.allow_empty_readers:
            raise LayoutError(f"ShardedTarStream: {len(self.shards)} shard(s) for {slot.count} readers "
                              f"({slot.world_size} rank(s) x {slot.num_workers} worker(s)): some readers would "
                              f"get no shard. Split the data into at least {slot.count} shards, or use fewer "
                              "workers or ranks (or pass allow_empty_readers=True to accept idle readers)")
        return self.shard_order()[slot.index::slot.count]

    def open_shard(self, s: int) -> _ShardIndex:
        path = self.shards[s]
        tar_path = gunzip_cached(path, default_cache_dir(self.cache_dir)) if is_gzip(path) else path
        return _ShardIndex(path, tar_path, self.classes)

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        return self.iter_reader(current_reader(self.rank, self.world_size))

    def iter_reader(self, slot: ReaderSlot) -> Iterator[tuple[Any, int]]:
        """The samples reader ``slot`` delivers this epoch (resuming from ``load_state_dict`` if given)."""
        shards = self.shards_for(slot)
        position = self._restore.pop(slot.index, None)
        if position is not None and int(position["readers"]) != slot.count:
            raise LayoutError(f"ShardedTarStream: the saved state was taken with {position['readers']} readers "
                              f"but this is {slot.describe()}: resume with the same ranks and workers")
        reader = _Reader(self, slot, shards, position)
        self._reader = reader
        return self._deliver(reader)

    def _deliver(self, reader: _Reader) -> Iterator[tuple[Any, int]]:
        try:
            while (ref := reader.next()) is not None:
                yield reader.sample(ref)
        finally:
            reader.close()

    def state_dict(self) -> dict[str, Any]:
        """Where this process's reader is: {reader index: position}, plus what must match on resume.

        A position is (cursor into the reader's shards, the shard, the next member, the buffered
        references, the buffer's random state): small and JSON-ready. States from several
        processes merge by uniting their ``readers`` dicts. A reader with no saved position starts
        the epoch from its beginning. ``shard_names`` hashes the list's file names in order.
        """
        readers = {}
        if self._reader is not None:
            readers[self._reader.slot.index] = {**self._reader.position(), "readers": self._reader.slot.count}
        return {"version": STATE_VERSION, "epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "num_shards": len(self.shards),
                "shard_names": _names_digest(self.shards), "readers": readers}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration of each saved reader continues where it was.

        Every saved position is checked first (``_stream_state``): a bad one is one ``StateError`` naming
        the reader and the field, and the stream keeps the state it had. A state of another shard list (other
        names or order) is refused in one line.
        """
        if not isinstance(state, Mapping):
            raise StateError(f"ShardedTarStream.load_state_dict: expected the dict state_dict() returned, got "
                             f"{type(state).__name__}", "state", state)
        if state.get("version") != STATE_VERSION:
            raise ArgumentError(f"ShardedTarStream: state version {state.get('version')!r}, expected {STATE_VERSION}")
        mine = {"seed": self.seed, "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
                "num_shards": len(self.shards)}
        differ = [f"{k} {state.get(k)!r} (now {v!r})" for k, v in mine.items() if state.get(k) != v]
        if differ:
            raise ArgumentError("ShardedTarStream: the state was saved with other settings: " + ", ".join(differ))
        if "shard_names" in state and state["shard_names"] != _names_digest(self.shards):
            raise ArgumentError("ShardedTarStream: the state was saved with another shard list (other file names, or "
                                "the same in another order), so its positions would read other samples: pass the "
                                "list it was saved with, in the same order (e.g. sorted(glob(...)))")
        epoch = check_int("epoch", state.get("epoch"), ge=0)
        self._restore = checked_positions(state.get("readers"), self._order(epoch),
                                          self.shuffle_buffer if self.shuffle else 1)
        self.epoch = epoch

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # open files stay with the process that opened them
        return state

    def __repr__(self) -> str:
        return (f"ShardedTarStream({len(self.shards)} shards, shuffle={self.shuffle}, seed={self.seed}, "
                f"epoch={self.epoch}, shuffle_buffer={self.shuffle_buffer})")
