"""A plain NumPy training loop on the CPU, fed by cupy_nwt's DataLoader. No GPU needed.

    python examples/numpy_cpu_loop.py --samples 4096 --epochs 2

Softmax regression on the embedded synthetic CIFAR-10: small enough to read in one glance, real
enough that the loss must fall. ``num_workers="auto"`` takes the pick saved for this machine and
dataset; on the first run, with none saved, it tunes online and saves the count it settles at, which
later runs reuse.
"""

from __future__ import annotations

import argparse

import numpy as np

from cupy_nwt import DataLoader
from cupy_nwt.data import CifarTrainTransform, SyntheticCIFAR10


def sgd_step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float) -> float:
    """One SGD step of softmax regression on a batch, in place; returns the batch's loss."""
    x = x.reshape(len(x), -1)
    logits = x @ w
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss = float(-np.log(p[rows, y] + 1e-12).mean())
    p[rows, y] -= 1.0
    w -= lr * (x.T @ p) / len(y)
    return loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args(argv)

    data = SyntheticCIFAR10(n=args.samples)
    w = np.zeros((3 * 32 * 32, 10), np.float32)
    with DataLoader(data, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True, device="cpu",
                    num_workers="auto", batch_transform=CifarTrainTransform()) as loader:
        for epoch in range(args.epochs):
            losses = [sgd_step(w, x, y, lr=0.01) for x, y in loader]
            print(f"epoch {epoch}: mean loss {np.mean(losses):.4f} over {len(losses)} batches")
        print(f"numpy on the CPU, num_workers={loader.num_workers} (picked by the tuner)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
