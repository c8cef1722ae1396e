"""Where JPEG photographs decode: in the workers, or on the GPU fed by readers. The tuner measures both.

One JPEG source and one crop recipe (a :class:`~cupy_nwt.data.RandomResizedCrop`, the dataset's
``transform``) make the same batches in two ways:

* ``"cpu"``: the dataset as given. Each worker decodes its crop's region at the DCT scale, resizes,
  flips and normalises it; the batch arrives ready.
* ``"gpu"``: :class:`~cupy_nwt.data.EncodedJpegs` over the same source. Workers ("readers") only
  read the files and draw each crop and flip; :class:`~cupy_nwt.data.GpuJpegDecoder` decodes every
  batch in the consumer's loop, before the user's step, so its time is the main process's (and the
  GPU's) and counts in the loop the searches compare. The step then gets ``(images, labels)``, as
  on the CPU path.

Each placement is searched for its own count (``tune_num_workers``, fast strategy, the user's step
in every trial), and the pick is the placement whose own pick leaves the consumer's loop shortest:
with a fixed step, the least wait (for the GPU placement the wait includes the decode, which the
step waits for too). Placements within the tolerance and the noise of each other go to the fewer
workers (host cores), then to the CPU placement, which spends no GPU time on decoding.

Where ``GpuJpegDecoder`` would take its CPU path (no GPU, or no nvImageCodec) the GPU placement is
reported as not available and not measured: Pillow and NumPy's figures would say nothing of a GPU.
``gpu_stand_in=True`` measures it with that path anyway, to exercise the whole comparison on a
machine without a GPU; the result then says so.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import cuda
from .._checks import check_bool, check_int
from ..errors import ArgumentError
from ..picks.fingerprint import device_kind
from ..picks.pick import check_step
from ..picks.store import TuneResult, TypeBest
from ..picks.verdict import UnreliablePickWarning, _equal
from ..reporting.tables import write_json
from ..reporting.units import plural
from .fast import DEFAULT_TOLERANCE
from .footprint import search_memory_limit
from .measure import LoaderMeasure
from .trials import MeasureFn
from .tune import Searched, choose, resolve_main_process, tune_num_workers

if TYPE_CHECKING:
    from ..data import GpuJpegDecoder, RandomResizedCrop

PLACEMENT_FORMAT = "cupy_nwt.decode_placement/1"
DEFAULT_MAX_BYTES = 256 * 1024  # EncodedJpegs' own default, for sources whose file sizes cannot be listed


@dataclass(frozen=True)
class PlacementBest:
    """One placement's outcome: its pick and figures where it was measured, else why it was not.

    ``status`` is "measured", "stand-in" (the GPU placement measured through the decoder's CPU
    path: its figures are not a GPU's) or "not available"; ``reason`` says why for the last two.
    ``seconds_per_iteration`` is the consumer's loop per batch at ``workers``; ``wait_fraction``
    the share of it outside the user's step (None without a step).
    """

    placement: str
    status: str
    reason: str | None = None
    workers: int | None = None
    seconds_per_iteration: float | None = None
    wait_fraction: float | None = None
    samples_per_second: float | None = None
    rel_error: float | None = None
    search_seconds: float = 0.0

    @property
    def measured(self) -> bool:
        return self.seconds_per_iteration is not None

    def figure(self) -> str:
        """``"gpu decode at 2 readers: 5.2 ms a batch, 3.1% waiting"``, or why it was not measured."""
        name = f"{self.placement} decode"
        if not self.measured or self.workers is None:
            return f"{name}: {self.status}" + (f": {self.reason}" if self.reason else "")
        unit = "reader" if self.placement == "gpu" else "worker"
        assert self.seconds_per_iteration is not None
        head = f"{name} at {plural(self.workers, unit)}: {self.seconds_per_iteration * 1e3:.1f} ms a batch"
        wait = f", {self.wait_fraction:.1%} waiting" if self.wait_fraction is not None else ""
        return head + wait + (" (CPU stand-in)" if self.status == "stand-in" else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PlacementResult:
    """What :func:`tune_decode_placement` picked: the placement, its count, every placement's best, and why.

    ``result`` is the winning placement's own search (a :class:`~cupy_nwt.picks.store.TuneResult`
    with ``placement`` set and the other placement's best in ``other_types``); its fingerprint is
    that of the winning pipeline's loader (for the GPU placement, the ``EncodedJpegs`` loader on
    the CPU), so ``result.save_pick()`` records it where ``num_workers=AutoWorkers(step=...)`` on
    that loader finds it. ``decided`` says what settled it.
    """

    placement: str
    best_workers: int
    candidates: tuple[PlacementBest, ...]
    result: TuneResult
    decided: str

    @property
    def why(self) -> str:
        """One line: the pick, what decided it, each placement's best figure."""
        pick = next(c for c in self.candidates if c.placement == self.placement)
        others = "; ".join(c.figure() for c in self.candidates if c is not pick)
        core = self.result.core_left
        return (f"picked {pick.figure()}: {self.decided}" + (f" ({others})" if others else "")
                + (f"; {core}" if core else ""))

    @property
    def warning(self) -> str | None:
        """The winning search's warning when its count may not hold on another run (``TuneResult.warning``)."""
        return self.result.warning

    def to_dict(self) -> dict[str, Any]:
        return {"format": PLACEMENT_FORMAT, "placement": self.placement, "best_workers": self.best_workers,
                "why": self.why, "decided": self.decided, "warning": self.warning,
                "candidates": [c.to_dict() for c in self.candidates], "result": self.result.to_dict()}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (atomically).

        Args:
            path: the JSON file to write.
        """
        return write_json(self.to_dict(), path)


def _crop_of(dataset: Any) -> RandomResizedCrop:
    from ..data import RandomResizedCrop  # noqa: PLC0415 - the JPEG path's Numba kernels load when it is tuned
    crop = getattr(dataset, "transform", None)
    if not isinstance(crop, RandomResizedCrop):
        raise ArgumentError("tune_decode_placement needs a JPEG dataset (ImageFolder, TarImageDataset) whose "
                            f"transform is a RandomResizedCrop (the recipe both placements run), got "
                            f"{type(dataset).__name__} with transform {type(crop).__name__}")
    return crop


def _gpu_unavailable(dataset: Any, crop: RandomResizedCrop) -> str | None:
    """Why the GPU placement cannot make the CPU placement's batches from this dataset, or None."""
    if crop.normalize is None:
        return ("the crop gives uint8 samples (normalize=None) where the GPU decoder gives normalised float32 "
                "ones: give RandomResizedCrop normalize=(mean, std) to compare them")
    if not (hasattr(dataset, "read_bytes") or hasattr(dataset, "path")):
        return f"EncodedJpegs reads sources with path(i) or read_bytes(i) (ImageFolder, TarImageDataset), not {type(dataset).__name__}"
    return None


