"""The readers' positions in a ``ShardedTarStream`` state, checked before a reader resumes from them.

A state comes back from a checkpoint, another rank or a hand edit. Taken as it is, a position
delivers the wrong samples without a word: a negative cursor reads the last shard again, a negative
member or buffered reference reads a member from the end, a reference into a shard the reader does
not own delivers another reader's sample twice, a cursor past the end ends the epoch early. So each
field is checked for its type and against the reader's own shards for the state's epoch; the first
bad one is one :class:`StateError` naming the reader and the field. What only the shard's index
knows (how many members it has) is checked when the reader opens it (:func:`past_end`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from ..errors import StateError

POSITION_KEYS = frozenset({"cursor", "shard", "member", "buffer", "rng", "readers"})


def _refuse(field: str, value: Any, why: str) -> NoReturn:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise StateError(f"ShardedTarStream.load_state_dict: {field}={shown}: {why}", field, value)


def _int(field: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` if it is an int in ``lo..hi`` (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        _refuse(field, value, f"expected an integer, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        _refuse(field, value, f"must be from {lo} to {hi}" if hi is not None else f"must be >= {lo}")
    return int(value)


def _reader_index(key: Any) -> int:
    """A ``readers`` key: an int, or its decimal string (what JSON makes of an int key)."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return _int("readers key", key, 0)


def checked_positions(readers: Any, order: list[int], buffer_size: int) -> dict[int, dict[str, Any]]:
    """The saved positions by reader index, each checked against the shards that reader reads in a
    shard ``order`` (the state's epoch) and a buffer of ``buffer_size`` slots."""
    if not isinstance(readers, Mapping):
        _refuse("readers", readers, f"expected a dict of reader positions, got {type(readers).__name__}")
    out: dict[int, dict[str, Any]] = {}
    for key, position in readers.items():
        r = _reader_index(key)
        out[r] = _checked_position(f"readers[{r}]", r, position, order, buffer_size)
    return out


def _checked_position(where: str, r: int, position: Any, order: list[int], buffer_size: int) -> dict[str, Any]:
    if not isinstance(position, Mapping):
        _refuse(where, position, f"expected a dict, got {type(position).__name__}")
    if set(position) != POSITION_KEYS:
        wrong = sorted(map(str, set(position) ^ POSITION_KEYS))
        _refuse(f"{where}.{wrong[0]}", position.get(wrong[0]),
                "missing" if wrong[0] in POSITION_KEYS else "not a field of a reader's position")
    count = _int(f"{where}.readers", position["readers"], r + 1)
    shards = order[r::count]
    cursor = _int(f"{where}.cursor", position["cursor"], 0, len(shards))
    current = shards[cursor] if cursor < len(shards) else None
    if position["shard"] != current or isinstance(position["shard"], bool):
        _refuse(f"{where}.shard", position["shard"], f"reader {r} of {count} reads shard {current} at cursor {cursor}")
    member = _int(f"{where}.member", position["member"], 0)
    buffer = position["buffer"]
    if not isinstance(buffer, list) or len(buffer) > buffer_size:
        _refuse(f"{where}.buffer", buffer, f"expected a list of at most {buffer_size} [shard, member] pairs")
    entered = set(shards[:cursor + 1])
    refs = []
    for i, ref in enumerate(buffer):
        if not isinstance(ref, (list, tuple)) or len(ref) != 2:
            _refuse(f"{where}.buffer[{i}]", ref, "expected a [shard, member] pair")
        s, j = _int(f"{where}.buffer[{i}][0]", ref[0], 0), _int(f"{where}.buffer[{i}][1]", ref[1], 0)
        if s not in entered or (s == current and j >= member):
            _refuse(f"{where}.buffer[{i}]", ref, f"not a member reader {r} has reached (its shards so far: "
                    f"{sorted(entered)}, up to member {member} of shard {current})")
        refs.append((s, j))
    if len(set(refs)) != len(refs):
        _refuse(f"{where}.buffer", buffer, "a member is buffered twice, so it would be delivered twice")
    try:
        np.random.Generator(np.random.PCG64()).bit_generator.state = position["rng"]
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        _refuse(f"{where}.rng", position["rng"], f"not a PCG64 random state ({exc})")
    return {**position, "buffer": [list(ref) for ref in refs]}


def past_end(shown: str, j: int, members: int) -> NoReturn:
    """Refuse a restored member index ``j`` that shard ``shown`` (of ``members`` members) does not hold: known
    only once the shard is indexed, so raised when the reader reaches it."""
    raise StateError(f"ShardedTarStream: the loaded state's member {j} of {shown} is past the shard's {members} "
                     "members (a state of other shards?)", "member", j)
