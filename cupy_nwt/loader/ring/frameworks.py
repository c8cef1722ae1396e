"""Batches in the framework the samples came in (NumPy, torch, JAX; CuPy on the GPU), or the one asked for.

A torch training loop calls ``images.to(device)``; a JAX one hands batches to a jitted step. So a
sample that holds torch tensors (or JAX arrays) gives a batch of torch tensors (JAX arrays), as
torch's ``default_collate`` does: every array field of it, its numbers included. The ring carries
NumPy bytes either way; the framework travels as a tag on the batch structure's leaves
(``("leaf", "torch")``, see ``tree``), and the leaf is rebuilt in that framework when the batch is
joined: ``torch.from_numpy`` over the host array (no copy: over the ring slot itself with
``zero_copy``), DLPack over a device array, ``jax.numpy.asarray`` for JAX.

torch and JAX are never imported here unless a leaf or the ``output`` option names them: a leaf is
recognised through ``sys.modules`` (a torch tensor exists only once torch is imported).
"""

from __future__ import annotations

import importlib.util
import pickle
import sys
from typing import Any

import numpy as np

from ...errors import ArgumentError, LoaderError

FRAMEWORKS = ("torch", "jax")
OUTPUTS = ("auto", "numpy", "cupy", "torch", "jax")
AUTO_TORCH = "auto+torch"  # "auto" in a program that uses torch: NumPy leaves joined as torch tensors, others kept


def uses_torch() -> bool:
    """Does this program use torch? Yes once it has imported torch (a torch ``Dataset`` implies it)."""
    return "torch" in sys.modules


def joined_output(output: str, torch_in_use: bool, default_collate: bool) -> str:
    """What batches are joined as: ``output`` as given, except that "auto" with torch's default collate in a
    program that uses torch gives what torch's ``DataLoader`` gives: NumPy arrays and Python numbers as
    tensors (torch's ``default_collate``, or ``default_convert`` unbatched). A ``collate_fn`` of the user's
    returns what it returns, under torch too."""
    if output == "auto" and torch_in_use and default_collate:
        return AUTO_TORCH
    return output


def framework_of(x: Any) -> str | None:
    """"torch" for a torch tensor, "jax" for a JAX array, None for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, getattr(torch, "Tensor", ())):
        return "torch"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, getattr(jax, "Array", ())):
        return "jax"
    return None


def refuse_uncollatable(leaves: list[Any], where: str) -> None:
    """torch's ``default_collate`` refuses nested and sparse tensors, and so does ours, in its words first."""
    for x in leaves:
        if framework_of(x) != "torch":
            continue
        what = "nested" if x.is_nested else "sparse" if str(x.layout) != "torch.strided" else None
        if what is not None:
            raise LoaderError(f"Batches of {what} tensors are not currently supported by the default collate_fn; "
                              "please provide a custom collate_fn to handle them appropriately. "
                              f"cupy_nwt: {where} holds a {what} tensor, which cannot be stacked into one dense "
                              "array; collate_fn=list hands the samples over as they are")


_BITS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}  # torch's integer dtype of each item size


def host_view(x: Any, framework: str) -> tuple[np.ndarray, str | None] | None:
    """A framework array as a NumPy array over the same host memory, and the torch dtype its items stand
    for where NumPy lacks it (None: the array's own); None when it has no host memory (a GPU tensor, one
    that requires grad): it then travels pickled, as it is.

    A torch dtype NumPy lacks (``bfloat16``, the ``float8`` kinds, ``complex32``) is carried as its bits, an
    integer array of its item size, and viewed back as that dtype when the batch is joined: no copy, no
    rounding, where torch's own pickling of several of them fails."""
    try:
        if framework != "torch":
            return np.asarray(x), None
        if x.device.type != "cpu" or x.requires_grad:
            return None
        if x.is_conj() or x.is_neg():  # a lazy view NumPy cannot read: its values, as torch.stack gives them
            x = x.resolve_conj().resolve_neg()
        try:
            return np.asarray(x.numpy()), None
        except TypeError:  # a dtype NumPy lacks
            bits = _BITS.get(x.element_size())
            if bits is None:
                return None
            return np.asarray(x.view(getattr(sys.modules["torch"], bits)).numpy()), str(x.dtype).removeprefix("torch.")
    except (TypeError, RuntimeError, ValueError):
        return None