def _largest_file(dataset: Any) -> int:
    """The largest file of a source that lists paths (``ImageFolder``); EncodedJpegs' default otherwise."""
    path = getattr(dataset, "path", None)
    if not callable(path):
        return DEFAULT_MAX_BYTES
    return max(os.path.getsize(path(i)) for i in range(len(dataset)))


class _DecodeStage:
    """The GPU placement's work in the consumer's loop: ``(images, labels)`` from a batch of encoded bytes.

    On the GPU path the consumer's stream is synchronised after the decode, so the stage's time is
    the device's (training would queue the step behind it on the same stream). In a program that
    uses torch the images become a tensor (DLPack, no copy), as the CPU placement's loader gives them.
    """

    def __init__(self, decoder: GpuJpegDecoder) -> None:
        self.decoder = decoder

    def __call__(self, batch: Any) -> tuple[Any, Any]:
        images, labels = self.decoder(batch), batch["label"]
        if self.decoder.path == "gpu":
            cuda.current_stream().synchronize()
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(labels, torch.Tensor):  # a torch program: tensors, as the CPU placement's
            images = torch.from_dlpack(images)
        return images, labels


class _SyncedStep:
    """The user's step, followed by a wait for the consumer's stream: the loader runs on the CPU here,
    so the trial would not synchronise after a GPU step by itself."""

    def __init__(self, step: Callable[[Any], Any]) -> None:
        self.step = step

    def __call__(self, batch: Any) -> Any:
        out = self.step(batch)
        cuda.current_stream().synchronize()
        return out


