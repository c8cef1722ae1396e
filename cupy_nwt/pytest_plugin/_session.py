"""The session's gate: which baselines apply, the comparisons at session end, saving, and the table.

The rule for one figure lives in :mod:`cupy_nwt.pytest_plugin._gate`; files in
:mod:`cupy_nwt.pytest_plugin._baseline`. This module only decides what to compare with what, which
lines to print, and whether the run fails: a regression, or (``--nwt-require-baseline``) a benchmark
with nothing to compare against, or a baseline entry this run did not judge where it could (``_coverage``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from .._files import check_writable, same_file
from ..errors import AgainstError, ArgumentError, BaselineError
from ._against import BaseRevision
from ._baseline import check_compared, create_command, load_baseline, save_baseline, valid_entries
from ._callgrind import callgrind_unavailable_reason
from ._cost import COMPONENTS, WEIGHTS, components_of
from ._coverage import coverage
from ._gate import MEASURES, ROUNDS_SUFFIX, Comparison, compare_against, compare_throughput, figure, signed_change
from ._options import DEFAULT_INSTRUCTIONS_DROP_PCT

#: verdicts from worst to best, for a benchmark's overall verdict in the table
_RANK = ("regressed", "no baseline", "inconclusive", "other-machine", "ok", "reported", "compared")
#: the remedy for a plain ``benchmark``: nothing but its own clock is known, here or at a base revision
_PLAIN = ("a plain benchmark times the test's own code, which nothing counts: write the pipeline's test with "
          "loader_benchmark (counted exactly, and run beside a base revision under --nwt-against)")
_AGAINST = ", or add --nwt-against REV (measured in this job)"


@dataclass(frozen=True)
class GateOptions:
    max_drop_pct: float | None
    baseline_path: str | None
    save_path: str | None
    require: bool
    compare: bool  # --benchmark-compare given
    against: str | None = None  # --nwt-against REV
    instructions_drop_pct: float = DEFAULT_INSTRUCTIONS_DROP_PCT


class ThroughputGate:
    """Collects this run's figures at session end, compares them with the baselines, saves a baseline."""

    def __init__(self, options: GateOptions, explicit: dict[str, dict[str, Any]] | None,
                 against: BaseRevision | None = None) -> None:
        self.options = options
        self.against = against
        self.max_drop_pct = options.max_drop_pct
        self.explicit = explicit
        self.comparisons: list[Comparison] = []
        self.current: dict[str, dict[str, Any]] = {}
        self.lines: list[tuple[str, str]] = []  # (text, verdict)
        self.missing: list[str] = []  # benchmarks without a baseline entry, under --nwt-require-baseline
        self.evaluated = False
        self.compared: list[tuple[str, Mapping[str, Mapping[str, Any]]]] | None = None  # --benchmark-compare's runs
        self.unsaved = ""  # why --nwt-save-baseline could not be written at the end, "" when it was
        self.collected: set[str] = set()  # the node ids this session ran (after -k, markers, a shard's selection)
        self.uncovered: list[str] = []  # baseline entries not judged where they could be, under --nwt-require-baseline

    def _with(self, verdict: str) -> list[Comparison]:
        return [c for c in self.comparisons if c.judgement(self.max_drop_pct).verdict == verdict]

    @property
    def regressions(self) -> list[Comparison]:
        return self._with("regressed")

    @property
    def inconclusive(self) -> list[Comparison]:
        return self._with("inconclusive")

    def _only(self, allowed: set[str]) -> list[str]:
        """Benchmarks compared under a limit whose every figure got one of the ``allowed`` verdicts."""
        if self.max_drop_pct is None:
            return []
        verdicts: dict[str, set[str]] = {}
        for c in self.comparisons:
            verdicts.setdefault(c.fullname, set()).add(c.judgement(self.max_drop_pct).verdict)
        return [name for name, v in verdicts.items() if v <= allowed]

    @property
    def unjudged(self) -> list[str]:
        """Benchmarks compared under a limit whose every figure was only reported (their clocks, nothing exact)."""
        return self._only({"reported"})

    @property
    def other_machine(self) -> list[str]:
        """Benchmarks judged on nothing because their baseline came from another machine."""
        clocks_only = set(self.unjudged)
        return [name for name in self._only({"reported", "other-machine"}) if name not in clocks_only]

    @property
    def not_beside(self) -> list[str]:
        """Under ``--nwt-against``, benchmarks the base revision did not run and no baseline judged: a plain
        ``benchmark`` times the test's own code here alone, where ``loader_benchmark`` runs its pipeline at both."""
        if self.against is None or self.max_drop_pct is None:
            return []
        judged = {c.fullname for c in self.comparisons
                  if c.judgement(self.max_drop_pct).verdict in ("ok", "regressed", "inconclusive")}
        listed = set(self.unjudged) | set(self.other_machine)
        return [name for name, info in self.current.items()
                if not isinstance(info.get("against"), Mapping) and name not in judged | listed]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.missing or self.unsaved or self.uncovered)

    def close(self) -> None:
        if self.against is not None:
            self.against.close()

    def evaluate(self, config: pytest.Config, exitstatus: int = 0) -> None:
        """Compare, decide and (``--nwt-save-baseline``) save; ``exitstatus``: the session's so far (a run that
        failed saves no baseline)."""
        self.evaluated = True
        self.current = current_figures(config)
        self.comparisons += compare_against(self.current, self.options.instructions_drop_pct)
        baselines = self._baselines(config)
        for source, mapping in baselines:
            self.comparisons += compare_throughput(self.current, mapping, source, self.options.instructions_drop_pct)
        for c in self.comparisons:
            self.lines.append((c.message(self.max_drop_pct), c.judgement(self.max_drop_pct).verdict))
        path = self.options.baseline_path
        if self.options.require and path is not None and self.explicit is not None:
            self.missing = [name for name in self.current if name not in self.explicit]
            for name in self.missing:
                self.lines.append((f"{name}: no entry in the baseline {path} (--nwt-require-baseline); add it with: "
                                   f"{create_command(config, path)}", "regressed"))
        if self.max_drop_pct is not None and (baselines or self.against) and not self.comparisons and not self.missing:
            sources = [f"the baseline {source}" for source, _ in baselines]
            if self.against is not None:
                sources.append(f"{self.against.name}'s run beside it (--nwt-against)")
            text = f"no throughput compared: no benchmark of this run has a watched figure both now and in {' or '.join(sources)}"
            self.lines.append((text, "note"))
        if path is not None and self.explicit is not None:
            lines, self.uncovered = coverage(self.current, self.explicit, self.collected, self.comparisons,
                                             self.max_drop_pct, self.options.require and not self.missing, str(path))
            self.lines += lines
        if self.options.save_path is not None:
            self._save(self.options.save_path, exitstatus)

    def _save(self, path: str, exitstatus: int) -> None:
        """Write this run's figures, keeping the file's entries this run did not measure (a shard, ``-k``)."""
        if not self.current:
            self.lines.append((f"no benchmark figures in this run: baseline {path} not written", "note"))
            return
        if exitstatus != pytest.ExitCode.OK:
            self.lines.append((f"baseline {path} not written: this run failed (exit status {int(exitstatus)}), and a "
                               "baseline must come from a run that passed", "regressed"))
            return
        try:
            earlier, dropped = valid_entries(path)
        except FileNotFoundError:
            earlier, dropped = {}, []
        except BaselineError as exc:
            earlier, dropped = {}, [f"the whole file, which was not a baseline to keep ({exc})"]
        kept = {name: entry.get("extra_info") or {} for name, entry in earlier.items() if name not in self.current}
        try:
            written = save_baseline(path, {**kept, **self.current})
        except (OSError, ArgumentError) as exc:
            self.unsaved = f"cupy_nwt could not write the baseline {path}: {exc}"
            return
        also = f"; {len(kept)} kept from the file as they were, not run here" if kept else ""
        also += f"; left out of the file as it was, failing the checks a baseline gets when read: {'; '.join(dropped)}" \
            if dropped else ""
        self.lines.append((f"baseline saved: {written} ({len(self.current)} benchmark(s) measured{also}); commit it "
                           f"and gate with --nwt-baseline={path} --nwt-require-baseline", "note"))

    def summary(self) -> list[tuple[str, str]]:
        """The closing lines, (text, verdict): one for the failures, one for the inconclusive."""
        out = []
        if self.regressions:
            text = (f"cupy_nwt throughput gate FAILED: {len(self.regressions)} figure(s) fell or rose by more than "
                    "their limit and beyond their 95% interval")
            out.append((text, "regressed"))
        if self.missing:
            text = f"cupy_nwt throughput gate FAILED: {len(self.missing)} benchmark(s) have no baseline entry"
            out.append((text, "regressed"))
        if self.uncovered:
            text = (f"cupy_nwt throughput gate FAILED: {len(self.uncovered)} benchmark(s) of the baseline were not "
                    "judged where they could be (each line above says why)")
            out.append((text, "regressed"))
        if self.unsaved:
            out.append((self.unsaved, "regressed"))
        groups: dict[str, list[str]] = {}
        no_valgrind = bool(self.unjudged) and callgrind_unavailable_reason() is not None
        for name in self.unjudged:
            groups.setdefault(self._what_would_judge(name, no_valgrind), []).append(name)
        if self.other_machine:
            groups.setdefault("their baseline was made on another machine (each line names the difference); make "
                              f"the baseline on the machine that runs the gate{_AGAINST}", []).extend(self.other_machine)
        if self.not_beside:
            assert self.against is not None
            groups.setdefault(f"{self.against.name} did not run them: --nwt-against runs only loader_benchmark's "
                              f"pipelines at both revisions, {_PLAIN}", []).extend(self.not_beside)
        for why, names in groups.items():
            out.append((f"cupy_nwt throughput gate judged nothing for {len(names)} benchmark(s) "
                        f"({', '.join(names)}): {why}", "inconclusive"))
        if self.inconclusive:
            text = (f"cupy_nwt throughput gate INCONCLUSIVE for {len(self.inconclusive)} figure(s): the noise "
                    f"reaches past the {self.max_drop_pct:g}% limit (not a failure; rerun on a quieter "
                    "machine, or give the benchmark more time: --nwt-max-seconds)")
            out.append((text, "inconclusive"))
        return out

    def _what_would_judge(self, name: str, no_valgrind: bool) -> str:
        """Why a benchmark's figures were only shown, and what would let them be judged against a baseline."""
        shown = "their clocks against a baseline from another time are shown, not judged"
        contexts = [c.context for c in self.comparisons if c.fullname == name]
        if not _is_pipeline(self.current.get(name, {})):
            return f"{shown}; {_PLAIN}"
        if any(ctx.io_bound for ctx in contexts):
            return f"{shown}; they wait rather than compute, so no count of their work decides{_AGAINST}"
        if any(ctx.new_counted == "callgrind" for ctx in contexts):
            return (f"{shown}; the baseline was not counted as this run was (by callgrind, over as many samples, "
                    f"with the same weights): save it again here with --nwt-save-baseline{_AGAINST}")
        if no_valgrind:
            return f"{shown}; install valgrind (exact instruction counts){_AGAINST}"
        return (f"{shown}; nothing was counted exactly here: only loader_benchmark's pipelines are counted (an "
                f"'instructions not counted' note says why one was not){_AGAINST}")

    def _baselines(self, config: pytest.Config) -> list[tuple[str, Mapping[str, Mapping[str, Any]]]]:
        out: list[tuple[str, Mapping[str, Mapping[str, Any]]]] = []
        if self.explicit is not None:
            out.append((str(self.options.baseline_path), self.explicit))
        elif self.options.baseline_path is not None and self.current:
            self.lines.append((f"no baseline at {self.options.baseline_path}: throughput not gated this time; "
                               f"create it with: {create_command(config, self.options.baseline_path)}", "note"))
        if self.compared is not None:
            if not self.compared and self.max_drop_pct is not None:
                text = ("--benchmark-compare found no saved run: throughput not gated this time "
                        "(save one with --benchmark-autosave, or use --nwt-save-baseline)")
                self.lines.append((text, "note"))
            out += self.compared
        return out

    def session_started(self, config: pytest.Config) -> None:
        """Checks that need pytest-benchmark's session, which it makes after this plugin's ``pytest_configure``:
        that benchmarks will be recorded at all, and the runs --benchmark-compare selected."""
        bs = getattr(config, "_benchmarksession", None)
        o = self.options
        wanted = [name for name, on in (("--nwt-throughput-drop", o.max_drop_pct is not None),
                                        ("--nwt-require-baseline", o.require), ("--nwt-save-baseline", o.save_path))
                  if on]
        off = ("--benchmark-skip skips every benchmark" if getattr(bs, "skip", False) else
               "pytest-benchmark records nothing here (--benchmark-disable, or pytest-xdist's -n, which disables it); "
               "add --benchmark-enable and run without -n" if getattr(bs, "disabled", False) else "")
        if wanted and off:
            verb = "needs" if len(wanted) == 1 else "need"
            raise pytest.UsageError(f"{' and '.join(wanted)} {verb} the benchmarks' figures, but {off}")
        self.read_compared(config)

    def read_compared(self, config: pytest.Config) -> None:
        """Read and check the runs --benchmark-compare selected, before any test runs (pytest-benchmark loads
        them after this plugin's ``pytest_configure``)."""
        if not self.options.compare:
            return
        # pytest-benchmark has no public accessor for the runs --benchmark-compare selected;
        # its session keeps them as {path: {fullname: entry}} (tests/pytest_plugin/test_pytest_plugin.py pins it).
        mapping = getattr(getattr(config, "_benchmarksession", None), "compared_mapping", None)
        if mapping is None:
            raise pytest.UsageError(
                "cupy_nwt cannot read the runs --benchmark-compare selected from this pytest-benchmark "
                "version; pass --nwt-baseline FILE.json instead"
            )
        try:
            self.compared = [(_short(path), check_compared(_short(path), m)) for path, m in mapping.items()]
        except BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None

    # ------------------------------------------------------------ the table

    def table(self) -> list[tuple[str, str]]:
        """One row per benchmark of this run: samples/s and CPU per 1,000 samples, with the baseline's."""
        if not self.current:
            return []
        by_bench: dict[str, dict[str, Comparison]] = {}
        for c in self.comparisons:
            by_bench.setdefault(c.fullname, {}).setdefault(c.key, c)
        keys = [k for k in ("samples_per_s", "gbps", "cpu_s_per_1k", "cost_per_sample", "instructions_per_sample")
                if any(figure(info, k)[0] is not None for info in self.current.values())]
        head = ["benchmark"]
        for k in keys:
            head += [MEASURES[k].unit, "baseline", "change"]
        head.append("verdict")
        rows: list[list[str]] = []
        verdicts = []
        for name, info in self.current.items():
            row = [name]
            mine = by_bench.get(name, {})
            for k in keys:
                found = mine.get(k)
                now = figure(info, k)[0]
                if found is not None:
                    j = found.judgement(self.max_drop_pct)
                    row += [_fmt(j.new), _fmt(j.old), signed_change(j.old, j.new)]
                else:
                    row += [_fmt(now) if now is not None else "-", "-", ""]
            judged = [c.judgement(self.max_drop_pct).verdict for c in mine.values()]
            if name in self.missing or not mine:
                judged.append("no baseline")
            verdict = min(judged, key=_RANK.index)
            row.append(verdict)
            rows.append(row)
            verdicts.append(verdict)
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        out = [(line(head), "note")]
        for (name, info), r, v in zip(self.current.items(), rows, verdicts):
            out.append((line(r), v))
            cost = by_bench.get(name, {}).get("cost_per_sample")
            parts = components_line(cost.old_components if cost else None, components_of(info))
            if parts:
                out.append((f"  cost/sample = {parts}", "note"))
        notes = sorted({str(info.get("instructions_note")) for info in self.current.values()
                        if info.get("instructions_note")})
        out += [(f"instructions not counted: {n}", "note") for n in notes]
        return out


