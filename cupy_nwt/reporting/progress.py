"""ProgressBar on stderr: a tqdm bar on a terminal, a plain line now and then anywhere else.

A bar redraws itself with carriage returns, which a log file or CI console keeps as one long line
of ``\\r`` frames; so when the stream is not a terminal a step is printed as a line instead, at
most one every ``LINE_INTERVAL_S`` seconds (the first at once): a 4-second run of 200 fast steps
must not bury the log in 200 lines. Every command and search that shows progress goes through
:class:`ProgressBar`.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

LINE_INTERVAL_S = 3.0


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a bar is drawn there; elsewhere, a line now and then).

    Args:
        stream: any file-like object, closed or without ``isatty``.
    """
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


@functools.cache
def _quiet_tqdm() -> type:
    """tqdm without its monitor thread, which runs while a bar is drawn (and in tqdm 4.70 until the process
    ends): the tuner's trials and a loader's worker start fork workers under a bar, and a worker forked
    beside a thread may inherit a lock it held, locked (Python 3.12 warns of such a fork). The monitor
    only redraws a bar that skips redraws (``miniters`` > 1); ours sets 1, so it redraws once
    ``mininterval`` has passed."""
    from tqdm import tqdm  # noqa: PLC0415 - only when a bar is drawn

    return type("QuietTqdm", (tqdm,), {"monitor_interval": 0})


class ProgressBar:
    """``step(label)`` once per unit of work; ``close()`` (or a ``with`` block) at the end.

    ``total`` may be None when the number of steps is not known in advance (the fast search).
    Disabled (``enabled=False``), every call does nothing, so callers need no ``if``. Off a
    terminal a step prints a line only when ``interval`` seconds (by ``clock``; default
    ``LINE_INTERVAL_S``) have passed since the last line.

    Args:
        total: the steps to come, or None where unknown.
        desc: what the bar counts, shown before it.
        unit: the word for one step.
        enabled: False makes every call do nothing.
        stream: where it writes (default stderr).
        interval: seconds between lines off a terminal.
        clock: the clock those seconds are read from.
    """

    def __init__(self, total: int | None, desc: str, *, unit: str = "step", enabled: bool = True,
                 stream: TextIO | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self.interval, self._clock = LINE_INTERVAL_S if interval is None else interval, clock
        self._last: float | None = None
        self._bar = None
        if enabled and is_terminal(self.stream):
            self._bar = _quiet_tqdm()(total=total, desc=desc, unit=unit, file=self.stream, leave=False,
                                      dynamic_ncols=True, miniters=1)

    def step(self, label: str = "") -> None:
        if not self.enabled:
            return
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
            return
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return
        self._last = now
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        print(f"{self.desc} {count}" + (f": {label}" if label else ""), file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """One line of its own (above the bar on a terminal), whatever the interval; nothing when disabled."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
