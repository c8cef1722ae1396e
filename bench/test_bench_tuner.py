"""pytest-benchmark: the Num Worker Tuner on real loading, fast search against the paper's exhaustive one.

The workload is the tuner's default: the synthetic CIFAR-10 (PNG decode per sample) with the
CIFAR training augmentation in the workers, batch 128, on the GPU when there is one (each batch
then includes its H2D copy) and on the host otherwise. N is the usable CPUs, or
$CUPY_NWT_BENCH_MAX_WORKERS.

* ``test_search[paper|fast]`` times each whole search (one round): the pick, the search's own cost
  (sum of its trials' wall time) and its ratio to the exhaustive search's go into ``extra_info``.
* ``test_pick_throughput`` then measures the fast pick, the paper's pick and the exhaustive
  search's fastest count again on equal footing (``REPEATS`` rounds of ``BATCHES`` batches after
  warm-up, the counts interleaved within each round, medians): samples/s of each and the picks'
  ratios to the fastest count go into ``extra_info``.

The targets (fast pick within 5% of the exhaustive best, for at most 30% of its cost) are reported,
not asserted: a shared machine's noise would make such an assertion flaky. Run with ``-s`` to see
the summary lines.
"""

from __future__ import annotations

import os
import statistics

import pytest

from cupy_nwt import system
from cupy_nwt.datasets import SyntheticCIFAR10
from cupy_nwt.transforms import CifarTrainTransform
from cupy_nwt.tuner import LoaderMeasure, tune_num_workers

BATCH_SIZE = 128
IMAGES = 16384
BATCHES = 50
REPEATS = 5
MAX_WORKERS = int(os.environ.get("CUPY_NWT_BENCH_MAX_WORKERS") or system.usable_cpus())

pytestmark = pytest.mark.slow
_searches: dict = {}


@pytest.fixture(scope="module")
def dataset():
    return SyntheticCIFAR10(n=IMAGES)


def _search(dataset, strategy: str):
    return tune_num_workers(dataset, batch_size=BATCH_SIZE, max_workers=MAX_WORKERS, strategy=strategy,
                            batch_transform=CifarTrainTransform(), progress=False)


def _get(dataset, strategy: str):
    if strategy not in _searches:  # when run alone (-k), search here, untimed
        _searches[strategy] = _search(dataset, strategy)
    return _searches[strategy]


@pytest.mark.parametrize("strategy", ["paper", "fast"])
def test_search(benchmark, dataset, strategy):
    benchmark.group = "NWT search"
    result = benchmark.pedantic(lambda: _search(dataset, strategy), rounds=1, iterations=1, warmup_rounds=0)
    _searches[strategy] = result
    assert 0 <= result.best_workers < MAX_WORKERS
    info = {"strategy": strategy, "pick": result.best_workers, "max_workers": MAX_WORKERS,
            "device": result.device, "counts_measured": len(result.trials), "runs": len(result.runs),
            "search_seconds": result.search_seconds}
    if strategy == "fast":
        paper = _get(dataset, "paper")
        info["cost_vs_exhaustive"] = result.search_seconds / paper.search_seconds
    benchmark.extra_info.update(info)
    print(f"\n[NWT {strategy}] pick {result.best_workers} of 0..{MAX_WORKERS - 1}, {len(result.runs)} trials, "
          f"{result.search_seconds:.1f} s" + (f" = {info['cost_vs_exhaustive']:.0%} of the exhaustive search"
                                               if "cost_vs_exhaustive" in info else ""))


def _fastest(result) -> int:
    return min(result.trials, key=lambda t: (t.seconds_per_iteration, t.workers)).workers


def _interleaved_rates(dataset, device: str, counts: list[int]) -> dict[int, float]:
    """Median samples/s per worker count over REPEATS rounds, the counts interleaved in each round,
    so drift on a shared machine hits them alike; warm-up (start-up, first round) untimed."""
    m = LoaderMeasure(dataset, batch_size=BATCH_SIZE, device=device, batch_transform=CifarTrainTransform())
    rates: dict[int, list[float]] = {w: [] for w in counts}
    for _ in range(REPEATS):
        for w in counts:
            rates[w].append(BATCH_SIZE / m(w, BATCHES, w + 1).seconds_per_iteration)
    return {w: statistics.median(r) for w, r in rates.items()}


def test_pick_throughput(benchmark, dataset):
    paper, fast = _get(dataset, "paper"), _get(dataset, "fast")
    roles = {"exhaustive_fastest": _fastest(paper), "paper_pick": paper.best_workers, "fast_pick": fast.best_workers}
    counts = sorted(set(roles.values()))
    benchmark.group = "NWT pick throughput"
    rates = benchmark.pedantic(lambda: _interleaved_rates(dataset, paper.device, counts), rounds=1, iterations=1,
                               warmup_rounds=0)
    info = {f"{role}_workers": w for role, w in roles.items()}
    info.update({f"{role}_samples_per_s": rates[w] for role, w in roles.items()})
    best = rates[roles["exhaustive_fastest"]]
    info["fast_pick_vs_exhaustive_fastest"] = rates[roles["fast_pick"]] / best
    info["paper_pick_vs_exhaustive_fastest"] = rates[roles["paper_pick"]] / best
    benchmark.extra_info.update(info)
    for role, w in roles.items():
        print(f"\n[NWT {role}] {w} workers: {rates[w]:,.0f} samples/s = {rates[w] / best:.1%} of the fastest count")