def _best(placement: str, status: str, reason: str | None, result: TuneResult) -> PlacementBest:
    t = result.best_trial
    return PlacementBest(placement, status, reason, result.best_workers,
                         t.seconds_per_iteration if t is not None else None, t.wait_fraction if t is not None else None,
                         t.samples_per_second if t is not None else None, t.rel_error if t is not None else None,
                         result.search_seconds)


def _decide(searched: Sequence[Searched], tolerance: float) -> tuple[int, str]:
    """The winning candidate and what settled it.

    The shortest loop (``tune.choose``), unless another candidate's loop is within the tolerance
    and the noise of it with fewer workers, or as many and earlier in the list (the CPU placement
    comes first: it spends no GPU time on decoding).
    """
    if len(searched) == 1:
        return 0, "the only placement measured"
    win = choose(searched)
    best = searched[win].best_trial
    if best is None:
        return win, "no placement was measured (one count to search)"
    tied = [i for i, s in enumerate(searched) if i != win and (t := s.best_trial) is not None
            and _equal(t, best, tolerance)]
    cheaper = [i for i in tied if (searched[i].best_workers, i) < (searched[win].best_workers, win)]
    if cheaper:
        pick = min(cheaper, key=lambda i: (searched[i].best_workers, i))
        return pick, (f"its loop is within noise of {searched[win].placement} decode's, with "
                      f"{'fewer workers' if searched[pick].best_workers < searched[win].best_workers else 'no GPU decoding'}")
    if tied:
        return win, "the shortest loop, within noise of the other placement's and with no more workers"
    return win, "the shortest loop of the consumer"


