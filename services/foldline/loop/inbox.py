"""The inbox: messages waiting for the next step. A step claims everything in it at once."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..core.content import ContentBlock

__all__ = ["Inbox", "InboxItem"]


@dataclass(frozen=True, slots=True)
class InboxItem:
    content: tuple[ContentBlock, ...]
    source: str = "user"


class Inbox:
    """Thread-safe FIFO with an atomic claim: an item is in exactly one claimed batch."""

    def __init__(self) -> None:
        self._items: list[InboxItem] = []
        self._lock = threading.Lock()

    def put(self, item: InboxItem) -> None:
        with self._lock:
            self._items.append(item)

    def claim(self) -> tuple[InboxItem, ...]:
        with self._lock:
            batch, self._items = tuple(self._items), []
        return batch

    def give_back(self, batch: tuple[InboxItem, ...]) -> None:
        """Return a claimed batch to the front (a rejected step opens nothing and loses nothing)."""
        with self._lock:
            self._items[:0] = batch

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
