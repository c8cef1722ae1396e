"""A CuPy training step on the GPU, fed by cupy_nwt's DataLoader (batches arrive as CuPy arrays).

    python examples/cupy_train_step.py --samples 8192 --epochs 2

The loader copies batch n+1 to the GPU on a side stream while the step below works on batch n.
Without a usable GPU this example says why, does nothing else, and exits 0: it is a GPU example.
"""

from __future__ import annotations

import argparse

from cupy_nwt import DataLoader, cuda, gpu_status
from cupy_nwt.data import CifarTrainTransform, SyntheticCIFAR10


def sgd_step(w, x, y, lr: float):
    """One SGD step of softmax regression on device arrays, in place; returns the loss (on device)."""
    import cupy as cp

    x = x.reshape(len(x), -1)
    logits = x @ w
    p = cp.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rows = cp.arange(len(y))
    loss = -cp.log(p[rows, y] + 1e-12).mean()
    p[rows, y] -= 1.0
    w -= lr * (x.T @ p) / len(y)
    return loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args(argv)

    status = gpu_status()
    if not status.available:
        print(f"skipped: this example trains on a GPU and there is none usable here ({status.reason})")
        return 0
    import cupy as cp

    data = SyntheticCIFAR10(n=args.samples)
    w = cp.zeros((3 * 32 * 32, 10), cp.float32)
    with DataLoader(data, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True, device="cuda",
                    pin_memory=True, num_workers="auto", batch_transform=CifarTrainTransform()) as loader:
        for epoch in range(args.epochs):
            losses = [sgd_step(w, x, y, lr=0.01) for x, y in loader]
            print(f"epoch {epoch}: mean loss {float(cp.stack(losses).mean()):.4f} over {len(losses)} batches")
        print(f"cupy on {cuda.device_info().name}, num_workers={loader.num_workers} (picked by the tuner), "
              f"H2D from {loader.pin_path} memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
