"""cupy-nwt (or python -m cupy_nwt): one sub-command per experiment.

Every failure a user can cause or meet (bad input, no GPU, bad data, a dead worker) ends as one
line on stderr and its own exit code (``EXIT_CODES``), never a traceback unless ``--debug`` (or
``CUPY_NWT_DEBUG=1``) asks for one.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

from .commands import build_parser
from .exits import (
    DEBUG_ENV,
    EXIT_BAD_DATA,
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_GPU,
    EXIT_USAGE,
    EXIT_WORKER,
    failure,
)

__all__ = ["DEBUG_ENV", "EXIT_BAD_DATA", "EXIT_CODES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NO_GPU", "EXIT_USAGE",
           "EXIT_WORKER", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error ends as one line and a code
        code, line = failure(exc, args)
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exception(exc)
        print(f"cupy-nwt {args.command}: {line}", file=sys.stderr)
        return code
