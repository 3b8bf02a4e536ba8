"""A bounded cache of encoded message fragments keyed by message identity.

Messages are frozen and shared between the requests of a session, so a growing conversation re-serializes
the same ``Message`` objects at every step. Serializers keep the bytes each message encoded to, keyed by
``id(message)``; the entry holds a strong reference to the message, so the id cannot be reused by another
object while the entry lives, and a hit is confirmed with ``is``. The cache never changes output: the
serializers' tests compare cached and uncached bytes. Messages whose encoding reads attachments are never
cached, so their bytes are re-read and re-verified on every serialization.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["FragmentCache"]

K = TypeVar("K")
V = TypeVar("V")


class FragmentCache(Generic[K, V]):
    """``id``-keyed, identity-checked, size-bounded (oldest-first eviction). ``capacity=0`` disables it."""

    __slots__ = ("_capacity", "_entries", "hits", "misses")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: dict[int, tuple[K, V]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0] is key:
            self.hits += 1
            return entry[1]
        self.misses += 1
        return None

    def put(self, key: K, value: V) -> None:
        if self._capacity <= 0:
            return
        entries = self._entries
        if len(entries) >= self._capacity:
            # Drop the oldest quarter in one go; insertion order is age order.
            for old in list(entries)[: max(1, self._capacity // 4)]:
                entries.pop(old, None)
        entries[id(key)] = (key, value)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
