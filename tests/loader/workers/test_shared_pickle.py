"""forkserver and spawn workers get the dataset's large arrays through one shared file, not a copy each.

Pickled to each worker, a 154 MB in-memory dataset goes through pickle and a pipe once per worker (4.3 s
to the first batch at 8 forkserver workers on the 2-vCPU VM) and every worker holds its own copy. The semantics must
stay those of a fork: a worker that writes to the array changes only its own copy, a read-only array
stays read-only, and a worker started after the main process changed the array sees the change.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings

import numpy as np
import pytest

from cupy_nwt import DataLoader, pack_records
from cupy_nwt.loader import MemoryGrowthWarning
from cupy_nwt.loader.workers.shared_pickle import MEMFD_NAME, OUT_OF_BAND_BYTES, SharedPickles

ROWS = 4096  # rows of 16 KiB: a 64 MiB array


class Rows:
    """Row i holds i everywhere; a read writes into the row first when ``scribble`` (a dataset that caches in place)."""

    def __init__(self, rows: int = ROWS, scribble: bool = False, readonly: bool = False) -> None:
        self.data = np.repeat(np.arange(rows, dtype=np.int64)[:, None], 2048, axis=1)
        self.data.flags.writeable = not readonly
        self.scribble = scribble

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[int, int, bool]:
        row = self.data[i]
        first, last = int(row[0]), int(row[-1])
        if self.scribble:
            row[:] = -1
        return first, last, bool(self.data.flags.writeable)


class Counted:
    """A dataset holding a process-shared counter: it must still reach the workers by the spawn rules."""

    def __init__(self, ctx) -> None:
        self.data = np.zeros((ROWS, 2048), np.int64)
        self.reads = ctx.Value("i", 0)  # its descriptor goes to one worker: the pickle is made for each
        self.paths = Paths(20_000).samples

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        with self.reads.get_lock():
            self.reads.value += 1
        return i


def anonymous_bytes(pid: int) -> int:
    """Process ``pid``'s anonymous memory: a copy of its own (with what it shares copy-on-write with the
    process it forked from), not a shared file's pages, which ``Private_Dirty`` would count too."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Anonymous:"))


def held_worker_array_files(pid: int) -> int:
    """Descriptors of the shared file that process ``pid`` still holds open."""
    fd_dir = f"/proc/{pid}/fd"
    return sum(MEMFD_NAME in os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)
               if os.path.exists(os.path.join(fd_dir, fd)))


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_every_sample_arrives_and_workers_writing_the_array_change_only_their_copy(method):
    ds = Rows(scribble=True)
    held_before = held_worker_array_files(os.getpid())  # a loader of an earlier test may await the collector
    with DataLoader(ds, batch_size=256, num_workers=2, multiprocessing_context=method, shuffle=True, seed=1) as dl:
        first, last, _ = (np.concatenate(c) for c in zip(*dl))
    assert sorted(first.tolist()) == list(range(ROWS))  # each row read before its worker's own write
    assert (first == last).all()
    assert (ds.data == np.arange(ROWS)[:, None]).all()  # the main process's array is untouched
    assert held_worker_array_files(os.getpid()) <= held_before  # this loader's file is closed


def test_a_read_only_array_stays_read_only_in_the_worker():
    with DataLoader(Rows(rows=512, readonly=True), batch_size=128, num_workers=1,
                    multiprocessing_context="forkserver") as dl:
        writeable = np.concatenate([w for _, _, w in dl])
    assert not writeable.any()


def test_the_workers_share_the_array_rather_than_hold_a_copy_each():
    def workers_anonymous(ds: Rows) -> int:
        with DataLoader(ds, batch_size=512, num_workers=2, multiprocessing_context="forkserver",
                        persistent_workers=True) as dl:
            assert sum(len(b[0]) for b in dl) == len(ds)  # every row read, so every page of the array touched
            return max(anonymous_bytes(p) for p in dl.worker_pids())

    small, big = Rows(rows=64), Rows()
    grown = workers_anonymous(big) - workers_anonymous(small)
    assert grown < big.data.nbytes / 2, f"a worker's own memory grew {grown} bytes with a {big.data.nbytes}-byte array"


