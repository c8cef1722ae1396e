"""The throughput gate: this run's throughput against a baseline's, judged against the noise.

pytest-benchmark's ``--benchmark-compare-fail=median:10%`` compares one statistic of two runs with a
fixed percentage, whatever the spread of the rounds behind it; on a shared machine one slow stretch
then fails an unchanged rerun. Here a benchmark records its throughput in repeated rounds
(``<key>_rounds`` in ``extra_info``, beside the headline ``<key>``) and the gate reads both runs'
rounds (see :func:`judge`):

* the figures compared are the **medians** of the rounds, so one slow round cannot move them;
* a run's **spread** is the ratio of the upper to the lower quartile of its rounds (inclusive
  quartiles: with 5 rounds the 2nd and 4th fastest, so the extremes never count); a run with fewer
  than :data:`MIN_ROUNDS` rounds has none;
* the **noise** is the drop that twice both runs' spreads together could make,
  ``1 - (q1/q3 of the baseline * q1/q3 of this run) ** 2``, in percent. Twice, because the rounds
  of one run are consecutive and share the machine's state of the moment, so their spread
  understates how far two runs apart in time can differ (on a small machine shared with other
  jobs, whole unchanged reruns moved by far more than their rounds spread, and once the spreads
  still failed some of them);
* **regressed** (the run fails) when the median fell by more than the limit *and* by more than the
  noise; **inconclusive** (reported, never a failure) when not regressed but the noise exceeds the
  limit, so that a drop of the limit's size could hide in it; **ok** otherwise.

A figure without rounds (a benchmark of yours that sets only ``samples_per_s``, a baseline saved
before rounds existed) is one round with no spread; with no spread on either side the rule is the
plain "fell by more than the limit".
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

#: extra_info keys the gate watches (higher is better), with the unit printed next to them.
THROUGHPUT_KEYS: dict[str, str] = {"gbps": "GB/s", "samples_per_s": "samples/s"}
#: ``<key>_rounds`` in extra_info holds the key's figure per round.
ROUNDS_SUFFIX = "_rounds"
#: fewer rounds than this give no spread (the quartiles of two figures say nothing).
MIN_ROUNDS = 3
#: how many times both runs' spreads a drop must exceed to count (the module docstring says why 2).
NOISE_SPREADS = 2


# ---------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Judgement:
    """The gate's verdict on one figure: ``ok``, ``regressed``, ``inconclusive``, or ``compared`` (no limit)."""

    verdict: str
    old: float
    new: float
    change_pct: float
    noise_pct: float | None  # None: neither run had MIN_ROUNDS rounds
    old_rounds: int
    new_rounds: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread(rounds: Sequence[float]) -> float | None:
    """Upper over lower quartile of the rounds (>= 1), or None with fewer than MIN_ROUNDS rounds."""
    if len(rounds) < MIN_ROUNDS:
        return None
    q1, _, q3 = statistics.quantiles(rounds, n=4, method="inclusive")
    return q3 / q1


def judge(old: Sequence[float], new: Sequence[float], max_drop_pct: float | None) -> Judgement:
    """Judge the rounds of this run (``new``) against the baseline's (``old``); higher is better.

    The rule is the module docstring's. All figures must be positive and finite, one round at least.
    """
    if not old or not new or not all(_positive(x) is not None for x in (*old, *new)):
        raise ValueError("judge needs at least one round on each side, all positive and finite")
    m_old, m_new = statistics.median(old), statistics.median(new)
    change = (m_new - m_old) / m_old * 100.0
    spreads = [s for s in (spread(old), spread(new)) if s is not None]
    noise = (1.0 - math.prod(spreads) ** -NOISE_SPREADS) * 100.0 if spreads else None
    if max_drop_pct is None:
        verdict = "compared"
    elif -change > max(max_drop_pct, noise or 0.0):
        verdict = "regressed"
    elif noise is not None and noise > max_drop_pct:
        verdict = "inconclusive"
    else:
        verdict = "ok"
    return Judgement(verdict, m_old, m_new, change, noise, len(old), len(new))


# ---------------------------------------------------------------- comparisons of benchmarks


