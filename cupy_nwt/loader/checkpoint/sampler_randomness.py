"""The random state a user's sampler without a state of its own draws its epoch from: a generator's
state, or the epoch a ``DistributedSampler`` seeds its permutation with.

torch's ``RandomSampler``, ``SubsetRandomSampler`` and ``WeightedRandomSampler`` (and torchdata's
``RandomSampler``, wrapped in torch's ``BatchSampler``, which hides its stateful iterator) draw each
epoch from their ``generator``, or from torch's global generator when given none, at the first index
of the iteration. Such a sampler's epoch is drawn again on resume (``user_sampler``), and that gives
the saved epoch only from the same random state; from another, delivered batches are skipped by
number from a different order, and samples repeat while others are lost.

So the state of the sampler's own generator is saved as the epoch's first index is drawn, and set
again before the resumed epoch's first index (for good, as the uninterrupted run has it). A sampler
given no generator is lent one for its first draw, seeded from one draw of torch's global generator,
as torch's ``RandomSampler`` seeds its own from it: that seed is what is saved, and a resumed epoch is
drawn from it without touching the global generator, which the script's threads (a thread worker's
random augmentation) may be drawing from at that moment, and which the script seeds as it pleases. A
sampler drawing from another generator (NumPy's, Python's) is not seen here: it must give the same
order again by itself.

A ``DistributedSampler`` draws from ``(seed, epoch)``, its ``epoch`` set by the script's
``set_epoch``; a resumed script that forgets the call (or makes it after the loader's first batch)
would have the delivered batches skipped from epoch 0's order. The epoch it had as a saved epoch began
is saved, and set again on a sampler resumed mid-epoch (``epoch_owner``).
"""

from __future__ import annotations

import base64
import binascii
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...errors import StateError

_DEPTH = 3  # a batch sampler's ``sampler``, and the one that wraps, are looked into
_MISSING = object()


