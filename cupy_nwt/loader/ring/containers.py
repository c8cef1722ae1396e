"""Mapping and sequence types other than dict, list, tuple and namedtuple, batched as torch batches them.

torch's ``default_collate`` recurses into any ``Mapping`` key by key and any ``Sequence`` (str and
bytes aside) position by position, then makes the batch's container from the batch's first sample:
a mutable one (an ``OrderedDict``, a dict or list subclass, a ``UserDict`` such as a tokenizer's
output, a ``deque``) is a copy of that sample with its items replaced, so its attributes come along;
an immutable one is ``type(items)``, or the plain dict or list where that type cannot be made from one
(a ``range``). ``Make`` is that recipe for one container of a batch.

The ring carries a batch's arrays and rebuilds its structure once per layout, so a container that
holds nothing but its items (``items_only``) crosses it with its recipe in the structure: any recipe of
its type makes it back exactly. One with attributes of its own (a tokenizer's encodings) crosses it too
where its recipe makes it again from its items (``Make.remakes``): a mutable one's emptied copy then
travels pickled beside the arrays, so each batch keeps its own attributes, and its arrays are joined in
the framework and on the device the loader gives, as every other field's. Any other travels pickled whole.
"""

from __future__ import annotations

import copy
from collections import UserDict, UserList
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Items = dict | list | tuple
_NOT_CONTAINERS = (np.ndarray, np.generic, int, float, complex, str, bytes, bytearray, memoryview)
_SLOTS: dict[type, tuple[str, ...]] = {}  # per container type: the __slots__ its own classes declare
_ABSENT = object()  # a slot not set


def plain_items(obj: Any) -> Items | None:
    """The items of a mapping or sequence of a type other than dict, list, tuple and namedtuple, as a
    plain dict, a tuple (for a tuple subclass) or a list; None for anything else (a leaf)."""
    if obj is None or isinstance(obj, _NOT_CONTAINERS):
        return None
    if isinstance(obj, tuple):
        return None if hasattr(obj, "_fields") else tuple(obj)
    if isinstance(obj, Mapping):
        return {k: obj[k] for k in obj}
    if isinstance(obj, Sequence):
        return list(obj)
    return None


def items_only(obj: Any) -> bool:
    """Whether ``obj`` holds nothing beside its items: no attributes (a ``UserDict``'s or ``UserList``'s
    ``data`` is its items) and no ``__slots__`` of its own type."""
    state = getattr(obj, "__dict__", None)
    if state and (not isinstance(obj, (UserDict, UserList)) or state.keys() != {"data"}):
        return False
    return not _slots(type(obj))


def _slots(t: type) -> tuple[str, ...]:
    names = _SLOTS.get(t)
    if names is None:
        declared = [getattr(c, "__slots__", ()) for c in t.__mro__ if c.__module__ != "builtins"]
        names = _SLOTS[t] = tuple(n for d in declared for n in ((d,) if isinstance(d, str) else d)
                                  if n not in ("__dict__", "__weakref__"))
    return names


def _state(obj: Any) -> tuple[Any, list[Any]]:
    """What ``obj`` holds beside what its type's methods see as items: its attributes and its slots."""
    return getattr(obj, "__dict__", None) or {}, [getattr(obj, n, _ABSENT) for n in _slots(type(obj))]


def _alike(x: Any, y: Any) -> bool:
    """The same objects, in dicts, lists and tuples of the same shape (never compared by value)."""
    if x is y:
        return True
    t = type(x)
    if t is not type(y) or t not in (dict, list, tuple) or len(x) != len(y):
        return False
    if t is dict:
        return x.keys() == y.keys() and all(_alike(x[k], y[k]) for k in x)
    return all(map(_alike, x, y))


def _emptied(obj: Any) -> Any:
    """A copy of a mutable container with no items, attributes kept; None where it cannot be had.

    A copy that shares the sample's storage (a mapping keeping its items in an attribute, with no
    ``__copy__``) would be emptied with the sample itself, the dataset's own object among them: that is
    seen by the sample's length, the items put back, and None given, so such a type is made from its
    items. An empty sample cannot show it, so it gives None too."""
    mapping = isinstance(obj, MutableMapping)
    try:
        kept = list(obj.items()) if mapping else list(obj)
        if not kept:
            return None
        clone = copy.copy(obj)
        clone.clear()
        if len(obj) != len(kept):
            obj.update(kept) if mapping else obj.extend(kept)
            return None
    except Exception:  # noqa: BLE001 - a container type of the user's: then made as an immutable one
        return None
    return clone


@dataclass(frozen=True)
class Make:
    """How a batch's container of type ``cls`` is made from its batched items: a copy of ``proto`` (the
    first sample's container, emptied) filled with them, or ``cls(items)`` when ``proto`` is None.
    Two recipes of one type are equal: the ring holds only items-only containers, alike whatever the
    sample they came from."""

    cls: type
    proto: Any = field(default=None, compare=False)

    @classmethod
    def like(cls, sample: Any) -> Make:
        """torch's recipe for the container ``sample``."""
        mutable = isinstance(sample, (MutableMapping, MutableSequence))
        return cls(type(sample), _emptied(sample) if mutable else None)

    def __call__(self, items: Items) -> Any:
        """The container holding ``items``, or ``items`` itself where this type cannot be made so
        (``TypeError``, as torch falls back to the plain dict or list)."""
        try:
            if self.proto is None:
                return self.cls(items)
            clone = copy.copy(self.proto)
            if isinstance(clone, MutableMapping):
                clone.update(items)
            else:
                clone.extend(items)
            return clone
        except TypeError:
            return items

    def gives_back(self, obj: Any, items: Items) -> bool:
        """Whether this recipe makes ``obj`` again from ``items``: its own type, nothing beside them."""
        return items_only(obj) and type(self(items)) is self.cls

    def remakes(self, obj: Any, items: Items) -> bool:
        """Whether this recipe, taken from ``obj`` itself, makes it again from ``items``, attributes included:
        its own type, holding the very objects ``obj`` holds (a copy's attributes, or what its constructor
        derives from the items). A container with anything else (a cache of its items, a fresh id) travels whole."""
        made = self(items)
        return type(made) is self.cls and _alike(_state(made), _state(obj))