def components_line(old: Mapping[str, float] | None, new: Mapping[str, float] | None) -> str:
    """Every component of the cost, weighted, with the baseline's figure and the change where there is one."""
    if not new:
        return ""
    parts = []
    for k, name in COMPONENTS:
        w = WEIGHTS.get(k, 1.0)
        text = f"{name} {_fmt(new[k])}" + (f" x {w:,.0f}" if w != 1.0 else "")
        if old and k in old:
            text += f" (baseline {_fmt(old[k])}, {signed_change(old[k], new[k])})"
        parts.append(text)
    return " + ".join(parts) + " a sample"


def _is_pipeline(info: Mapping[str, Any]) -> bool:
    """Whether a benchmark's record is ``loader_benchmark``'s (a ``LoaderBenchmarkResult``), not a test's own."""
    return "instructions_counted_by" in info


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.4g}"


def _short(path: Any) -> str:
    try:
        return os.path.relpath(path)
    except (TypeError, ValueError):
        return str(path)


def current_figures(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """fullname -> extra_info of this run's benchmarks that finished without error and carry a watched figure."""
    bs = getattr(config, "_benchmarksession", None)
    out: dict[str, dict[str, Any]] = {}
    for bench in getattr(bs, "benchmarks", None) or []:
        if bench.has_error or not bench:
            continue
        if any(k in bench.extra_info or k + ROUNDS_SUFFIX in bench.extra_info for k in MEASURES):
            out[bench.fullname] = bench.extra_info
    return out


def options_of(config: pytest.Config) -> GateOptions:
    return GateOptions(
        max_drop_pct=config.getoption("nwt_throughput_drop", None),
        baseline_path=config.getoption("nwt_baseline", None),
        save_path=config.getoption("nwt_save_baseline", None),
        require=bool(config.getoption("nwt_require_baseline", False)),
        compare=bool(config.getoption("benchmark_compare", None)),
        against=config.getoption("nwt_against", None),
        instructions_drop_pct=config.getoption("nwt_instructions_drop", DEFAULT_INSTRUCTIONS_DROP_PCT),
    )


def start_gate(config: pytest.Config) -> ThroughputGate:
    """The session's gate from the command line; a usage error (one line) where the options cannot work."""
    o = options_of(config)
    if o.require and o.baseline_path is None:
        raise pytest.UsageError("--nwt-require-baseline needs --nwt-baseline FILE (a file made with "
                                "--nwt-save-baseline FILE and committed)")
    if o.max_drop_pct is not None and o.baseline_path is None and not o.compare and o.against is None:
        raise pytest.UsageError(
            "--nwt-throughput-drop needs something to compare with: --nwt-against REV (measured in this job), "
            "--nwt-baseline FILE (made with --nwt-save-baseline FILE), or --benchmark-compare[=NUM|ID] after a "
            "run with --benchmark-autosave"
        )
    if o.save_path is not None and o.baseline_path is not None and same_file(o.save_path, o.baseline_path):
        raise pytest.UsageError(
            f"--nwt-baseline and --nwt-save-baseline name the same file ({o.baseline_path}): the run would overwrite "
            "the baseline it is judged against, a regression included; save to another file and replace the "
            "baseline after review"
        )
    if o.save_path is not None:
        try:  # the file is written after the whole run: a place it cannot go is found now, not then
            check_writable(o.save_path, "--nwt-save-baseline")
        except ArgumentError as exc:
            raise pytest.UsageError(str(exc)) from None
    against = None
    if o.against is not None:
        try:
            against = BaseRevision(o.against, config.rootpath)
        except AgainstError as exc:
            raise pytest.UsageError(str(exc)) from None
    explicit = None
    if o.baseline_path is not None:
        try:
            explicit = load_baseline(o.baseline_path)
        except BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None
        except FileNotFoundError:
            if o.require:
                raise pytest.UsageError(
                    f"no baseline at {o.baseline_path} (--nwt-require-baseline): create it on this machine "
                    f"with: {create_command(config, o.baseline_path)} and commit it"
                ) from None
    return ThroughputGate(o, explicit, against)
