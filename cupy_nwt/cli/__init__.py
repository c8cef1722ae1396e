"""cupy-nwt (or python -m cupy_nwt): one sub-command per experiment.

Every failure a user can cause or meet (bad input, no GPU, bad data, a dead worker) ends as one
line on stderr and its own exit code (``EXIT_CODES``), never a traceback unless ``--debug`` (or
``CUPY_NWT_DEBUG=1``) asks for one.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

from ._parser import one_line
from .commands import COMMANDS, build_parser
from .exits import (
    DEBUG_ENV,
    EXIT_BAD_DATA,
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_GPU,
    EXIT_PIPE,
    EXIT_USAGE,
    EXIT_WORKER,
    failure,
)

__all__ = ["DEBUG_ENV", "EXIT_BAD_DATA", "EXIT_CODES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NO_GPU", "EXIT_PIPE",
           "EXIT_USAGE", "EXIT_WORKER", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: ``sys.argv[1:]``) and return its exit code.

    A bad option exits 2 with one line (``SystemExit``, as argparse does); no command prints the short
    help on stdout and returns 2, since nothing asked for was done.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        try:
            parser.short_help(COMMANDS)
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
            return EXIT_PIPE
        except OSError as exc:  # a full disk or /dev/full
            _quiet_stdout()
            print(f"{parser.prog}: cannot write the help: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_USAGE
    if extra:
        prog = f"{parser.prog} {args.command}"
        parser.exit(EXIT_USAGE, one_line(f"unrecognized arguments: {' '.join(extra)}", prog) + "\n")
    empty = [name for name, value in vars(args).items() if value == ""]
    if empty:
        prog = f"{parser.prog} {args.command}"
        option = "--" + empty[0].replace("_", "-")
        parser.exit(EXIT_USAGE, one_line(f"{option} needs a value, got an empty string", prog) + "\n")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(args.command)
            return int(args.func(args) or 0)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_PIPE
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every error ends as one line and a code
        code, line = failure(exc, args)
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exception(exc)
        print(f"cupy-nwt {args.command}: {line}", file=sys.stderr)
        return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and the interpreter's last flush must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _one_line_warning(command: str) -> Callable[..., None]:
    """A command's warnings as its errors are: one line each, named by the command, without the source line."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
             line: str | None = None) -> None:
        print(f"cupy-nwt {command}: warning: {' '.join(str(message).split())}", file=sys.stderr)
    return show
