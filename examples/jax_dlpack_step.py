"""A JAX training step fed by cupy_nwt's DataLoader through DLPack: the images are not copied.

    python examples/jax_dlpack_step.py --samples 4096 --epochs 2

On a machine where both CuPy and JAX see a GPU, batches land on the GPU as CuPy arrays and JAX
adopts their memory (``__dlpack__`` makes JAX's stream wait for the copy). Elsewhere the loader
stays on the host and JAX adopts its NumPy batches, which are copies the loader will not reuse.
(Labels arrive as int64; JAX narrows them to int32 unless jax_enable_x64 is set.)
"""

from __future__ import annotations

import argparse
import os

# JAX grabs most of the GPU's memory up front by default; leave room for the loader's CuPy batches.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cupy_nwt import DataLoader, gpu_status  # noqa: E402
from cupy_nwt.data import (
    CifarTrainTransform,  # noqa: E402
    SyntheticCIFAR10,  # noqa: E402
)


def loss_fn(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(x.reshape(x.shape[0], -1) @ w)
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


@jax.jit
def sgd_step(w: jax.Array, x: jax.Array, y: jax.Array, lr: float = 0.01) -> tuple[jax.Array, jax.Array]:
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - lr * grad, loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args(argv)

    on_gpu = gpu_status().available and jax.default_backend() == "gpu"
    data = SyntheticCIFAR10(n=args.samples)
    w = jnp.zeros((3 * 32 * 32, 10), jnp.float32)
    with DataLoader(data, batch_size=args.batch_size, shuffle=True, seed=0, drop_last=True,
                    device="cuda" if on_gpu else "cpu", pin_memory=on_gpu, num_workers="auto",
                    batch_transform=CifarTrainTransform()) as loader:
        for epoch in range(args.epochs):
            losses = []
            for x, y in loader:
                w, loss = sgd_step(w, jax.dlpack.from_dlpack(x), jax.dlpack.from_dlpack(y))
                losses.append(loss)
            print(f"epoch {epoch}: mean loss {float(np.mean(jax.device_get(losses))):.4f} over {len(losses)} batches")
        print(f"jax on {jax.default_backend()}, batches from the loader on {loader.device}, "
              f"num_workers={loader.num_workers} (picked by the tuner)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
