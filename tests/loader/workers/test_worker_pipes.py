"""The workers' pipe framing: what ``pipes.send`` writes a ``Connection`` reads, and what a ``Connection``
sends an ``Inbox`` takes, whole, however the messages are cut by the pipe."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest
from test_faults import clean  # noqa: F401 - the fixture used below

from cupy_nwt.loader.workers import pipes
from cupy_nwt.loader.workers.messages import Ok, Task


def test_send_is_read_by_a_connection_small_and_past_the_pipe_capacity():
    r, w = mp.Pipe(duplex=False)
    big = bytes(range(256)) * 2048  # 512 KiB: several pipe capacities, written while the reader reads
    writer = threading.Thread(target=lambda: [pipes.send(w.fileno(), m) for m in ("a", big, ("t", 1))])
    writer.start()
    assert [r.recv(), r.recv(), r.recv()] == ["a", big, ("t", 1)]
    writer.join()


def test_inbox_takes_every_whole_message_and_reads_a_cut_one_to_its_end():
    r, w = mp.Pipe(duplex=False)
    inbox = pipes.Inbox(r.fileno())
    for m in (1, "two", [3]):
        w.send(m)
    assert inbox.take() == [1, "two", [3]]
    big = np.arange(100_000, dtype=np.int64)  # 800 KB: arrives in pieces
    writer = threading.Thread(target=w.send, args=(big,))
    writer.start()
    got: list = []
    while not got:
        got = inbox.take()
    writer.join()
    assert len(got) == 1 and np.array_equal(got[0], big)
    w.close()
    with pytest.raises(EOFError):
        inbox.take()


def test_task_and_ok_cross_as_plain_tuples():
    task = Task(3, 7, 1, np.arange(64, dtype=np.int64)[10:20], 99)
    back = Task.from_wire(task.wire())
    assert (back.generation, back.batch_index, back.slot, back.transform_seed) == (3, 7, 1, 99)
    assert back.indices.tolist() == list(range(10, 20))
    odd = Task(3, 7, 1, np.array([1.5, 2.5]), 0)  # not int64: travels as the array itself
    assert Task.from_wire(odd.wire()).indices.tolist() == [1.5, 2.5]
    assert Ok(1, 2, 3, 4).wire() == (1, 2, 3, 4, None)


def _open_fds() -> set[str]:
    import os  # noqa: PLC0415

    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            out.add((name, os.readlink(f"/proc/self/fd/{name}")))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return out


spill_only = pytest.mark.skipif(not pipes.CAN_SPILL, reason="memfd_create and SCM_RIGHTS are Linux's")


@spill_only
def test_large_arrays_leave_the_pipe_through_a_file_and_arrive_writable_and_equal():
    import socket  # noqa: PLC0415

    r, w = mp.Pipe(duplex=False)
    mine, theirs = socket.socketpair()
    inbox = pipes.Inbox(r.fileno(), mine)
    before = _open_fds()
    batch = {"image": np.arange(3 * 224 * 224 * 8, dtype=np.uint8).reshape(8, 3, 224, 224),
             "label": np.arange(8), "name": "b0", "strided": np.arange(40_000, dtype=np.float64)[::2]}
    writer = threading.Thread(target=pipes.send, args=(w.fileno(), ("whole", batch), theirs))
    writer.start()
    got: list = []
    while not got:
        got = inbox.take()
    writer.join()
    kind, back = got[0]
    assert kind == "whole" and back["name"] == "b0"
    for key in ("image", "label", "strided"):
        assert np.array_equal(back[key], batch[key]) and back[key].dtype == batch[key].dtype
    back["image"][0, 0, 0, 0] = 255  # the caller may write to its batch, as to one pickled whole
    assert batch["image"][0, 0, 0, 0] == 0
    root = back["image"]
    while isinstance(root, np.ndarray):
        root = root.base
    assert isinstance(root, memoryview)  # read from the file into one buffer, not unpickled out of the pipe
    del back, got, root
    import gc  # noqa: PLC0415

    gc.collect()
    assert _open_fds() == before  # the file was closed once read
    for end in (mine, theirs, r, w):
        end.close()


@spill_only
def test_small_messages_stay_in_the_pipe_when_a_spill_socket_is_given():
    import socket  # noqa: PLC0415

    r, w = mp.Pipe(duplex=False)
    mine, theirs = socket.socketpair()
    pipes.send(w.fileno(), ("small", np.arange(100)), theirs)
    mine.setblocking(False)
    with pytest.raises(BlockingIOError):
        mine.recv(1)  # nothing was handed over the socket
    kind, arr = pipes.Inbox(r.fileno(), mine).take()[0]
    assert kind == "small" and arr.tolist() == list(range(100))
    for end in (mine, theirs, r, w):
        end.close()


@spill_only
def test_a_spilled_message_without_a_socket_to_take_it_is_a_closed_pipe():
    import socket  # noqa: PLC0415

    r, w = mp.Pipe(duplex=False)
    mine, theirs = socket.socketpair()
    writer = threading.Thread(target=pipes.send, args=(w.fileno(), np.zeros(1 << 17, np.uint8), theirs))
    writer.start()
    inbox = pipes.Inbox(r.fileno())
    with pytest.raises(EOFError, match="spill"):
        while not inbox.take():
            pass
    writer.join()
    for end in (mine, theirs, r, w):
        end.close()


class Frames:
    """Samples of 64 KiB: every batch's array is past a pipe's capacity."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return np.full((128, 128, 4), i, np.uint8)


@spill_only
@pytest.mark.usefixtures("clean")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_loader_s_large_first_batches_arrive_whole_and_keep_no_descriptor(method):
    from cupy_nwt import DataLoader  # noqa: PLC0415

    with DataLoader(Frames(), batch_size=2, num_workers=3, device="cpu", multiprocessing_context=method) as dl:
        kept = list(dl)  # batches 0-2 were made before the ring: their arrays came through files
    assert [int(b[0, 0, 0, 0]) for b in kept] == list(range(0, 32, 2))
    assert all((b[1] == i * 2 + 1).all() for i, b in enumerate(kept))
    held = [link for _, link in _open_fds() if "cupy_nwt-batch" in link]
    assert held == []  # a caller may keep every batch: none holds a descriptor
    assert _mapped_batch_files() >= 1  # the first batches are mapped from their files, not copied
    del kept
    import gc  # noqa: PLC0415

    gc.collect()
    assert _mapped_batch_files() == 0  # and unmapped once the caller lets them go


def _mapped_batch_files() -> int:
    with open("/proc/self/maps") as f:
        return sum("cupy_nwt-batch" in line for line in f)


@spill_only
def test_without_a_file_to_spill_into_the_pipe_takes_the_whole_message(monkeypatch):
    import errno  # noqa: PLC0415
    import os  # noqa: PLC0415
    import socket  # noqa: PLC0415

    def refused(*args):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "memfd_create", refused)
    r, w = mp.Pipe(duplex=False)
    mine, theirs = socket.socketpair()
    big = np.arange(1 << 15, dtype=np.int64)  # 256 KiB: would spill
    writer = threading.Thread(target=pipes.send, args=(w.fileno(), ("whole", big), theirs))
    writer.start()
    assert r.recv()[1].tolist() == big.tolist()  # a plain frame: a Connection reads it
    writer.join()
    for end in (mine, theirs, r, w):
        end.close()
