"""What a saved pick may contain: every field of a stored tuning checked before it is trusted.

The store (``num_workers.json``) is a file anyone with the cache directory can write, and a crash,
a full disk or another tool can leave anything in it. A record reaches the loader as a worker
count and a worker type, so nothing in it is used until :func:`check_record` has passed it: the
schema, each field's type (``True`` is not a count, ``"4"`` is not a number), finite numbers, and
ranges (0 <= workers <= ``MAX_WORKERS``, a known worker type, device and strategy). Reading the
file itself is :func:`parse_document`: bounded in size, UTF-8, strict JSON (no ``NaN`` or
``Infinity``), no nesting deep enough to exhaust the parser. Either raises :class:`SavedPickError`
with one line saying what is wrong.

The objects built field by field (a run, another worker type's best, the fingerprint's machine and
work) may hold only the keys named here (``*_KEYS``): an unknown one would not build, so it is refused
with the rest of the damage. A record's own top level may carry more (what ``TuneResult.to_dict``
derives: ``why``, ``trials``; the command's ``verdict``): nothing reads them back.

Pure checks on decoded JSON, no dataclasses: both the store (``store_file.ResultStore``) and
``TuneResult.from_dict`` sit above this module; :func:`build` makes their dataclasses from what passed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import SavedPickError

MAX_WORKERS = 1024  # no machine we know of runs a loader with more; 10**30 or 100000 is damage
MAX_STORE_BYTES = 16 << 20  # a store holds a few hundred picks of a few KiB each at most
MAX_DEPTH = 16  # a record nests 4 levels; 100000 nested lists would exhaust the parser's stack
WORKER_TYPES = ("process", "thread")
DEVICES = ("cuda", "cpu")
# what a record may hold, beside what a search takes (nwt.tune): "online", what a loader tuned online settled at;
# the main process's load as recorded ("step": the user's step ran; "": a custom measure)
SAVED_STRATEGIES = ("paper", "fast", "online")
SAVED_MAIN_PROCESS = ("waits", "busy", "step", "")
PLACEMENTS = ("cpu", "gpu")
# the fields of picks.trials.Trial, store.TypeBest, fingerprint.MachineFingerprint and WorkFingerprint
TRIAL_KEYS = frozenset({"workers", "iterations", "warmup", "seconds_per_iteration", "samples_per_second",
                        "wall_seconds", "peak_memory_bytes", "peak_uss_bytes", "rel_error", "phase",
                        "wait_fraction", "step_seconds", "other_cpus"})
TYPE_BEST_KEYS = frozenset({"worker_type", "best_workers", "samples_per_second", "search_seconds", "placement"})
MACHINE_KEYS = frozenset({"cpu_model", "usable_cpus", "memory_gib", "gpu_name", "pcie"})
WORK_KEYS = frozenset({"sample_bytes", "batch_size", "transform", "prefetch_factor", "pin_memory", "device",
                       "local_world_size", "sample_transform", "step", "sized_by", "dataset"})
_T = TypeVar("_T")



def _reject_constant(name: str) -> Any:
    raise SavedPickError(f"{name} is not a number JSON allows")


def _depth(obj: Any, limit: int) -> int:
    """Nesting depth of decoded JSON, iteratively (no recursion to exhaust), stopping past ``limit``."""
    stack, deepest = [(obj, 1)], 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def parse_document(data: bytes) -> Any:
    """Decode a stored JSON document, refusing what no writer of ours produces."""
    if len(data) > MAX_STORE_BYTES:
        raise SavedPickError(f"{len(data)} bytes, more than the {MAX_STORE_BYTES} a store may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SavedPickError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise SavedPickError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and ints of more than 4300 digits
        if isinstance(exc, SavedPickError):
            raise
        raise SavedPickError(f"not valid JSON ({str(exc).splitlines()[0]})") from None
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise SavedPickError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def _where(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def need_int(d: Mapping[str, Any], key: str, lo: int, hi: int | None = None, *, path: str = "",
             optional: bool = False) -> int | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise SavedPickError(f"{_where(path, key)} must be a whole number, got {_short(v)}")
    if v < lo or (hi is not None and v > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise SavedPickError(f"{_where(path, key)} must be {bound}, got {_short(v)}")
    return v


def need_number(d: Mapping[str, Any], key: str, lo: float, *, path: str = "", optional: bool = False,
                positive: bool = False) -> float | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SavedPickError(f"{_where(path, key)} must be a number, got {_short(v)}")
    if not math.isfinite(v) or v < lo or (positive and v <= 0):
        raise SavedPickError(f"{_where(path, key)} must be a finite number {'>' if positive else '>='} {lo}, "
                             f"got {_short(v)}")
    return float(v)


def need_str(d: Mapping[str, Any], key: str, *, path: str = "", choices: tuple[str, ...] | None = None,
             optional: bool = False, default: str | None = None) -> str | None:
    if key not in d and default is not None:
        return default
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > 1000:
        raise SavedPickError(f"{_where(path, key)} must be a string, got {_short(v)}")
    if choices is not None and v not in choices:
        raise SavedPickError(f"{_where(path, key)} must be one of {', '.join(map(repr, choices))}, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or isinstance(v, bool) or abs(v) < 10**12 else f"a {len(str(v))}-digit number"
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise SavedPickError(f"{what} must be an object, got {type(v).__name__}")
    return v


def _only(d: Mapping[str, Any], keys: frozenset[str], where: str) -> None:
    unknown = sorted(set(d) - keys)
    if unknown:
        raise SavedPickError(f"{where} has a field no cupy_nwt writes: {_short(unknown[0])}")


def build(cls: type[_T], d: Mapping[str, Any]) -> _T:
    """The dataclass ``cls`` from an object that passed its check: a field left out is its default, or None
    (the check lets only optional fields be absent)."""
    kw = {f.name: d[f.name] if f.name in d else None for f in dataclasses.fields(cls)  # type: ignore[arg-type]
          if f.name in d or f.default is dataclasses.MISSING}
    return cls(**kw)


def _pin(d: Mapping[str, Any], path: str) -> None:
    if not isinstance(d.get("pin_memory"), (bool, str)):
        raise SavedPickError(f"{_where(path, 'pin_memory')} must be true, false or a device, got {_short(d.get('pin_memory'))}")


def check_fingerprint(v: Any) -> None:
    fp = _mapping(v, "fingerprint")
    m = _mapping(fp.get("machine"), "fingerprint.machine")
    _only(m, MACHINE_KEYS, "fingerprint.machine")
    need_str(m, "cpu_model", path="fingerprint.machine")
    need_int(m, "usable_cpus", 1, MAX_WORKERS * 64, path="fingerprint.machine")
    need_int(m, "memory_gib", 0, 1 << 40, path="fingerprint.machine")
    need_str(m, "gpu_name", path="fingerprint.machine", optional=True)
    need_str(m, "pcie", path="fingerprint.machine", optional=True)
    w = _mapping(fp.get("work"), "fingerprint.work")
    _only(w, WORK_KEYS, "fingerprint.work")
    need_int(w, "sample_bytes", 0, 1 << 50, path="fingerprint.work")
    need_int(w, "batch_size", 1, 1 << 40, path="fingerprint.work")
    need_str(w, "transform", path="fingerprint.work", optional=True)
    need_str(w, "sample_transform", path="fingerprint.work", optional=True)
    need_int(w, "prefetch_factor", 1, 1 << 20, path="fingerprint.work")
    _pin(w, "fingerprint.work")
    need_str(w, "device", path="fingerprint.work", choices=DEVICES)
    need_int(w, "local_world_size", 1, 1 << 20, path="fingerprint.work", optional=True)
    need_str(w, "step", path="fingerprint.work", optional=True)
    need_str(w, "sized_by", path="fingerprint.work", optional=True)
    need_str(w, "dataset", path="fingerprint.work", optional=True)  # absent in picks saved before it was keyed


def check_trial(v: Any, where: str) -> None:
    t = _mapping(v, where)
    _only(t, TRIAL_KEYS, where)
    need_int(t, "workers", 0, MAX_WORKERS, path=where)
    need_int(t, "iterations", 1, 1 << 40, path=where)
    need_int(t, "warmup", 0, 1 << 40, path=where)
    need_number(t, "seconds_per_iteration", 0, path=where, positive=True)
    need_number(t, "samples_per_second", 0, path=where, positive=True)
    need_number(t, "wall_seconds", 0, path=where)
    need_int(t, "peak_memory_bytes", 0, 1 << 60, path=where, optional=True)
    need_int(t, "peak_uss_bytes", 0, 1 << 60, path=where, optional=True)
    need_number(t, "rel_error", 0, path=where, optional=True)
    need_str(t, "phase", path=where)
    wait = need_number(t, "wait_fraction", 0, path=where, optional=True)
    if wait is not None and wait > 1:
        raise SavedPickError(f"{where}.wait_fraction must be a fraction in [0, 1], got {_short(wait)}")
    need_number(t, "step_seconds", 0, path=where, optional=True)
    need_number(t, "other_cpus", 0, path=where, optional=True)


def check_record(v: Any, result_format: str) -> Mapping[str, Any]:
    """Every field of one stored tuning (``TuneResult.to_dict``), or :class:`SavedPickError` naming the first bad one."""
    d = _mapping(v, "a record")
    if d.get("format") != result_format:
        raise SavedPickError(f"format must be {result_format!r}, got {_short(d.get('format'))}")
    need_int(d, "best_workers", 0, MAX_WORKERS)
    need_int(d, "max_workers", 1, MAX_WORKERS + 1)
    need_str(d, "strategy", choices=SAVED_STRATEGIES)
    need_int(d, "iterations", 1, 1 << 40)
    need_number(d, "alpha", 0)
    need_number(d, "tolerance", 0)
    need_int(d, "batch_size", 1, 1 << 40)
    need_int(d, "prefetch_factor", 1, 1 << 20)
    _pin(d, "")
    need_str(d, "device", choices=DEVICES)
    need_str(d, "created", default="")
    need_str(d, "worker_type", choices=WORKER_TYPES, default="process")
    need_str(d, "main_process", choices=SAVED_MAIN_PROCESS, default="")
    need_int(d, "usable_cpus", 1, MAX_WORKERS * 64, optional=True)
    need_str(d, "search_end", default="")
    need_str(d, "placement", choices=PLACEMENTS, default="cpu")
    need_number(d, "samples_per_second", 0, optional=True)
    need_number(d, "rel_error", 0, optional=True)
    if d.get("fingerprint") is not None:
        check_fingerprint(d["fingerprint"])
    runs = d.get("runs")
    if not isinstance(runs, list):
        raise SavedPickError(f"runs must be a list, got {_short(runs)}")
    for i, r in enumerate(runs):
        check_trial(r, f"runs[{i}]")
    others = d.get("other_types", [])
    if not isinstance(others, list):
        raise SavedPickError(f"other_types must be a list, got {_short(others)}")
    for i, o in enumerate(others):
        where = f"other_types[{i}]"
        o = _mapping(o, where)
        _only(o, TYPE_BEST_KEYS, where)
        need_str(o, "worker_type", path=where, choices=WORKER_TYPES)
        need_int(o, "best_workers", 0, MAX_WORKERS, path=where)
        need_number(o, "samples_per_second", 0, path=where)
        need_number(o, "search_seconds", 0, path=where)
        need_str(o, "placement", path=where, choices=PLACEMENTS, default="cpu")
    return d
