"""The random state a user's sampler without a state of its own draws its epoch from: a generator's
state, or the epoch a ``DistributedSampler`` seeds its permutation with.

torch's ``RandomSampler``, ``SubsetRandomSampler`` and ``WeightedRandomSampler`` (and torchdata's
``RandomSampler``, wrapped in torch's ``BatchSampler``, which hides its stateful iterator) draw each
epoch from their ``generator``, or from torch's global generator when given none, at the first index
of the iteration. Such a sampler's epoch is drawn again on resume (``user_sampler``), and that gives
the saved epoch only from the same random state; from another, delivered batches are skipped by
number from a different order, and samples repeat while others are lost.

So the state of that generator is saved as the epoch's first index is drawn, and set again before
the resumed epoch's first index: on the sampler's own generator for good (as the uninterrupted run
has it); on torch's global generator for that one draw only, after which the script's own state is
put back (a resumed script seeds and draws from it as it pleases). A sampler drawing from another
generator (NumPy's, Python's) is not seen here: it must give the same order again by itself.

A ``DistributedSampler`` draws from ``(seed, epoch)``, its ``epoch`` set by the script's
``set_epoch``; a resumed script that forgets the call (or makes it after the loader's first batch)
would have the delivered batches skipped from epoch 0's order. The epoch it had as a saved epoch began
is saved, and set again on a sampler resumed mid-epoch (``epoch_owner``).
"""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...errors import StateError

_DEPTH = 3  # a batch sampler's ``sampler``, and the one that wraps, are looked into
_MISSING = object()


def stateful(obj: Any) -> bool:
    """Whether ``obj`` saves and loads a state of its own (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def generator_of(sampler: Any) -> Any:
    """The torch generator ``sampler`` draws from (None: torch's global one), looking into the ``sampler`` of
    a batch sampler without a state of its own; ``_MISSING`` where there is none (or torch is not imported)."""
    torch = sys.modules.get("torch")
    obj = sampler
    for _ in range(_DEPTH):
        if torch is None or obj is None or (obj is not sampler and stateful(obj)):
            return _MISSING
        gen = getattr(obj, "generator", _MISSING)
        if gen is None or (isinstance(gen, torch.Generator) and gen.device.type == "cpu"):
            return gen
        obj = getattr(obj, "sampler", None)
    return _MISSING


def epoch_owner(sampler: Any) -> Any:
    """What takes ``set_epoch`` and keeps an int ``epoch`` among ``sampler`` and the samplers it wraps (a
    ``DistributedSampler``, in torch's ``BatchSampler`` too); None where there is none."""
    obj = sampler
    for _ in range(_DEPTH):
        if obj is None:
            return None
        epoch = getattr(obj, "epoch", None)
        if callable(getattr(obj, "set_epoch", None)) and isinstance(epoch, int) and not isinstance(epoch, bool):
            return obj
        obj = getattr(obj, "sampler", None)
    return None


def _encode(state: Any) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


class Randomness:
    """The random state of one epoch of a sampler: the one it drew from (``began``), and a saved one to draw from.

    Args:
        generator: The sampler's torch generator, or None for torch's global one.
        saved: A ``state_dict()``'s ``sampler_randomness`` to draw the epoch from, or None (draw as it is).
    """

    def __init__(self, generator: Any, saved: str | None = None) -> None:
        self._generator = generator
        self._saved = saved
        self.began: str | None = None

    @classmethod
    def of(cls, sampler: Any, saved: Any = None) -> Randomness | None:
        """``sampler``'s, where it draws from a torch generator and keeps no state of its own; else None."""
        if stateful(sampler):
            return None
        gen = generator_of(sampler)
        return None if gen is _MISSING else cls(gen, saved)

    def now(self) -> str:
        """The generator's state as it is now, base64 text (JSON-ready)."""
        torch = _torch()
        return _encode(torch.get_rng_state() if self._generator is None else self._generator.get_state())

    @contextmanager
    def first_draw(self) -> Iterator[None]:
        """Around the epoch's first draw: set the saved state (torch's global one for the draw only) and note
        the state drawn from."""
        torch = _torch()
        if self._saved is None:
            self.began = self.now()
            yield
            return
        loaded = _decoded(self._saved)
        if self._generator is not None:
            _set(self._generator.set_state, loaded)
            self.began = self._saved
            yield
            return
        own = torch.get_rng_state()
        _set(torch.set_rng_state, loaded)
        self.began = self._saved
        try:
            yield
        finally:
            torch.set_rng_state(own)


def check_randomness(sampler: Any, saved: Any) -> None:
    """A loaded ``sampler_randomness``: null, or base64 text of a state as long as the sampler's generator's
    (any text where the sampler draws from none: it is then not used)."""
    if saved is None:
        return
    if not isinstance(saved, str):
        raise StateError(f"load_state_dict: sampler_randomness: expected null or base64 text, got "
                         f"{type(saved).__name__}", "sampler_randomness", saved)
    randomness = Randomness.of(sampler)
    if randomness is not None and len(_decoded(saved)) != len(_decoded(randomness.now())):
        raise StateError("load_state_dict: sampler_randomness: not a state of this sampler's generator (another "
                         "length)", "sampler_randomness", saved)


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