@dataclass(frozen=True)
class Comparison:
    """One throughput figure now against the same benchmark's figure in a baseline.

    ``old``/``new`` are the medians of the rounds where there are rounds (the rounds themselves
    ride along), else the headline figures.
    """

    fullname: str
    key: str
    old: float
    new: float
    source: str
    old_rounds: tuple[float, ...] = ()
    new_rounds: tuple[float, ...] = ()

    @property
    def change_pct(self) -> float:
        return (self.new - self.old) / self.old * 100.0

    def judgement(self, max_drop_pct: float | None) -> Judgement:
        return judge(self.old_rounds or (self.old,), self.new_rounds or (self.new,), max_drop_pct)

    def regressed(self, max_drop_pct: float | None) -> bool:
        return self.judgement(max_drop_pct).verdict == "regressed"

    def message(self, max_drop_pct: float | None) -> str:
        j = self.judgement(max_drop_pct)
        unit = THROUGHPUT_KEYS.get(self.key, self.key)
        figures = f"{_num(j.old)} -> {_num(j.new)}"
        detail = ""
        if j.noise_pct is not None:
            detail = f" (medians of {j.old_rounds}|{j.new_rounds} rounds, noise {j.noise_pct:.1f}%)"
        if j.verdict == "regressed":
            head = f"{unit} fell {-j.change_pct:.1f}% (more than {max_drop_pct:g}%): {figures}"
        elif j.verdict == "inconclusive":
            head = (f"{unit} inconclusive, the noise exceeds the {max_drop_pct:g}% limit: "
                    f"{figures} ({j.change_pct:+.1f}%)")
        else:
            head = f"{unit} {figures} ({j.change_pct:+.1f}%)"
        return f"{self.fullname}: {head}{detail} [baseline {self.source}]"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["change_pct"] = self.change_pct
        return d


def _num(x: float) -> str:
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.4g}"


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _rounds(info: Mapping[str, Any], key: str) -> tuple[float, ...]:
    """The key's rounds in an extra_info; () when absent or not a list of positive numbers."""
    raw = info.get(key + ROUNDS_SUFFIX)
    if not isinstance(raw, (list, tuple)) or not raw:
        return ()
    values = [_positive(x) for x in raw]
    return tuple(v for v in values if v is not None) if all(v is not None for v in values) else ()


def _figure(info: Mapping[str, Any], key: str) -> tuple[float | None, tuple[float, ...]]:
    rounds = _rounds(info, key)
    return (statistics.median(rounds) if rounds else _positive(info.get(key))), rounds


def compare_throughput(
    current: Mapping[str, Mapping[str, Any]],
    baseline: Mapping[str, Mapping[str, Any]],
    source: str,
) -> list[Comparison]:
    """Pair each throughput key in ``current[fullname]`` (an extra_info) with the baseline's.

    ``baseline`` maps fullname -> a benchmark entry of pytest-benchmark's JSON (with ``extra_info``).
    Benchmarks or keys missing on either side, and figures that are not positive numbers, are not
    compared.
    """
    out = []
    for fullname, info in current.items():
        entry = baseline.get(fullname)
        if not entry:
            continue
        old_info = entry.get("extra_info") or {}
        for key in THROUGHPUT_KEYS:
            (old, old_rounds), (new, new_rounds) = _figure(old_info, key), _figure(info, key)
            if old is not None and new is not None:
                out.append(Comparison(fullname, key, old, new, source, old_rounds, new_rounds))
    return out


def load_baseline(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read a pytest-benchmark JSON file into fullname -> benchmark entry; clear errors if it is not one."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise pytest.UsageError(f"--nwt-baseline: no such file: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise pytest.UsageError(f"--nwt-baseline: {p} is not readable JSON ({exc})") from None
    benches = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benches, list) or not all(isinstance(b, dict) and "fullname" in b for b in benches):
        raise pytest.UsageError(
            f"--nwt-baseline: {p} is not a pytest-benchmark result (expected a 'benchmarks' list of "
            "entries with 'fullname'; write one with --benchmark-json or --benchmark-autosave)"
        )
    return {b["fullname"]: b for b in benches}


