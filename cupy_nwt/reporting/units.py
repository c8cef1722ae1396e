"""Byte sizes in and out ('4KiB', '64M', '1.5GB' <-> ints), the size sweeps built from them, and counts in words."""

from __future__ import annotations

import re

from ..errors import ArgumentError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse '4KiB', '64M' (binary) or '1GB' (decimal) into a positive byte count.

    Args:
        text: the size as written (a bare number is bytes), or already an int.
    """
    if isinstance(text, bool):  # an int to Python, never a size: a flag passed where a size goes
        raise ArgumentError(f"not a size: {text!r} (examples: 4096, 4KiB, 64M, 1GB)")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ArgumentError(f"not a size: {text!r} (examples: 4096, 4KiB, 64M, 1GB)")
        exact = float(m.group(1)) * _UNITS[unit]
        if 0 < exact < 1:
            raise ArgumentError(f"size must be at least 1 byte, got {text!r} ({exact:g} bytes)")
        value = int(exact)
    if value <= 0:
        raise ArgumentError(f"size must be positive, got {text!r}")
    return value


def size_sweep(lo: int, hi: int, factor: int = 2) -> list[int]:
    """Sizes lo, lo*factor, ... up to and including hi (hi itself is always the last).

    Args:
        lo: the first size, bytes (> 0).
        hi: the last size, bytes (>= lo).
        factor: the step between sizes (>= 2).
    """
    if lo <= 0 or hi < lo:
        raise ArgumentError(f"bad size range {lo}..{hi}: need 0 < min <= max")
    if factor < 2:
        raise ArgumentError("sweep factor must be >= 2")
    out, n = [], lo
    while n < hi:
        out.append(n)
        n *= factor
    out.append(hi)
    return out


def fmt_bytes(n: float) -> str:
    """Binary units, short: 4096 -> '4 KiB', 3.5e6 -> '3.3 MiB'.

    Args:
        n: a byte count.
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        shown = round(n) if unit == "B" or float(n).is_integer() else round(n, 1)
        if abs(shown) < 1024 or unit == "TiB":  # as printed: 1023.96 KiB would print 1024.0 KiB
            return f"{n:.0f} {unit}" if unit == "B" or float(n).is_integer() else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 worker', '2 workers', '0 workers': counts in messages read as English.

    Args:
        n: the count.
        word: the noun for one.
        many: the noun for several, where it is not ``word`` + "s".
    """
    return f"{n} {word if n == 1 else many or word + 's'}"