def tune_decode_placement(dataset: Any, step: Callable[[Any], Any] | float | None, *, batch_size: int = 256,
                          max_workers: int | None = None, iterations: int = 100,
                          tolerance: float = DEFAULT_TOLERANCE, device: str = "auto", main_process: str = "auto",
                          prefetch_factor: int = 2, max_bytes: int | None = None, gpu_stand_in: bool = False,
                          seed: int = 0, measure: Mapping[str, MeasureFn] | None = None, progress: bool = True,
                          warn: bool = True) -> PlacementResult:
    """Measure where the JPEGs of ``dataset`` should decode, CPU workers or the GPU, and how many workers feed it.

    ``dataset`` is the CPU pipeline as you would train on it: an ``ImageFolder`` or a
    ``TarImageDataset`` with ``transform=RandomResizedCrop(...)`` (its size, scale, ratio, flip and
    normalisation are the recipe both placements run). The GPU pipeline reads the same files through
    ``EncodedJpegs`` and decodes each batch with ``GpuJpegDecoder`` in the consumer's loop before
    ``step`` (module docstring). Each is searched for its own count by the fast strategy with the step
    in every trial; the pick leaves the consumer's loop shortest, and the result says why
    (``result.why``). A count that leaves a core to the main process wins where that lowers the wait
    (the loop counts the step's slowdown when workers crowd its CPU), and the ``why`` says so when it did.

    Args:
        dataset: a JPEG ``ImageFolder`` or ``TarImageDataset`` whose ``transform`` is a ``RandomResizedCrop``.
        step: the training step: a callable taking a batch ``(images, labels)``, or its time in seconds.
        batch_size: the loader's batch size, as in training.
        max_workers: counts searched are 0 .. max_workers-1 for each placement; None: the open search.
        iterations: batches timed per trial at most (the fast strategy times a fifth to a tenth of it).
        tolerance: loops within this fraction of each other (and within noise) are equal.
        device: where batches go on the CPU placement ("auto", "cuda", "cpu"); also what the step runs on.
        main_process: the main process's load during training: "waits", "busy" or "auto" (by the device).
        prefetch_factor: the loader's ``prefetch_factor``.
        max_bytes: ``EncodedJpegs``' row width; None: the largest file (listed for an ``ImageFolder``,
            else 256 KiB).
        gpu_stand_in: measure the GPU placement with the decoder's CPU path where no GPU can decode
            (its figures are then not a GPU's; the result says so).
        seed: the GPU placement's crop and flip draws.
        measure: replaces a placement's real loader trials, by placement ("cpu", "gpu"; tests, other
            loaders); the GPU placement's availability is still checked.
        progress: show each search on stderr.
        warn: issue an ``UnreliablePickWarning`` when the winning search's pick may not hold on another run.
    """
    from ..data import EncodedJpegs, GpuJpegDecoder, gpu_decode_status  # noqa: PLC0415 - as in _crop_of

    crop = _crop_of(dataset)
    step = check_step(step)
    batch_size = check_int("batch_size", batch_size, ge=1)
    progress, warn = check_bool("progress", progress), check_bool("warn", warn)
    load = resolve_main_process(main_process, device_kind(device))
    common: dict[str, Any] = dict(batch_size=batch_size, max_workers=max_workers, iterations=iterations,
                                  strategy="fast", tolerance=tolerance, prefetch_factor=prefetch_factor,
                                  progress=progress, step=step, warn=False)
    fakes = dict(measure or {})
    if set(fakes) - {"cpu", "gpu"}:
        raise ArgumentError(f"measure takes placements 'cpu' and 'gpu', got {sorted(fakes)}")
    done: list[tuple[str, str, str | None, TuneResult]] = [
        ("cpu", "measured", None, tune_num_workers(dataset, device=device, main_process=main_process,
                                                   measure=fakes.get("cpu"), **common))]
    unavailable = _gpu_unavailable(dataset, crop)
    usable, why_not = gpu_decode_status()
    status, reason = "measured", None
    if unavailable is None and not usable:
        if gpu_stand_in:
            status, reason = "stand-in", f"GpuJpegDecoder's CPU path (Pillow and NumPy), not a GPU: {why_not}"
        else:
            unavailable = why_not or "no GPU decoding here"
    if unavailable is None:
        encoded = EncodedJpegs(dataset, max_bytes=_largest_file(dataset) if max_bytes is None else max_bytes,
                               crop=crop, flip_p=crop.flip_p, seed=seed)
        assert crop.normalize is not None
        decoder = GpuJpegDecoder(crop.size, *crop.normalize, device="cuda" if usable else "cpu",
                                 source=encoded.sample_source)
        gpu_step: Callable[[Any], Any] | float | None = step
        if callable(step) and usable:
            gpu_step = _SyncedStep(step)
        trial = fakes.get("gpu") or LoaderMeasure(
            encoded, batch_size=batch_size, prefetch_factor=prefetch_factor, device="cpu", main_process=load,
            step=gpu_step, decode=_DecodeStage(decoder), zero_copy=True)
        result = tune_num_workers(encoded, measure=trial, device="cpu",
                                  memory_limit=search_memory_limit() if max_workers is None else None, **common)
        ran = "" if "gpu" in fakes else "step" if callable(step) else load  # as tune_num_workers records it
        done.append(("gpu", status, reason, replace(result, main_process=ran)))
    searched = [Searched(p, r.worker_type, r.best_workers, r.runs, r.max_workers, r.search_end) for p, _, _, r in done]
    win, decided = _decide(searched, float(tolerance))
    bests = [_best(p, s, why, r) for p, s, why, r in done]
    if unavailable is not None:
        bests.append(PlacementBest("gpu", "not available", unavailable))
    placement, _, _, chosen = done[win]
    others = tuple(TypeBest(r.worker_type, r.best_workers, r.samples_per_second, r.search_seconds, p)
                   for i, (p, _, _, r) in enumerate(done) if i != win)
    chosen = replace(chosen, placement=placement, other_types=chosen.other_types + others)
    out = PlacementResult(placement, chosen.best_workers, tuple(bests), chosen, decided)
    if warn and out.warning:
        warnings.warn(out.warning, UnreliablePickWarning, stacklevel=2)
    return out
