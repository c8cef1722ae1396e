"""The gate's deciding count for a CPU-bound pipeline: instructions, cache misses and kernel work in one cost.

An instruction count cannot see memory traffic or the kernel: three NumPy passes over fresh copies of
a batch cost a third more CPU while adding under 1% instructions (``bench/studies/what_does_the_gate_see``).
So, as CodSpeed does, callgrind simulates the caches and each miss is weighted into an estimate of
cycles, and the kernel's share is added from counts that are exact too: the minor page faults of the
counted region, run natively (a fresh page is a fault and a zeroed 4 KiB), and its system calls
(valgrind's log). Every component is a count of the same code on the same samples, so no neighbour
moves it; the weights turn them into one figure, in estimated cycles per sample:

    cost = Ir + W_L1 * (I1mr + D1mr + D1mw) + W_LL * (ILmr + DLmr + DLmw) + W_FAULT * page faults + W_SYSCALL * syscalls

The weights were chosen by measurement (the study's ``cost_model.py``): ``W_L1``/``W_LL`` are the
usual cycle-estimate weights (callgrind's own and CodSpeed's), kept because they rank the study's
memory-bound variants as their native CPU time does; ``W_FAULT`` and ``W_SYSCALL`` are the native
CPU seconds of one page fault and one ``stat`` system call, measured on the study's machine,
divided by its native seconds per estimated cycle of the unchanged pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

W_L1 = 10.0
W_LL = 100.0
W_FAULT = 35_000.0
W_SYSCALL = 20_000.0
WEIGHTS = {"l1_misses": W_L1, "ll_misses": W_LL, "page_faults": W_FAULT, "syscalls": W_SYSCALL}
#: the model's name, stored beside the cost: a cost under other weights is shown, not judged
MODEL = "cycles(" + ",".join(f"{k}={w:g}" for k, w in WEIGHTS.items()) + ")"
#: components, in the order they are shown: (key, what it is)
COMPONENTS = (("instructions", "instructions"), ("l1_misses", "L1 misses"), ("ll_misses", "LL misses"),
              ("page_faults", "page faults"), ("syscalls", "syscalls"))


@dataclass(frozen=True)
class Cost:
    """Per-sample counts of one region and the cost they weigh up to."""

    instructions: float
    l1_misses: float
    ll_misses: float
    page_faults: float
    syscalls: float

    @property
    def total(self) -> float:
        return self.instructions + sum(w * getattr(self, k) for k, w in WEIGHTS.items())

    def weighted(self) -> dict[str, float]:
        """Each component's share of the cost, in estimated cycles per sample."""
        return {k: getattr(self, k) * WEIGHTS.get(k, 1.0) for k, _ in COMPONENTS}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cost_of(events: Mapping[str, int], page_faults: int, syscalls: int, samples: int) -> Cost:
    """The per-sample cost of a region from callgrind's ``events``, its page faults and system calls."""
    def ev(*names: str) -> float:
        return float(sum(events.get(n, 0) for n in names)) / samples

    return Cost(ev("Ir"), ev("I1mr", "D1mr", "D1mw"), ev("ILmr", "DLmr", "DLmw"), page_faults / samples,
                syscalls / samples)


def finite(value: Any) -> float | None:
    """A figure read from an ``extra_info`` (anyone's, unchecked) as a finite float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int past float's range
        return None
    return value if math.isfinite(value) else None


def components_of(info: Mapping[str, Any]) -> dict[str, float] | None:
    """The per-sample components stored in a benchmark's ``extra_info``; None when absent or malformed."""
    raw = info.get("cost_components")
    if not isinstance(raw, Mapping):
        return None
    out = {}
    for k, _ in COMPONENTS:
        v = finite(raw.get(k))
        if v is None or v < 0:
            return None
        out[k] = v
    return out
