"""An in-process event log: the reference behaviour of the port, used by fast tests.

Events are stored as their canonical bytes and decoded on read, exactly like the durable adapters,
so nothing can pass here that the encoding would lose; with a ``sealer`` their content is stored sealed.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

from ..core.events import Envelope
from ..core.limits import check_stored_size
from ..core.sealing import has_content
from ..core.validation import check_session_id
from ..core.wire import decode_event, encode_event, encoded_size
from ..errors import ConflictError, FencedError
from ..ports.event_log import EventLog, RulesCache, WriterLease, opened
from ..ports.inbox import InboxStore, SealedInbox
from ..ports.key_store import Sealer
from .memory_inbox import MemoryInboxStore

__all__ = ["MemoryEventLog"]


class MemoryEventLog(EventLog):
    seals_in_place = True  # its rows are rewritten where they are (an erasure of content logged unsealed)

    def __init__(self, *, sealer: Sealer | None = None) -> None:
        self.sealer = sealer
        self._events: dict[str, list[bytes]] = {}
        self._epochs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rules = RulesCache(lambda sid: self._read(sid, 0, None))
        self._inbox = SealedInbox(MemoryInboxStore(), lambda _reading: self.sealer)

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
            sealed = self.sealer.seal(session_id, events) if self.sealer is not None else events
            bodies = [encode_event(e) for e in sealed]
            for plain, env, body in zip(events, sealed, bodies, strict=True):
                if plain.sealed is None:  # one given sealed was checked when it was first appended
                    check_stored_size(len(body), env is not plain, functools.partial(encoded_size, plain), env.seq)
            self._rules.get(session_id, head).check_batch(events)
            self._events.setdefault(session_id, []).extend(bodies)
            return head + len(events)

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            return self._read(session_id, from_seq, to_seq)

    def read_stored(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            return [decode_event(b) for b in self._events.get(session_id, [])[from_seq:to_seq]]

    def _read(self, session_id: str, from_seq: int, to_seq: int | None) -> list[Envelope]:
        events = [decode_event(b) for b in self._events.get(session_id, [])[from_seq:to_seq]]
        return opened("the in-process log", session_id, self.sealer, events)

    def seal_in_place(self, session_id: str) -> int:
        if self.sealer is None:
            return super().seal_in_place(session_id)
        with self._lock:
            stored = self._events.get(session_id, [])
            count = 0
            for i, body in enumerate(stored):
                e = decode_event(body)
                if e.sealed is None and has_content(type(e.data)):
                    sealed = self.sealer.seal(session_id, (e,), always=True)[0]
                    if sealed is not e:
                        stored[i] = encode_event(sealed)
                        count += 1
            self._rules.forget(session_id)
            return count

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

    def inbox(self) -> InboxStore:
        return self._inbox
