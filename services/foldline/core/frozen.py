"""Deeply immutable JSON values.

Tool schemas and unknown-event payloads are arbitrary JSON. Inside the core they are held as
:class:`FrozenDict` and tuples, so a value reachable from a logged event or a built request cannot be
changed in place: every mutation attempt raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeAlias, Union

__all__ = ["FrozenDict", "FrozenJSON", "freeze_json", "thaw_json"]

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


def freeze_json(value: Any) -> FrozenJSON:
    """Turn plain JSON (dict/list/scalars) into its deeply immutable form."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, Mapping):
        out: dict[str, FrozenJSON] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be strings, got {type(k).__name__}")
            out[k] = freeze_json(v)
        return FrozenDict(out)
    if isinstance(value, list | tuple):
        return tuple(freeze_json(v) for v in value)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def thaw_json(value: Any) -> Any:
    """The plain, mutable copy of a frozen JSON value."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw_json(v) for v in value]
    return value
