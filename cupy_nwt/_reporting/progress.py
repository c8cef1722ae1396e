"""Progress on stderr: a tqdm bar on a terminal, one plain line per step anywhere else.

A bar redraws itself with carriage returns, which a log file or CI console keeps as one long line
of ``\\r`` frames; so when the stream is not a terminal each step is printed as a line instead.
Every command and search that shows progress goes through :class:`Progress`.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Progress:
    """``step(label)`` once per unit of work; ``close()`` (or a ``with`` block) at the end.

    ``total`` may be None when the number of steps is not known in advance (the fast search).
    Disabled (``enabled=False``), every call does nothing, so callers need no ``if``.
    """

    def __init__(self, total: int | None, desc: str, *, unit: str = "step", enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self._bar = None
        if enabled and is_terminal(self.stream):
            from tqdm import tqdm  # noqa: PLC0415 - only when a bar is drawn

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=False, dynamic_ncols=True)

    def step(self, label: str = "") -> None:
        if not self.enabled:
            return
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
            return
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        print(f"{self.desc} {count}" + (f": {label}" if label else ""), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
