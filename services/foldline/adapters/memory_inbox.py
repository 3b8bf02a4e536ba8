"""An in-process inbox store: the reference behaviour of the port, and the inbox of the in-memory log.

Entries are kept as their canonical bytes and decoded on read, like the durable adapters.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..core.inbox import InboxEntry, decode_entry, encode_entry
from ..core.validation import check_session_id
from ..ports.inbox import InboxStore

__all__ = ["MemoryInboxStore"]


class MemoryInboxStore(InboxStore):
    def __init__(self) -> None:
        self._entries: dict[str, list[tuple[str, str | None, bytes]]] = {}  # session → (id, unique, body)
        self._lock = threading.Lock()

    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        check_session_id(session_id)
        body = encode_entry(entry)
        with self._lock:
            held = self._entries.setdefault(session_id, [])
            if any(eid == entry.id or (unique is not None and u == unique) for eid, u, _ in held):
                return False
            held.append((entry.id, unique, body))
            return True

    def entries(self, session_id: str) -> list[InboxEntry]:
        with self._lock:
            held = list(self._entries.get(session_id, ()))
        return [decode_entry(body, f"inbox entry {entry_id!r} of session {session_id!r}") for entry_id, _, body in held]

    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        drop = set(entry_ids)
        with self._lock:
            held = self._entries.get(session_id)
            if held is None:
                return
            kept = [x for x in held if x[0] not in drop]
            if kept:
                self._entries[session_id] = kept
            else:
                del self._entries[session_id]

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(s for s, held in self._entries.items() if held)
