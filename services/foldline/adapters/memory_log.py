"""An in-process event log: the reference behaviour of the port, used by fast tests.

Events are stored as their canonical bytes and decoded on read, exactly like the durable adapters,
so nothing can pass here that the encoding would lose.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..core.events import Envelope
from ..core.limits import check_event_size
from ..core.validation import check_session_id
from ..core.wire import decode_event, encode_event
from ..errors import ConflictError, FencedError
from ..ports.event_log import EventLog, RulesCache, WriterLease

__all__ = ["MemoryEventLog"]


class MemoryEventLog(EventLog):
    def __init__(self) -> None:
        self._events: dict[str, list[bytes]] = {}
        self._epochs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rules = RulesCache(lambda sid: self._read(sid, 0, None))

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        with self._lock:
            stored = self._events.get(session_id, [])
            head = len(stored)
            if not events:
                return head
            epoch = self._epochs.get(session_id, 0)
            if lease is not None and lease.epoch != epoch:
                raise FencedError(session_id, lease.epoch, epoch)
            if expected_seq != head:
                raise ConflictError(session_id, expected_seq, head)
            bodies = [encode_event(e) for e in events]
            for e, body in zip(events, bodies, strict=True):
                check_event_size(len(body), e.seq)
            self._rules.get(session_id, head).check_batch(events)
            self._events.setdefault(session_id, []).extend(bodies)
            return head + len(events)

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            return self._read(session_id, from_seq, to_seq)

    def _read(self, session_id: str, from_seq: int, to_seq: int | None) -> list[Envelope]:
        return [decode_event(b) for b in self._events.get(session_id, [])[from_seq:to_seq]]

    def head(self, session_id: str) -> int:
        with self._lock:
            return len(self._events.get(session_id, []))

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(s for s, ev in self._events.items() if ev)

    def heads(self) -> dict[str, int]:
        with self._lock:
            return {s: len(ev) for s, ev in self._events.items() if ev}

    def acquire(self, session_id: str) -> WriterLease:
        check_session_id(session_id)
        with self._lock:
            epoch = self._epochs.get(session_id, 0) + 1
            self._epochs[session_id] = epoch
            return WriterLease(session_id, epoch)
