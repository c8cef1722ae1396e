"""Baseline files: written where the user commits them (``--nwt-save-baseline``), read back checked.

A baseline is one JSON document, ``{"format": "cupy_nwt.baseline/1", "saved", "machine",
"benchmarks": [{"fullname", "extra_info"}, ...]}``: the same ``benchmarks`` list pytest-benchmark's own
JSON has, so ``--nwt-baseline`` reads either. Each loader benchmark's ``extra_info`` carries the
machine and pipeline it ran on; the gate compares them before it judges anything.

A file read back is data from outside, so every field the gate uses is checked (type and range)
before it is believed, and a bad one is a one-line error that names the file, the benchmark and the
field: a hand-edited or truncated baseline must never decide a CI run.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ..errors import BaselineError
from ._cost import MODEL, Cost, components_of, finite
from ._gate import MEASURES, ROUNDS_SUFFIX

FORMAT = "cupy_nwt.baseline/1"
MAX_ROUNDS = 100_000
MAX_CORES = 100_000.0
MAX_COUNTED = 10**9


#: how a bad field is reported: the error for one line saying what is wrong
Bad = Callable[[str], BaselineError]


def _bad_file(path: Path) -> Bad:
    return lambda what: BaselineError(f"--nwt-baseline: {path}: {what} (re-create it with --nwt-save-baseline {path})")


def _is_num(v: Any) -> bool:
    return finite(v) is not None


def _check_machine(bad: Bad, where: str, machine: Any) -> None:
    if machine is None:
        return
    if not isinstance(machine, Mapping):
        raise bad(f"{where}: 'machine' is not an object")
    for key in ("cpu_model", "gpu_name", "pcie"):
        if key in machine and machine[key] is not None and not isinstance(machine[key], str):
            raise bad(f"{where}: machine.{key} is not text")
    for key, top in (("usable_cpus", MAX_CORES), ("memory_gib", 1e7)):
        v: Any = machine.get(key)
        if key in machine and not (_is_num(v) and float(v).is_integer() and 0 <= v <= top):
            raise bad(f"{where}: machine.{key} is not a whole number between 0 and {top:g}")


def _check_info(bad: Bad, name: str, info: Any) -> None:
    if not isinstance(info, Mapping):
        raise bad(f"{name}: 'extra_info' is not an object")
    for key in MEASURES:
        v = info.get(key)
        if v is not None and not (_is_num(v) and v > 0):
            raise bad(f"{name}: {key} is {v!r}, not a positive number")
        rounds = info.get(key + ROUNDS_SUFFIX)
        if rounds is None:
            continue
        if not isinstance(rounds, list) or len(rounds) > MAX_ROUNDS:
            raise bad(f"{name}: {key}{ROUNDS_SUFFIX} is not a list of at most {MAX_ROUNDS:,} figures")
        if not all(_is_num(x) and x > 0 for x in rounds):
            raise bad(f"{name}: {key}{ROUNDS_SUFFIX} holds a figure that is not a positive number")
    for key in ("cpu_cores", "others_cores"):
        v = info.get(key)
        if v is not None and not (_is_num(v) and 0 <= v <= MAX_CORES):
            raise bad(f"{name}: {key} is {v!r}, not a number of cores between 0 and {MAX_CORES:g}")
    by = info.get("instructions_counted_by")
    if by is not None and by not in ("", "perf", "callgrind"):
        raise bad(f"{name}: instructions_counted_by is {by!r}, not 'callgrind', 'perf' or ''")
    n = info.get("instructions_samples")
    if n is not None and not (_is_num(n) and float(n).is_integer() and 1 <= n <= MAX_COUNTED):
        raise bad(f"{name}: instructions_samples is {n!r}, not a whole number of samples")
    model = info.get("cost_model")
    if model is not None and not isinstance(model, str):
        raise bad(f"{name}: cost_model is {model!r}, not text")
    parts = info.get("cost_components")
    components = components_of(info)
    if parts is not None and parts != {} and components is None:
        raise bad(f"{name}: cost_components is not an object of every component, each a finite number >= 0")
    cost = info.get("cost_per_sample")
    if cost is not None and model == MODEL and components is None:  # every cost this model writes has them
        raise bad(f"{name}: cost_per_sample is {cost!r} without the components it is the weight of")
    if cost is not None and components is not None and model == MODEL:
        weighed = Cost(**components).total
        if not math.isclose(cost, weighed, rel_tol=1e-6):
            raise bad(f"{name}: cost_per_sample is {cost!r}, but its components weigh up to {weighed!r}")
    v = info.get("count_software")
    if v is not None and not (isinstance(v, Mapping) and all(isinstance(x, (str, type(None))) for x in v.values())):
        raise bad(f"{name}: count_software is not an object of versions")
    v = info.get("cpus_watched")
    if v is not None and not (_is_num(v) and float(v).is_integer() and 1 <= v <= MAX_CORES):
        raise bad(f"{name}: cpus_watched is {v!r}, not a whole number of CPUs")
    _check_machine(bad, name, info.get("machine"))
    pipeline = info.get("pipeline")
    if pipeline is not None and not (isinstance(pipeline, Mapping) and all(
            v is None or isinstance(v, (str, int, float, bool)) for v in pipeline.values())):
        raise bad(f"{name}: 'pipeline' is not an object of plain values")


def load_baseline(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """fullname -> benchmark entry of a baseline file (ours or pytest-benchmark's JSON), checked.

    A missing file raises FileNotFoundError (the caller decides whether that fails); anything else
    wrong is a ``BaselineError`` naming the file and the field (the gate shows it as a usage error).
    """
    p = Path(path)
    out: dict[str, dict[str, Any]] = {}
    for b in _entries(p):
        _check_entry(_bad_file(p), b, out)
        out[b["fullname"]] = b
    return out


def valid_entries(path: str | os.PathLike[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The entries of a baseline file that pass their checks, and why each other one did not (one line each).

    For ``--nwt-save-baseline`` over an existing file: the entries this run does not measure are kept,
    and one bad entry must not cost the others. The file itself unreadable, or not a baseline, is a
    ``BaselineError`` as with :func:`load_baseline`.
    """
    p = Path(path)
    out: dict[str, dict[str, Any]] = {}
    dropped: list[str] = []
    for b in _entries(p):
        try:
            _check_entry(BaselineError, b, out)
        except BaselineError as exc:
            dropped.append(str(exc))
            continue
        out[b["fullname"]] = b
    return out, dropped


def _check_entry(bad: Bad, entry: dict[str, Any], earlier: Mapping[str, Any]) -> None:
    if entry["fullname"] in earlier:
        raise bad(f"{entry['fullname']}: listed twice (which one would decide?)")
    _check_info(bad, entry["fullname"], entry.get("extra_info") or {})


def _entries(p: Path) -> list[dict[str, Any]]:
    """The file's ``benchmarks`` list, once the file is readable JSON of a known format."""
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"--nwt-baseline: {p} is not readable ({exc})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # also an int of over 4300 digits, and nesting past the stack
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BaselineError(f"--nwt-baseline: {p} is not readable JSON ({reason})") from None
    benches = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benches, list) or not all(
            isinstance(b, dict) and isinstance(b.get("fullname"), str) for b in benches):
        raise BaselineError(
            f"--nwt-baseline: {p} is not a baseline (expected a 'benchmarks' list of entries with 'fullname'; "
            "write one with --nwt-save-baseline, --benchmark-json or --benchmark-autosave)"
        )
    fmt = data.get("format")
    if fmt is not None and fmt != FORMAT:
        raise BaselineError(f"--nwt-baseline: {p} is a {fmt!r} file; this cupy_nwt reads {FORMAT!r}")
    _check_machine(_bad_file(p), "the file", data.get("machine"))
    return benches


