"""torch's out-of-order cases (``TestOutOfOrderDataLoader`` in ``test/test_dataloader.py``), on both loaders.

With ``in_order=False`` a worker stuck on a slow sample holds back only the tasks it already has: the
next batches go to the workers with room, and arrive first. With ``in_order=True`` (the default) the
batches arrive in order whatever is slow. The sleeps are torch's: half a second on one sample, against
nine samples that take microseconds, so the orders below do not depend on the machine's load.
"""

from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch", reason="these cases mirror torch's own tests")
import torch.utils.data as tud  # noqa: E402
from torch_suite_data import SlowAt, as_list, worker_info  # noqa: E402

pytestmark = pytest.mark.usefixtures("worker_type")


class SlowAtZero(tud.IterableDataset):
    """start .. end-1 split evenly between the workers; worker 0's first sample takes half a second."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        info = worker_info()
        per_worker = math.ceil((self.end - self.start) / info.num_workers)
        first = self.start + info.id * per_worker
        for i in range(first, min(first + per_worker, self.end)):
            if i == 0:
                time.sleep(0.5)
            yield i


def delivered(loader) -> list[int]:
    return [as_list(b)[0] for b in loader]


@pytest.mark.parametrize("in_order, want", [(True, list(range(10))),
                                            (False, [1, 3, 4, 5, 6, 7, 8, 9, 0, 2])])
def test_a_slow_sample_holds_back_only_its_workers_tasks_out_of_order(backend, in_order, want):
    """torch: TestOutOfOrderDataLoader.test_in_order_index_ds and test_out_of_order_index_ds. Worker 0
    is stuck on sample 0 with sample 2 already queued (prefetch_factor 2); out of order, every later
    sample goes to worker 1."""
    loader = backend(SlowAt(10, at=0), num_workers=2, prefetch_factor=2, in_order=in_order)
    assert delivered(loader) == want


@pytest.mark.parametrize("in_order, want", [(True, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]),
                                            (False, [5, 6, 7, 8, 9, 0, 1, 2, 3, 4])])
def test_a_slow_stream_holds_back_only_itself_out_of_order(backend, in_order, want):
    """torch: TestOutOfOrderDataLoader.test_in_order_iterable_ds and test_out_of_order_iterable_ds.
    Worker 0's stream (0..4) starts half a second late; out of order, worker 1's stream (5..9) is
    drained meanwhile."""
    loader = backend(SlowAtZero(0, 10), num_workers=2, in_order=in_order)
    assert delivered(loader) == want


def test_out_of_order_still_delivers_each_sample_once_over_epochs(backend):
    """Beyond torch's cases: three epochs of a shuffled dataset with a slow sample, out of order and
    with persistent workers, each deliver every sample exactly once."""
    loader = backend(SlowAt(24, at=5), batch_size=3, shuffle=True, num_workers=2, in_order=False,
                     persistent_workers=True)
    for _ in range(3):
        assert sorted(x for b in loader for x in as_list(b)) == list(range(24))