# ---------------------------------------------------------------- the session's gate


class ThroughputGate:
    """Collects this run's throughput figures and compares them with the baselines at session end."""

    def __init__(self, max_drop_pct: float | None, explicit: dict[str, dict[str, Any]] | None) -> None:
        self.max_drop_pct = max_drop_pct
        self.explicit = explicit
        self.comparisons: list[Comparison] = []
        self.lines: list[tuple[str, str]] = []  # (text, verdict)
        self.evaluated = False

    def _with(self, verdict: str) -> list[Comparison]:
        return [c for c in self.comparisons if c.judgement(self.max_drop_pct).verdict == verdict]

    @property
    def regressions(self) -> list[Comparison]:
        return self._with("regressed")

    @property
    def inconclusive(self) -> list[Comparison]:
        return self._with("inconclusive")

    @property
    def failed(self) -> bool:
        return bool(self.regressions)

    def evaluate(self, config: pytest.Config) -> None:
        self.evaluated = True
        baselines = self._baselines(config)
        if not baselines:
            return
        current = _current_throughput(config)
        for source, mapping in baselines:
            self.comparisons += compare_throughput(current, mapping, source)
        for c in self.comparisons:
            self.lines.append((c.message(self.max_drop_pct), c.judgement(self.max_drop_pct).verdict))
        if self.max_drop_pct is not None and not self.comparisons:
            text = ("no throughput compared: no benchmark of this run has gbps/samples_per_s both now and in "
                    f"the baseline ({', '.join(s for s, _ in baselines)})")
            self.lines.append((text, "note"))

    def summary(self) -> list[tuple[str, str]]:
        """The closing lines, (text, verdict): one for the failures, one for the inconclusive."""
        out = []
        if self.failed:
            text = (f"cupy_nwt throughput gate FAILED: {len(self.regressions)} benchmark(s) fell by more than "
                    f"{self.max_drop_pct:g}% and by more than the noise of their rounds")
            out.append((text, "regressed"))
        if self.inconclusive:
            text = (f"cupy_nwt throughput gate INCONCLUSIVE for {len(self.inconclusive)} benchmark(s): the noise "
                    f"of their rounds exceeds the {self.max_drop_pct:g}% limit (not a failure; rerun on a quieter "
                    "machine, or time more batches)")
            out.append((text, "inconclusive"))
        return out

    def _baselines(self, config: pytest.Config) -> list[tuple[str, Mapping[str, Mapping[str, Any]]]]:
        out: list[tuple[str, Mapping[str, Mapping[str, Any]]]] = []
        if self.explicit is not None:
            out.append((str(config.getoption("nwt_baseline")), self.explicit))
        if config.getoption("benchmark_compare", None):
            # pytest-benchmark has no public accessor for the runs --benchmark-compare selected;
            # its session keeps them as {path: {fullname: entry}} (tests/test_pytest_plugin.py pins it).
            mapping = getattr(getattr(config, "_benchmarksession", None), "compared_mapping", None)
            if mapping is None:
                raise pytest.UsageError(
                    "cupy_nwt cannot read the runs --benchmark-compare selected from this pytest-benchmark "
                    "version; pass --nwt-baseline FILE.json instead"
                )
            if not mapping and self.max_drop_pct is not None:
                text = ("--benchmark-compare found no saved run: throughput not gated this time "
                        "(save one with --benchmark-autosave)")
                self.lines.append((text, "note"))
            out += [(_short(path), m) for path, m in mapping.items()]
        return out


def _short(path: Any) -> str:
    try:
        return os.path.relpath(path)
    except (TypeError, ValueError):
        return str(path)


def _current_throughput(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """fullname -> extra_info of this run's benchmarks that finished without error."""
    bs = getattr(config, "_benchmarksession", None)
    out: dict[str, dict[str, Any]] = {}
    for bench in getattr(bs, "benchmarks", None) or []:
        if bench.has_error or not bench:
            continue
        if any(k in bench.extra_info or k + ROUNDS_SUFFIX in bench.extra_info for k in THROUGHPUT_KEYS):
            out[bench.fullname] = bench.extra_info
    return out
