"""Lightning as its users write it, with cupy_nwt's DataLoader: a 2-device DDP fit on the CPU and a
mid-epoch checkpoint resumed with ``Trainer(ckpt_path=...)``. Each runs as a script (DDP's launcher starts
the script again for rank 1); skipped with the reason where Lightning or torch is absent.

Lightning cannot hand cupy_nwt's loader a ``DistributedSampler`` (it is no torch DataLoader), so the loader
shards itself by the ``torch.distributed`` group (or the launcher's variables), takes ``set_epoch`` on
``loader.sampler`` where Lightning calls it, ignores Lightning's throwaway ``iter()``, and gives Lightning
its ``state_dict()`` for the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODEL = """
import glob, json, sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import cupy_nwt


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i


class Model(L.LightningModule):
    def __init__(self, out="."):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.out, self.seen = out, []

    def train_dataloader(self):
        return cupy_nwt.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=WORKERS)

    def training_step(self, batch, batch_idx):
        x, index = batch
        self.seen.append([self.current_epoch, index.tolist()])
        return self.layer(x).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self):
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as f:
            json.dump(self.seen, f)
"""

DDP = MODEL.replace("WORKERS", "1") + """
if __name__ == "__main__":
    where = sys.argv[1]
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[2], max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    if where == "hook":  # the loader made in train_dataloader(), once the process group is up
        trainer.fit(Model())
    else:  # the loader made before fit() launched the ranks (with "ddp_spawn", pickled to each of them)
        trainer.fit(Model(), train_dataloaders=cupy_nwt.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=1))
"""

CHECKPOINT = MODEL.replace("WORKERS", "2") + """
def trainer(**kwargs):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, **kwargs)


if __name__ == "__main__":
    whole = Model()
    trainer(callbacks=[ModelCheckpoint(dirpath="ckpt", every_n_train_steps=15, save_top_k=-1)]).fit(whole)
    (mid,) = glob.glob("ckpt/epoch=1-step=15.ckpt")  # 5 of the second epoch's 10 batches trained
    resumed = Model()
    trainer(enable_checkpointing=False).fit(resumed, ckpt_path=mid)
    print(json.dumps({"whole": whole.seen, "resumed": resumed.seen}))
"""


def run(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch", reason="torch is a test-only extra")
    pytest.importorskip("lightning", reason="Lightning is a test-only extra")
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "train.py", *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize(("where", "strategy"), [("hook", "ddp"), ("before-fit", "ddp"), ("before-fit", "ddp_spawn")])
def test_ddp_on_two_cpu_devices_gives_each_rank_its_share_once_and_reshuffles(tmp_path: Path, where: str,
                                                                            strategy: str) -> None:
    run(tmp_path, DDP, where, strategy)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    orders = []
    for epoch in (0, 1):
        shares = [[i for e, batch in seen if e == epoch for i in batch] for seen in ranks]
        assert [len(s) for s in shares] == [20, 20]  # 5 batches of 4 a rank, as DistributedSampler deals 40
        assert sorted(shares[0] + shares[1]) == list(range(40))  # every sample once across the ranks
        orders.append(shares[0])
    assert orders[0] != orders[1]  # set_epoch reached the loader: the second epoch has its own order


def test_a_mid_epoch_checkpoint_resumes_the_loader_exactly(tmp_path: Path) -> None:
    proc = run(tmp_path, CHECKPOINT)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    whole, resumed = seen["whole"], seen["resumed"]
    assert len(whole) == 30 and whole[15][0] == 1
    assert resumed == whole[15:]  # the rest of epoch 1, then epoch 2: nothing skipped, nothing repeated