_PICKLES: dict[Any, bool] = {}  # per torch dtype: does torch's own pickle of a tensor of it load back


def tensor_reduction(x: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """How to pickle ``x`` where torch's own pickle of it does not load back (``uint16``, ``uint32``, ``uint64``,
    the ``float8`` kinds, ``complex32`` in torch 2.x: its reader asks a storage type for a dtype it lacks): as
    its bytes in a NumPy array, made a tensor of its dtype again by ``to_framework``. None for anything else,
    a plain CPU tensor of another dtype included (torch pickles those itself)."""
    torch = sys.modules.get("torch")
    if torch is None or type(x) is not torch.Tensor:
        return None
    pickles = _PICKLES.get(x.dtype)
    if pickles is None:
        try:
            pickle.loads(pickle.dumps(torch.zeros(1, dtype=x.dtype)))
            pickles = True
        except Exception:  # noqa: BLE001 - whatever torch raises, its pickle of this dtype is not to be used
            pickles = False
        _PICKLES[x.dtype] = pickles
    named = getattr(x, "has_names", None)  # named tensors: gone from recent torch
    if pickles or x.__dict__ or (named is not None and named()):
        return None
    host = host_view(x, "torch")
    return None if host is None else (to_framework, (host[0], "torch", host[1]))


def to_framework(a: Any, framework: str, dtype: str | None = None) -> Any:
    """``a`` (a NumPy array, or a device array with DLPack) as an array of ``framework``, without a copy
    where the framework allows it; ``dtype`` names the torch dtype whose bits ``a`` carries (``host_view``)."""
    if framework == "torch":
        import torch  # noqa: PLC0415 - only for batches of torch tensors, or output="torch"

        if isinstance(a, np.ndarray):
            if not a.flags.writeable or any(s < 0 for s in a.strides):
                a = a.copy()  # torch tensors are always writable: never one over memory NumPy protects
            t = torch.from_numpy(a)
        else:
            t = torch.from_dlpack(a)
        return t if dtype is None else t.view(getattr(torch, dtype))
    if framework == "jax":
        import jax  # noqa: PLC0415 - only for batches of JAX arrays, or output="jax"

        if isinstance(a, np.ndarray):
            return jax.numpy.asarray(a)
        return jax.dlpack.from_dlpack(a)
    return a


def check_output(output: Any, device: str) -> str:
    """``output`` as given, refused in one line where it cannot be served."""
    if output not in OUTPUTS:
        raise ArgumentError(f"output must be one of {', '.join(map(repr, OUTPUTS))}; got {output!r}")
    if output == "cupy" and device != "cuda":
        raise ArgumentError("output='cupy' gives GPU arrays: it needs device='cuda' (or 'auto' on a machine with a GPU)")
    if output == "numpy" and device == "cuda":
        raise ArgumentError("output='numpy' gives host arrays: use device='cpu' for them (device='cuda' copies to the GPU)")
    if output in FRAMEWORKS and importlib.util.find_spec(output) is None:
        raise ArgumentError(f"output={output!r}, but {output} is not installed")
    return str(output)


def torch_global_seed() -> int | None:
    """A seed drawn from torch's global generator, if torch is imported: so ``torch.manual_seed(s)`` before
    the loader is made repeats its epochs, as it does torch's (which draws its base seed the same way)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "empty") or not hasattr(torch, "int64"):
        return None  # absent, or only half imported
    return int(torch.empty((), dtype=torch.int64).random_().item()) & ((1 << 63) - 1)


def generator_seed(generator: Any) -> int | None:
    """The loader's seed drawn from a ``torch.Generator``, as torch draws its base seed from one
    (``torch.empty((), dtype=torch.int64).random_(generator=...)``); None if it is not one."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(generator, getattr(torch, "Generator", ())):
        return None
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