def stateful(obj: Any) -> bool:
    """Whether ``obj`` saves and loads a state of its own (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _chain(sampler: Any) -> Iterator[Any]:
    """``sampler`` and the samplers it wraps (a batch sampler's ``sampler``, and the one that one wraps)."""
    obj = sampler
    for _ in range(_DEPTH):
        if obj is None:
            return
        yield obj
        obj = getattr(obj, "sampler", None)


def generator_of(sampler: Any) -> tuple[Any, Any]:
    """The object among ``sampler`` and the samplers it wraps (those without a state of their own) whose
    ``generator`` it draws from, and that generator (None: torch's global one); the object is None where
    there is none (or torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    for obj in _chain(sampler):
        if obj is not sampler and stateful(obj):
            break
        gen = getattr(obj, "generator", _MISSING)
        if gen is None or (isinstance(gen, torch.Generator) and gen.device.type == "cpu"):
            return obj, gen
    return None, None


def epoch_owner(sampler: Any) -> Any:
    """What takes ``set_epoch`` and keeps an int ``epoch`` among ``sampler`` and the samplers it wraps (a
    ``DistributedSampler``, in torch's ``BatchSampler`` too); None where there is none."""
    for obj in _chain(sampler):
        epoch = getattr(obj, "epoch", None)
        if callable(getattr(obj, "set_epoch", None)) and isinstance(epoch, int) and not isinstance(epoch, bool):
            return obj
    return None


def _encode(state: Any) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


class Randomness:
    """The random state one epoch of a sampler is drawn from: the one it drew from (``began``: its generator's
    state as base64 text, or the seed its lent generator took), and a saved one to draw from.

    Args:
        owner: The object whose ``generator`` the sampler draws from (``generator_of``).
        generator: That generator, or None (torch's global one: a seeded one is lent for the first draw).
        saved: A ``state_dict()``'s ``sampler_randomness`` to draw the epoch from, or None (draw as it is).
    """

    def __init__(self, owner: Any, generator: Any, saved: str | int | None = None) -> None:
        self._owner, self._generator, self._saved = owner, generator, saved
        self.began: str | int | None = None

    @classmethod
    def of(cls, sampler: Any, saved: Any = None) -> Randomness | None:
        """``sampler``'s, where it draws from a torch generator and keeps no state of its own; else None."""
        if stateful(sampler):
            return None
        owner, gen = generator_of(sampler)
        return None if owner is None else cls(owner, gen, saved)

    @property
    def lends(self) -> bool:
        """Whether the sampler is given no generator, so one is lent for its first draw."""
        return self._generator is None

    def now(self) -> str | None:
        """The sampler's generator's state as it is now, base64 text (JSON-ready); None for a lent one, whose
        seed is drawn with the epoch's first index."""
        return None if self._generator is None else _encode(self._generator.get_state())

    @contextmanager
    def first_draw(self) -> Iterator[None]:
        """Around the epoch's first draw: the saved state set on the sampler's generator, or a generator lent
        from the saved seed (a fresh one drawn from torch's global generator); what it drew from noted."""
        torch = _torch()
        if self._generator is not None:
            if self._saved is not None:
                _set(self._generator.set_state, _decoded(str(self._saved)))
            self.began = self._saved if self._saved is not None else self.now()
            yield
            return
        seed = int(self._saved) if self._saved is not None else int(torch.empty((), dtype=torch.int64).random_().item())
        self.began = seed
        self._owner.generator = torch.Generator().manual_seed(seed)
        try:
            yield
        finally:
            self._owner.generator = None


def check_randomness(sampler: Any, saved: Any) -> None:
    """A loaded ``sampler_randomness``: null; base64 text of a state as long as the sampler's generator's; or,
    for a sampler given no generator, the seed lent to it (anything where the sampler draws from none: it is
    then not used)."""
    if saved is None:
        return
    randomness = Randomness.of(sampler)
    if randomness is not None and randomness.lends:
        if isinstance(saved, bool) or not isinstance(saved, int):
            raise StateError(f"load_state_dict: sampler_randomness: expected null or the seed lent to this sampler "
                             f"(an integer), got {type(saved).__name__}", "sampler_randomness", saved)
        return
    if not isinstance(saved, str):
        raise StateError(f"load_state_dict: sampler_randomness: expected null or base64 text, got "
                         f"{type(saved).__name__}", "sampler_randomness", saved)
    now = randomness.now() if randomness is not None else None
    if now is not None and len(_decoded(saved)) != len(_decoded(now)):
        raise StateError("load_state_dict: sampler_randomness: not a state of this sampler's generator (another "
                         "length)", "sampler_randomness", saved)


def warn_unrecorded(sampler: Any) -> None:
    """Warn, where ``sampler`` draws its epoch from a torch generator, that a mid-epoch state without a
    ``sampler_randomness`` (one saved before it was kept) cannot give the saved epoch's order back."""
    if Randomness.of(sampler) is not None:
        warnings.warn("load_state_dict: the state was saved mid-epoch without the random state the sampler drew "
                      "that epoch from (an earlier cupy_nwt): the rest of the epoch is drawn afresh, so some "
                      "samples may come twice and others not at all; resume from a state saved between epochs, "
                      "or by this version, for an exact epoch", UserWarning, stacklevel=6)


def _torch() -> Any:
    """torch, which a sampler drawing from its generators has imported (``generator_of``)."""
    return sys.modules["torch"]


def _decoded(saved: str) -> Any:
    torch = _torch()
    try:
        raw = base64.b64decode(saved.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise StateError("load_state_dict: sampler_randomness: not a generator state (expected base64 text)",
                         "sampler_randomness", saved) from exc
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _set(setter: Any, state: Any) -> None:
    try:
        setter(state)
    except (RuntimeError, ValueError, TypeError) as exc:
        text = " ".join(str(exc).split())
        raise StateError(f"load_state_dict: sampler_randomness: torch refused the generator state: {text}",
                         "sampler_randomness", None) from exc
