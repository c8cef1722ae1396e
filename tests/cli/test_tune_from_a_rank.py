"""``cupy-nwt tune`` run in one rank of a launched job saves the pick ``num_workers="auto"`` finds in that rank.

The search runs on a fake trial curve (``tune_num_workers(measure=...)`` behind the command); the command,
its checks, the fingerprint and the store are the real ones.
"""

from __future__ import annotations

import numpy as np

from cupy_nwt import DataLoader, cli
from cupy_nwt.data import open_dataset
from cupy_nwt.nwt import tune as nwt_tune

REAL = nwt_tune.tune_num_workers


def test_a_pick_tuned_from_the_shell_in_a_rank_is_found_by_auto_in_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUPY_NWT_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    data = np.zeros((64, 4), np.float32)
    np.save(tmp_path / "data.npy", data)
    monkeypatch.setattr(nwt_tune, "tune_num_workers", lambda dataset, **kw: REAL(
        dataset, **{**kw, "measure": lambda w, i, u: 0.05 / (w + 1)}))
    assert cli.main(["tune", "--dataset", str(tmp_path / "data.npy"), "--batch-size", "8", "--max-workers", "3",
                     "--strategy", "paper", "--alpha", "0", "--iterations", "4", "--device", "cpu",
                     "--no-progress"]) == 0
    assert "pick: 2 workers" in capsys.readouterr().out
    with DataLoader(open_dataset(tmp_path / "data.npy"), batch_size=8, num_workers="auto", device="cpu",
                    autotune=False) as loader:
        assert loader.num_workers == 2