def check_compared(path: str, entries: Any) -> dict[str, dict[str, Any]]:
    """A run ``--benchmark-compare`` selected (pytest-benchmark's ``{fullname: entry}``), checked as a baseline
    file is: pytest-benchmark reads its stored runs unchecked, and a hand-edited one must not decide a CI run."""
    def bad(what: str) -> BaselineError:
        return BaselineError(f"--benchmark-compare: {path}: {what} (save a new run with --benchmark-autosave)")

    if not isinstance(entries, Mapping):
        raise bad("not a run of benchmarks")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise bad(f"{name}: the entry is not an object")
        _check_info(bad, str(name), entry.get("extra_info") or {})
        out[str(name)] = entry
    return out


def save_baseline(path: str | os.PathLike[str], current: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write this run's benchmarks (fullname -> extra_info) as a baseline file, atomically."""
    from ..picks.fingerprint import machine_fingerprint  # noqa: PLC0415
    from ..reporting.tables import write_json  # noqa: PLC0415

    doc = {
        "format": FORMAT,
        "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_fingerprint().to_dict(),
        "benchmarks": [{"fullname": name, "extra_info": dict(info)} for name, info in sorted(current.items())],
    }
    return write_json(_plain(doc), path)


def _plain(value: Any) -> Any:
    """JSON's own types; a non-finite figure becomes null (it would not pass the checks read back)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


#: options left out of the command suggested for making a baseline: those taking a value, then flags
_GATE_VALUED = ("--nwt-baseline", "--nwt-save-baseline", "--nwt-throughput-drop", "--nwt-against",
                "--nwt-instructions-drop", "--benchmark-compare-fail")
#: options whose value is optional: the next argument is theirs unless it is an option (argparse's nargs="?")
_GATE_OPTIONAL = ("--benchmark-compare",)
_GATE_FLAGS = ("--nwt-require-baseline",)


def create_command(config: pytest.Config, path: str) -> str:
    """The command that makes the missing baseline: this run's, minus the gate's options, plus saving."""
    args: list[str] = []
    skip = optional = False
    for a in config.invocation_params.args:
        a = str(a)
        if skip or (optional and not a.startswith("-")):
            skip = optional = False
            continue
        optional = False
        name = a.split("=", 1)[0]
        if name in _GATE_VALUED or name in _GATE_FLAGS or name in _GATE_OPTIONAL:
            skip = "=" not in a and name in _GATE_VALUED
            optional = "=" not in a and name in _GATE_OPTIONAL
            continue
        args.append(a)
    return shlex.join(["pytest", *args, "--nwt-save-baseline", path])
