"""The user's own pipeline for ``cupy-nwt tune`` and ``stats``: transforms named as ``module:attribute``.

A worker count tuned on a pipeline the user does not run describes nothing: decoding plus CIFAR
augmentation costs several times what decoding alone does, so the two have different best counts,
and their fingerprints differ, so ``DataLoader(num_workers="auto")`` on the user's pipeline would
not even find the pick. So the commands run the data as the loader would run it: no transform
unless one is named. ``--transform`` is the dataset's per-sample transform (``transform=`` of the
datasets in ``cupy_nwt.data``) and ``--batch-transform`` the loader's ``batch_transform``, each
an importable ``module:attribute`` (a class is instantiated without arguments; ``cifar`` names
``cupy_nwt.data.transforms.CifarTrainTransform``). Both end up in the fingerprint under the callable's
qualified name, as they do when the user's script builds the loader.

Only the embedded synthetic CIFAR-10 (no ``--dataset``) keeps the CIFAR training augmentation by
default: it stands for the paper's workload, and ``--no-transform`` turns it off. Its first use on
a machine builds it, in a process of its own (:func:`build_synthetic_apart`): built in the process
that then measures, its buffers would sit in every trial's memory figure on the first run only.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ArgumentError, RunError
from ..picks.fingerprint import WRAPS

SHORTCUTS = {"cifar": "cupy_nwt.data.transforms:CifarTrainTransform"}


def load_callable(spec: str, option: str) -> Callable[..., Any]:
    """Import ``module:attribute`` (dotted attributes allowed) and return it, a class instantiated.

    The current folder is searched first, as ``python -m`` does, so a module beside the user's data
    or script is found from the ``cupy-nwt`` command too. Every failure is one ``ValueError`` line.
    """
    target = SHORTCUTS.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ArgumentError(f"{option} must be module:attribute (for example mypipeline:decode), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ArgumentError(f"{option} {spec}: no module named {exc.name!r}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed on import: one line, not a traceback
        raise ArgumentError(f"{option} {spec}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ArgumentError(f"{option} {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - as above
            raise ArgumentError(f"{option} {spec}: {attr}() failed: {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise ArgumentError(f"{option} {spec}: {attr} is a {type(obj).__name__}, not a callable")
    return obj


def named_step(step: Callable[[Any], Any], option: str) -> Callable[[Any], Any]:
    """The user's step as the command runs it: what it raises ends the run as one ``RunError`` line that
    names the option, not as "unexpected error". The saved pick is keyed by the step's own name
    (``fingerprint.WRAPS``), as when the same step is given to ``tune_num_workers``."""

    def run(batch: Any) -> Any:
        try:
            return step(batch)
        except Exception as exc:
            raise RunError(f"{option} raised {type(exc).__name__}: {exc}") from exc

    setattr(run, WRAPS, step)
    return run


def check_pipeline(dataset: Any, args: Any, batch_transform: Any) -> None:
    """Before a run: the CIFAR augmentation named on a ``--dataset`` needs images (one-line ``DataError`` if not)."""
    from ..data.datasets import check_images  # noqa: PLC0415 - heavy (Pillow, Numba); only this check needs them
    from ..data.transforms import CifarTrainTransform  # noqa: PLC0415

    if args.dataset and isinstance(batch_transform, CifarTrainTransform):
        check_images(dataset, args.dataset, f"--batch-transform {args.batch_transform} (the CIFAR augmentation)")


def pipeline(args: Any, *, synthetic_default: bool) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
    """The (per-sample transform, batch transform) that ``tune``/``stats`` options name.

    ``synthetic_default``: no ``--dataset``, so the synthetic CIFAR-10 keeps its CIFAR augmentation
    unless ``--no-transform`` or a ``--batch-transform`` says otherwise.
    """
    sample = load_callable(args.transform, "--transform") if args.transform else None
    if args.batch_transform:
        if args.no_transform:
            raise ArgumentError("--no-transform and --batch-transform contradict each other")
        return sample, load_callable(args.batch_transform, "--batch-transform")
    if synthetic_default and not args.no_transform:
        return sample, load_callable("cifar", "--batch-transform")
    return sample, None



def open_pipeline(args: Any, synthetic_n: int, progress: bool,
                  transforms: tuple[Callable[..., Any] | None, Callable[..., Any] | None]) -> tuple[Any, Callable[..., Any] | None]:
    """The dataset (``--dataset``, else the synthetic CIFAR-10) with its per-sample transform, and the
    batch transform (``transforms``: what :func:`pipeline` gave, loaded before any long work), as ``tune``
    and ``stats`` run them; ``args.opened_dataset`` lets an error name the file behind a failing sample index."""
    from ..data import datasets  # noqa: PLC0415 - heavy (Pillow, Numba); only the commands need them

    sample_transform, transform = transforms
    dataset = (datasets.open_dataset(args.dataset, transform=sample_transform) if args.dataset
               else datasets.SyntheticCIFAR10(n=synthetic_n, transform=sample_transform, progress=progress))
    args.opened_dataset = dataset
    check_pipeline(dataset, args, transform)
    return dataset, transform

_BUILD = """
import json, sys
try:
    from cupy_nwt import ArgumentError
    from cupy_nwt.data import SyntheticCIFAR10
    built = SyntheticCIFAR10(n=int(sys.argv[1]), progress=sys.argv[2] == "1").built_now
    print(json.dumps({"built": built}))
except KeyboardInterrupt:
    sys.exit(130)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "usage": isinstance(exc, ArgumentError)}))
    sys.exit(1)
"""


def build_synthetic_apart(n: int, progress: bool) -> str:
    """Build the synthetic CIFAR-10's cache in a child process (its progress forwarded to our stderr)
    so that its memory never enters the trials' figures; says what happened, for a report.

    A failure is one line: the child's ``ArgumentError`` as ours (bad input, exit 2), anything else a
    ``RunError`` naming it; never the child's traceback. The size is checked here first
    (``check_synthetic_room``), so an impossible one starts nothing.
    """
    from ..data._synthetic import check_synthetic_room  # noqa: PLC0415 - heavy (Pillow, Numba)

    check_synthetic_room(n)
    proc = subprocess.Popen([sys.executable, "-c", _BUILD, str(n), "1" if progress else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
        out = proc.communicate()[0].strip()
    finally:  # on Ctrl-C the child has its own SIGINT and removes its half-built folder: wait for it
        proc.wait()
    try:
        said = json.loads(out.splitlines()[-1]) if out else {}
    except ValueError:
        said = {}
    if "error" in said:
        if said.get("usage"):
            raise ArgumentError(said["message"])
        raise RunError(f"building the synthetic CIFAR-10 failed in its own process: {said['error']}: {said['message']}")
    if proc.returncode != 0 or "built" not in said:
        raise RunError(f"building the synthetic CIFAR-10 failed in its own process (exit {proc.returncode})")
    if said["built"]:
        return "built by a separate process before the trials: its memory is in no trial's figures"
    return "already built (opened from the cache)"
