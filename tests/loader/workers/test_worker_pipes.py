"""The workers' pipe framing: what ``pipes.send`` writes a ``Connection`` reads, and what a ``Connection``
sends an ``Inbox`` takes, whole, however the messages are cut by the pipe."""

from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np
import pytest

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
