"""A dataset class of the user's own holding a ``np.memmap``, under forkserver and spawn workers.

NumPy pickles a memmap's whole content in band, so a 64 MiB file went to every worker as 64 MiB of pickle
(a file larger than memory: never). A memmap of a file is now mapped again in each worker, as a fork
would share it; what the main process wrote into a copy-on-write (``"c"``) memmap is in its own pages
only, and must still reach the workers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_shared_pickle import anonymous_bytes

from cupy_nwt import DataLoader
from cupy_nwt.errors import DataFileError

ROWS = 4096  # rows of 16 KiB: a 64 MiB file


def rows_file(tmp_path: Path, rows: int = ROWS) -> Path:
    path = tmp_path / f"rows-{rows}.bin"
    np.repeat(np.arange(rows, dtype=np.int64)[:, None], 2048, axis=1).tofile(path)
    return path


class MappedRows:
    """Row i of the file holds i everywhere; ``skip`` rows from the top are left out (a memmap slice)."""

    def __init__(self, path: Path | str, mode: str = "r", skip: int = 0) -> None:
        rows = Path(path).stat().st_size // (2048 * 8)
        self.data = np.memmap(path, dtype=np.int64, mode=mode, shape=(rows, 2048))[skip:]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[int, int, str]:
        row = self.data[i]
        return int(row[0]), int(row[-1]), type(self.data).__name__


def _read(ds: MappedRows, method: str) -> tuple[np.ndarray, np.ndarray, set[str]]:
    with DataLoader(ds, batch_size=256, num_workers=2, multiprocessing_context=method) as dl:
        batches = list(dl)
    first, last = (np.concatenate([b[k] for b in batches]) for k in (0, 1))
    return first, last, {name for b in batches for name in b[2]}


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_every_row_of_a_memmap_slice_arrives_and_stays_a_memmap(tmp_path, method):
    first, last, kinds = _read(MappedRows(str(rows_file(tmp_path, 1024)), skip=100), method)  # by name, as most open it
    assert first.tolist() == list(range(100, 1024)) and (first == last).all()
    assert kinds == {"memmap"}


def test_the_main_processs_writes_into_a_copy_on_write_memmap_reach_the_workers(tmp_path):
    ds = MappedRows(rows_file(tmp_path, 1024), mode="c")
    ds.data[7] = -7  # in this process's pages only: the file still holds 7
    first, last, _ = _read(ds, "forkserver")
    assert first[7] == last[7] == -7 and first[8] == 8


def test_an_r_plus_memmap_shares_the_file_with_the_workers(tmp_path):
    path = rows_file(tmp_path, 1024)
    ds = MappedRows(path, mode="r+")
    ds.data[3] = 33  # in the file's pages: the workers map the same file
    first, _, _ = _read(ds, "forkserver")
    assert first[3] == 33 and first[4] == 4


def test_the_workers_map_the_file_rather_than_hold_a_copy_each(tmp_path):
    def workers_anonymous(ds: MappedRows) -> int:
        with DataLoader(ds, batch_size=512, num_workers=2, multiprocessing_context="forkserver",
                        persistent_workers=True) as dl:
            assert sum(len(b[0]) for b in dl) == len(ds)  # every row read, so every page of the file touched
            return max(anonymous_bytes(p) for p in dl.worker_pids())

    small, big = MappedRows(rows_file(tmp_path, 64)), MappedRows(rows_file(tmp_path))
    grown = workers_anonymous(big) - workers_anonymous(small)
    assert grown < big.data.nbytes / 2, f"a worker's own memory grew {grown} bytes with a {big.data.nbytes}-byte file"


def test_a_w_plus_memmap_reaches_the_workers_as_written_and_the_file_is_kept(tmp_path):
    """``"w+"`` creates the file: a worker opening it so again would empty it under the user."""
    path = tmp_path / "made.bin"
    made = np.memmap(path, dtype=np.int64, mode="w+", shape=(64, 2048))
    made[:] = np.arange(64)[:, None] + 1
    made.flush()
    ds = MappedRows.__new__(MappedRows)
    ds.data = made
    first, last, _ = _read(ds, "spawn")
    assert first.tolist() == list(range(1, 65)) and (first == last).all()
    assert np.fromfile(path, dtype=np.int64)[::2048].tolist() == list(range(1, 65))


@pytest.mark.parametrize("change", ["replaced", "cut"])
def test_a_file_replaced_or_cut_after_it_was_mapped_is_one_error_naming_it(tmp_path, change):
    """A re-export renamed over the file between opening the dataset and iterating it: the workers would read
    the new file while the main process holds the old one. Refused before any batch, in one line."""
    path = rows_file(tmp_path, 64)
    ds = MappedRows(path)
    if change == "replaced":
        np.full((64, 2048), -1, np.int64).tofile(tmp_path / "new.bin")
        (tmp_path / "new.bin").replace(path)
        expected = "was replaced by another file after the main process mapped it"
    else:
        with open(path, "r+b") as f:
            f.truncate(1000)
        expected = "was cut to 1000 bytes"
    with pytest.raises(DataFileError, match=expected) as err:
        _read(ds, "spawn")
    assert str(path) in str(err.value) and "failed on unpickling its dataset" in str(err.value)