class Paths:
    """An image folder's sample list (about 4 MB pickled); counts, in this process, how often it is pickled."""

    pickled = 0

    def __init__(self, n: int = 60_000) -> None:
        self.samples = [(f"/data/train/n{i % 1000:08d}/image_{i:08d}.JPEG", i % 1000) for i in range(n)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path, label = self.samples[i]
        return int(path[-13:-5]), label

    def __getstate__(self) -> dict:
        type(self).pickled += 1
        return self.__dict__


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_large_sample_list_is_pickled_once_for_all_the_workers(method):
    ds = Paths()
    Paths.pickled = 0
    with DataLoader(ds, batch_size=1000, num_workers=2, multiprocessing_context=method, shuffle=True, seed=2) as dl:
        index, label = (np.concatenate(c) for c in zip(*dl))
    assert sorted(index.tolist()) == list(range(len(ds))) and (label == index % 1000).all()
    assert Paths.pickled == 1


def test_a_large_list_index_says_once_that_each_worker_keeps_its_own_copy_and_what_to_do():
    ds = Paths(400_000)  # about 27 MB pickled: each worker unpickles it into objects of its own
    with pytest.warns(MemoryGrowthWarning, match=r"^each forkserver worker unpickles \d+ MB of the dataset's Python "
                                                 r"objects .* keep a large index in NumPy arrays") as caught:
        with DataLoader(ds, batch_size=50_000, num_workers=2, multiprocessing_context="forkserver") as dl:
            index, _ = (np.concatenate(c) for c in zip(*dl))
    assert sorted(index.tolist()) == list(range(len(ds)))  # a warning, not a refusal: every sample still arrives
    assert sum(issubclass(w.category, MemoryGrowthWarning) for w in caught) == 1


class Records:
    """A dataset over records as users hold them: a list of dicts, or those packed by ``pack_records``."""

    def __init__(self, records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> int:
        return int(self.records[i]["label"])


def test_the_advice_works_packed_records_reach_the_workers_without_the_warning():
    records = [{"path": f"/data/train/image_{i:08d}.JPEG", "label": i} for i in range(400_000)]
    seen = {}
    for kind, held in (("list", records), ("packed", pack_records(records))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with DataLoader(Records(held), batch_size=50_000, num_workers=2, multiprocessing_context="spawn") as dl:
                seen[kind] = sorted(np.concatenate(list(dl)).tolist())
        seen[kind + " warned"] = [w for w in caught if issubclass(w.category, MemoryGrowthWarning)]
    assert seen["list"] == seen["packed"] == list(range(400_000))
    assert len(seen["list warned"]) == 1 and "each spawn worker" in str(seen["list warned"][0].message)
    assert seen["packed warned"] == []


class Pieces:
    """Rows held as 64 arrays of 512 KiB each (32 MiB): each small enough to travel in the pickle."""

    def __init__(self) -> None:
        self.pieces = [np.full((32, 2048), i, np.int64) for i in range(64)]

    def __len__(self) -> int:
        return len(self.pieces) * 32

    def __getitem__(self, i: int) -> tuple[int, int, bool]:
        row = self.pieces[i // 32][i % 32]
        return int(row[0]), int(row[-1]), True


def copy_on_write_rows(path) -> Rows:
    """``Rows`` whose array is a memmap opened ``"c"``: its 32 MiB travel in the pickle, whatever the protocol."""
    rows = Rows(rows=2048)
    rows.data.tofile(path)
    rows.data = np.memmap(path, np.int64, mode="c", shape=rows.data.shape)
    return rows


@pytest.mark.parametrize("held", ["one array", "small arrays", "copy-on-write memmap"])
def test_array_data_is_not_a_private_copy_worth_the_line(tmp_path, held):
    ds = {"one array": lambda: Rows(rows=2048), "small arrays": Pieces,
          "copy-on-write memmap": lambda: copy_on_write_rows(tmp_path / "rows.bin")}[held]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DataLoader(ds, batch_size=512, num_workers=1, multiprocessing_context="forkserver") as dl:
            first = np.concatenate([f for f, _, _ in dl])
    assert len(first) == 2048
    assert not [w for w in caught if issubclass(w.category, MemoryGrowthWarning)]


def test_a_dataset_holding_a_process_shared_value_still_reaches_the_workers():
    ctx = mp.get_context("forkserver")
    ds = Counted(ctx)
    with DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=ctx) as dl:
        assert sorted(np.concatenate(list(dl)).tolist()) == list(range(64))
    assert ds.reads.value == 64


def test_without_memfd_the_arrays_travel_in_the_pickle(monkeypatch):
    def refuse(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", refuse)
    with DataLoader(Rows(rows=512, scribble=True), batch_size=128, num_workers=1,
                    multiprocessing_context="forkserver") as dl:
        assert sorted(np.concatenate([f for f, _, _ in dl]).tolist()) == list(range(512))


def test_an_unchanged_array_is_written_once_and_a_changed_one_again():
    big = np.arange(OUT_OF_BAND_BYTES // 8 * 3, dtype=np.int64)
    pickles = SharedPickles()
    try:
        offset = pickles.place(memoryview(big).cast("B"))
        size = pickles.size
        assert offset is not None and size >= big.nbytes
        assert os.pread(pickles.fd, big.nbytes, offset) == big.tobytes()
        assert pickles.place(memoryview(big).cast("B")) == offset and pickles.size == size  # nothing written
        big[7] = -7
        moved = pickles.place(memoryview(big).cast("B"))
        assert moved is not None and moved != offset and pickles.size > size
        assert os.pread(pickles.fd, big.nbytes, moved) == big.tobytes()  # a later worker sees the change
    finally:
        pickles.close()


class TensorAndArray:
    """A torch tensor beside a large NumPy array: torch's own reducers must still carry the tensor."""

    def __init__(self) -> None:
        import torch

        self.tensor = torch.arange(ROWS, dtype=torch.float32)
        self.array = Rows().data

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> tuple[float, int]:
        return float(self.tensor[i]), int(self.array[i, -1])


def test_a_dataset_with_a_torch_tensor_beside_a_large_array_arrives_whole():
    pytest.importorskip("torch", reason="torch is a test extra")
    with DataLoader(TensorAndArray(), batch_size=512, num_workers=2, multiprocessing_context="forkserver") as dl:
        tensor_part, array_part = (np.concatenate(c) for c in zip(*dl))
    assert (tensor_part == np.arange(ROWS)).all() and (array_part == np.arange(ROWS)).all()


class UsersData:
    """A user's dataset: a large array, a torch tensor, and a torch random op in ``__getitem__``."""

    def __init__(self) -> None:
        import torch

        self.images = Rows().data
        self.scale = torch.ones(ROWS)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> tuple[int, float]:
        import torch

        jitter = int(torch.randint(0, 1, (1,)))  # always 0: stands for a torch augmentation's draw
        return int(self.images[i, 0]) + jitter, float(self.scale[i])


@pytest.mark.parametrize("library", ["cupy_nwt", "torch"])
def test_a_user_s_loop_breaks_then_runs_whole_epochs_and_resumes_under_forkserver(library):
    torch = pytest.importorskip("torch", reason="torch is a test extra")
    ds = UsersData()
    make = DataLoader if library == "cupy_nwt" else torch.utils.data.DataLoader
    dl = make(ds, batch_size=256, num_workers=2, multiprocessing_context="forkserver", shuffle=True,
              **({"seed": 3} if library == "cupy_nwt" else {"generator": torch.Generator().manual_seed(3)}))

    def rows(batches) -> list[int]:
        return [int(x) for b in batches for x in np.asarray(b[0])]

    it = iter(dl)
    seen = rows([next(it), next(it)])
    state = dl.state_dict() if library == "cupy_nwt" else None
    del it  # the user's break
    assert sorted(rows(dl)) == list(range(ROWS))  # the next epoch is whole
    if state is not None:
        resumed = DataLoader(ds, batch_size=256, num_workers=2, multiprocessing_context="forkserver", shuffle=True,
                             seed=3)
        resumed.load_state_dict(state)
        assert sorted(seen + rows(resumed)) == list(range(ROWS))  # every sample once across the stop
        resumed.close()
        dl.close()
