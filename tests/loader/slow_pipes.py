"""A torch DataPipe slow to walk, for the races of torch's pipe walks (imported only where torch is)."""

from __future__ import annotations

import time

import torch.utils.data as tud


class SlowToScan(tud.IterDataPipe):
    """A pipe whose state takes a while to read: torch reads it while it walks the graph to shard it,
    which leaves time for another reader to walk its own copy meanwhile."""

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        return iter(self.source)

    def __getstate__(self):
        time.sleep(0.05)
        return super().__getstate__()
