"""An epoch's bad samples: the ones ``on_bad_sample="skip"`` left out, counted against ``max_bad_samples``.

A sample that fails to read or decode (``workers.maker.BAD_SAMPLE_ERRORS``) is left out where its batch
is made, and the batch comes shorter, as WebDataset's handlers make it; a batch whose every sample
failed does not come at all. The source that receives the batch hands each left-out sample here: it
is announced (``skipped``: logged once, with its file and reason, and counted in ``stats()``), and the
epoch stops with ``TooManyBadSamplesError`` once more than the limit failed in it. Resuming stays
exact: a batch that did not come was never delivered, so a saved state has it still to come, and the
resumed epoch reads its samples again (and leaves them out again if they still fail).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import TooManyBadSamplesError
from .._events import Listener, SkippedSample
from ..workers.messages import BadSample


class BadSampleCount:
    """One epoch's skipped samples: announced to ``events`` and counted against ``limit`` (None: none)."""

    def __init__(self, epoch: int, limit: int | None, events: Listener | None) -> None:
        self.epoch, self.limit, self.events = epoch, limit, events
        self.count = 0

    def add(self, batch_index: int, samples: Sequence[BadSample]) -> None:
        """Samples left out of batch ``batch_index``; raises once the epoch has more than the limit."""
        for key, source, reason in samples:
            self.count += 1
            if self.events is not None:
                self.events.skipped(SkippedSample(self.epoch, batch_index, key, source, reason))
        if self.limit is not None and self.count > self.limit and samples:
            _, source, reason = samples[-1]
            raise TooManyBadSamplesError(
                f"{self.count} samples failed to read or decode in epoch {self.epoch}, more than "
                f"max_bad_samples={self.limit}: the epoch stops (the last: {source}: {reason})")
