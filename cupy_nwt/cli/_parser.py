"""The ``cupy-nwt`` parser's own voice: a bad option is one line on stderr and exit 2, like every other error.

argparse's default prints the whole usage block (up to a dozen lines) before its message, and says
"expected one argument" for ``--min -4KiB``, where the value was given but read as an option. Here
the message names the option, what is wrong and where the help is; ``--help`` is unchanged.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import IO, NoReturn

from .exits import EXIT_USAGE

_ARGUMENT = re.compile(r"^argument ([^:]+): ")
_CHOICE = re.compile(r"invalid choice: (.+?) \(choose from (.+)\)$")


def one_line(message: str, prog: str) -> str:
    """argparse's ``message`` for ``prog`` as the one line the CLI prints."""
    match = _ARGUMENT.match(message)
    option = match.group(1).split("/")[0] if match else ""
    text = message[match.end():] if match else message
    if text == "expected one argument":
        text = f"needs a value (one that starts with '-' is written {option}=VALUE)"
    choice = _CHOICE.search(text)
    if choice:
        names = ", ".join(c.strip().strip("'") for c in choice.group(2).split(","))
        text = f"invalid choice {choice.group(1)} (choose from {names})"
    text = " ".join(text.split())
    return f"{prog}: {option + ': ' if option else ''}{text}; see {prog} --help"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``one_line``) and exit 2; its sub-commands are too."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, one_line(message, self.prog) + "\n")

    def short_help(self, commands: dict[str, str], file: IO[str] | None = None) -> None:
        """The usage line and one line per command (``commands``: name to help), for a bare ``cupy-nwt``."""
        width = max(map(len, commands))
        lines = [self.format_usage().rstrip(), "", "commands:"]
        lines += [f"  {name.ljust(width)}  {text}" for name, text in commands.items()]
        lines += ["", f"see {self.prog} --help, or {self.prog} COMMAND --help"]
        print("\n".join(lines), file=file or sys.stdout)
