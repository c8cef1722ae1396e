"""What a benchmark's figures are read with, beside the figures: the pipeline's CPU use and the machine's
other load (an I/O-bound pipeline is not judged on CPU), how its instructions were counted (exact counts
are judged tightly), and how the baseline's machine and pipeline differ from this run's (a baseline from
another machine is reported, never failed). The gate (:mod:`cupy_nwt.pytest_plugin._gate`) reads them
from both runs' ``extra_info`` through :func:`context_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._cost import finite
from ._loader_run import IO_BOUND_CORES

#: CPU left idle (cores) beside a pipeline using under IO_BOUND_CORES for it to count as I/O-bound
IDLE_CORES = 0.5
#: what of a machine an exact count depends on: the CPU's model (NumPy picks its SIMD code by it) and the CPUs
#: usable (thread pools); not its memory, GPU or PCIe link, which callgrind's fixed simulated machine ignores
COUNT_MACHINE_KEYS = ("cpu_model", "usable_cpus")


@dataclass(frozen=True)
class Context:
    """What a benchmark's figures are read with: its CPU use, the machine's other load, the machines."""

    old_cores: float | None = None  # the pipeline's CPU seconds per wall second
    new_cores: float | None = None
    old_others: float | None = None  # cores other processes took meanwhile
    new_others: float | None = None
    cpus: int | None = None  # the CPUs other processes' load was read on (else this machine's usable CPUs)
    other_machine: str = ""  # how the baseline's machine differs, "" when the same (or unknown)
    count_machine: str = ""  # the part of it an exact count depends on (``COUNT_MACHINE_KEYS``)
    software_change: str = ""  # how the software that counted differs (both runs recorded it), "" when the same
    pipeline_change: str = ""  # how the pipeline differs from the baseline's, "" when the same
    old_counted: str = ""  # how instructions were counted: "callgrind", "perf" or ""
    new_counted: str = ""
    old_count_samples: int | None = None  # the samples callgrind counted
    new_count_samples: int | None = None
    old_cost_model: str = ""  # the cost's weights (._cost.MODEL), "" when no cost was counted
    new_cost_model: str = ""

    @property
    def exact_counts(self) -> bool:
        """Both runs' instructions counted exactly (callgrind) over the same number of samples."""
        return (self.old_counted == self.new_counted == "callgrind"
                and self.old_count_samples == self.new_count_samples)

    @property
    def exact_cost(self) -> bool:
        """Both runs' costs counted exactly, over the same samples, with the same weights."""
        return self.exact_counts and self.old_cost_model == self.new_cost_model != ""

    @property
    def io_bound(self) -> bool:
        """Both runs used under ``IO_BOUND_CORES`` cores while CPU stood idle that they could have had.

        On a machine that other processes kept busy a CPU-bound pipeline gets little CPU too: there,
        little CPU says nothing of what it waits for, so it is not called I/O-bound.
        """
        return (_waits(self.old_cores, self.old_others, self.cpus)
                and _waits(self.new_cores, self.new_others, self.cpus))


def _waits(cores: float | None, others: float | None, cpus: int | None) -> bool:
    if cores is None or cores >= IO_BOUND_CORES:
        return False
    return others is None or not cpus or cpus - cores - others >= IDLE_CORES


def _differences(old: Any, new: Any) -> str:
    if not isinstance(old, Mapping) or not isinstance(new, Mapping) or not old or not new:
        return ""
    diff = [f"{k} {old.get(k)!r} in the baseline, {new.get(k)!r} here" for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)]
    return "; ".join(diff)


def context_of(old_info: Mapping[str, Any], new_info: Mapping[str, Any]) -> Context:
    def num(info: Mapping[str, Any], key: str) -> float | None:
        return finite(info.get(key))

    machine = new_info.get("machine")
    cpus = new_info.get("cpus_watched")
    if cpus is None and isinstance(machine, Mapping):
        cpus = machine.get("usable_cpus")
    def counted(info: Mapping[str, Any]) -> str:
        by = info.get("instructions_counted_by")
        return by if isinstance(by, str) else ("perf" if info.get("instructions_per_sample_rounds") else "")

    def samples(info: Mapping[str, Any]) -> int | None:
        v = info.get("instructions_samples")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def model(info: Mapping[str, Any]) -> str:
        v = info.get("cost_model")
        return v if isinstance(v, str) and info.get("cost_per_sample") is not None else ""

    old_machine = old_info.get("machine")
    return Context(
        num(old_info, "cpu_cores"), num(new_info, "cpu_cores"), num(old_info, "others_cores"),
        num(new_info, "others_cores"), cpus if isinstance(cpus, int) and not isinstance(cpus, bool) else None,
        _differences(old_machine, machine), _differences(_only(old_machine), _only(machine)),
        _differences(old_info.get("count_software"), new_info.get("count_software")),
        _differences(old_info.get("pipeline"), new_info.get("pipeline")),
        counted(old_info), counted(new_info), samples(old_info), samples(new_info), model(old_info), model(new_info),
    )


def _only(machine: Any) -> Any:
    """A machine fingerprint's keys an exact count depends on."""
    return {k: machine.get(k) for k in COUNT_MACHINE_KEYS} if isinstance(machine, Mapping) else machine
