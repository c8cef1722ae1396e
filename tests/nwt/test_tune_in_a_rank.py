"""A search run in one rank of a launched job (torchrun, SLURM, MPI) tunes for that rank: within its share of
the node's CPUs, saved under the key ``num_workers="auto"`` looks up in that rank."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_nwt import DataLoader, system, tune_num_workers

DATA = np.zeros((256, 4), np.float32)


def _faster_with_workers(workers: int, iterations: int, warmup: int) -> float:
    return 0.05 / (workers + 1)


@pytest.fixture
def rank_of(monkeypatch, tmp_path):
    """Makes this process rank 0 of ``ranks`` on one node, as torchrun's variables say."""
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path))

    def launch(ranks: int) -> None:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))

    return launch


def test_a_pick_tuned_and_saved_in_a_rank_is_the_pick_auto_uses_in_it(rank_of):
    rank_of(2)
    result = tune_num_workers(DATA, batch_size=16, strategy="paper", max_workers=3, iterations=4, device="cpu",
                              measure=_faster_with_workers, progress=False, warn=False)
    assert result.best_workers == 2 and result.save_pick().replaced
    with DataLoader(DATA, batch_size=16, num_workers="auto", device="cpu", autotune=False) as loader:
        assert loader.num_workers == 2
        assert loader.stats().num_workers_why.startswith("picked 2 workers")


def test_a_search_in_a_rank_stays_within_its_share_of_the_node(rank_of):
    cpus = system.usable_cpus()
    rank_of(cpus)  # one CPU each: counts 0..0, as a loader in that rank runs its main process alone
    result = tune_num_workers(DATA, batch_size=16, strategy="paper", iterations=4, device="cpu",
                              measure=_faster_with_workers, progress=False, warn=False)
    assert [t.workers for t in result.trials] == [0]
    assert result.max_workers == 1 and result.usable_cpus == 1
