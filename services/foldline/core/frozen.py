"""Deeply immutable JSON values.

Tool schemas and unknown-event payloads are arbitrary JSON. Inside the core they are held as
:class:`FrozenDict` and tuples, so a value reachable from a logged event or a built request cannot be
changed in place: every mutation attempt raises ``TypeError``.

A JSON object whose key order is meaningful to a model (a tool's input schema: models read the properties in
the order given, and structured output writes fields in schema order) is an :class:`OrderedObject`: its key
order, at every depth, is part of its value. It is written in that order (canonical JSON sorts every other
object, docs/FORMAT.md §1.9) and equals only an object with the same keys in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias, Union

import orjson

__all__ = ["FrozenDict", "FrozenJSON", "OrderedObject", "freeze_json", "freeze_ordered", "thaw_json"]

FrozenJSON: TypeAlias = Union[bool, int, float, str, tuple["FrozenJSON", ...], "FrozenDict", None]


class FrozenDict(Mapping[str, FrozenJSON]):
    """A read-only, hashable mapping whose values are themselves frozen."""

    __slots__ = ("_hash", "_items")
    _items: MappingProxyType[str, FrozenJSON]
    _hash: int | None

    def __init__(self, items: Mapping[str, FrozenJSON] | None = None) -> None:
        object.__setattr__(self, "_items", MappingProxyType(dict(items or {})))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: str) -> FrozenJSON:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError("FrozenDict is immutable")

    def __delattr__(self, name: str) -> None:
        raise TypeError("FrozenDict is immutable")

    def __hash__(self) -> int:
        cached: int | None = self._hash
        if cached is None:
            cached = hash(tuple(sorted(self._items.items())))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({dict(self._items)!r})"

    def to_dict(self) -> dict[str, Any]:
        return {k: thaw_json(v) for k, v in self._items.items()}


class OrderedObject(FrozenDict):
    """A frozen JSON object whose key order, at every depth, is part of its value.

    :attr:`json` is its compact JSON text in that order (the bytes canonical JSON splices in for it); two ordered
    objects are equal exactly when those texts are, so an object with the same members in another order, or a
    ``1`` where the other has ``1.0``, is a different value. Compared with a plain mapping, the mapping's own
    (insertion) order counts the same way. Every object inside it is an ordered object too.
    """

    __slots__ = ("_json",)
    _json: bytes | None

    def __init__(self, items: Mapping[str, FrozenJSON] | None = None) -> None:
        super().__init__(items)
        object.__setattr__(self, "_json", None)

    @property
    def json(self) -> bytes:
        """The compact JSON text in document order (keys as given, at every depth; §1's rules for the rest)."""
        cached = self._json
        if cached is None:
            cached = orjson.dumps(self.to_dict())
            object.__setattr__(self, "_json", cached)
        return cached

    def __hash__(self) -> int:
        cached: int | None = self._hash
        if cached is None:
            cached = hash(self.json)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, OrderedObject):
            return self.json == other.json
        if isinstance(other, Mapping):
            try:
                return self.json == orjson.dumps(thaw_json(other))
            except TypeError:  # not JSON: not this value
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __repr__(self) -> str:
        return f"OrderedObject({self.json.decode()})"


def freeze_ordered(value: Mapping[str, Any]) -> OrderedObject:
    """The :class:`OrderedObject` of a JSON object (a mapping, its keys in the order to keep); every object inside
    it becomes ordered too. ``TypeError`` when ``value`` is not a JSON object."""
    if isinstance(value, OrderedObject):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"not a JSON object: {type(value).__name__}")
    frozen = _freeze(value, ordered=True)
    assert isinstance(frozen, OrderedObject)
    return frozen


def _freeze(value: Any, ordered: bool) -> FrozenJSON:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, OrderedObject) or (isinstance(value, FrozenDict) and not ordered):
        return value
    if isinstance(value, Mapping):
        out: dict[str, FrozenJSON] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be strings, got {type(k).__name__}")
            out[k] = _freeze(v, ordered)
        return OrderedObject(out) if ordered else FrozenDict(out)
    if isinstance(value, list | tuple):
        return tuple(_freeze(v, ordered) for v in value)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def freeze_json(value: Any) -> FrozenJSON:
    """Turn plain JSON (dict/list/scalars) into its deeply immutable form."""
    return _freeze(value, ordered=False)


def thaw_json(value: Any) -> Any:
    """The plain, mutable copy of a frozen JSON value."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw_json(v) for v in value]
    return value
