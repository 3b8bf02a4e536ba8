"""The EventLog port: an append-only, per-session, gapless log of event envelopes."""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..core.events import Envelope
from ..core.validation import LogRules, check_session_id

__all__ = ["EncodedEvent", "EventLog", "RulesCache", "WriterLease"]


@dataclass(frozen=True, slots=True)
class WriterLease:
    """Proof that a writer owns a session: the fencing epoch it acquired."""

    session_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """An event together with its canonical bytes, exactly ``encode_event(envelope)``: what a caller of
    :meth:`EventLog.create` that already encoded it (the importer, which checks each line is canonical)
    passes, so a log storing those bytes need not encode it again."""

    envelope: Envelope
    body: bytes


class EventLog(abc.ABC):
    """Append-only session logs.

    Contract (``tests/contracts/event_log.py`` runs it against every adapter):

    * ``append`` writes the whole batch or nothing. ``expected_seq`` must equal the session's current
      head (the next seq), else :class:`~foldline.errors.ConflictError`. Every event is validated
      against the session's rules first; a rule break raises
      :class:`~foldline.errors.ValidationError` and writes nothing.
    * With a ``lease``, the append fails with :class:`~foldline.errors.FencedError` if a newer lease
      was acquired for the session since; nothing is written.
    * ``read`` returns events in seq order from ``from_seq`` (inclusive) to ``to_seq`` (exclusive).
    * A session id must be a valid id (:func:`~foldline.core.validation.check_session_id`), else
      :class:`~foldline.errors.ValidationError` (rule ``session-id``) and nothing is written.
    * ``create`` writes a whole new session all-or-nothing, like one ``append`` at ``expected_seq`` 0.
    """

    @abc.abstractmethod
    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        """Append ``events``; returns the new head (next seq)."""

    def create(self, session_id: str, events: Iterable[Envelope | EncodedEvent]) -> int:
        """Write ``events`` (seq 0 on) as the new session ``session_id``, all or nothing; returns its head.

        :class:`~foldline.errors.ConflictError` when the session already has events. Each event is checked
        against the log rules as it arrives (so the first bad event is the one reported); a rule break, or
        an exception raised while ``events`` is iterated, writes nothing and propagates. This default
        collects the events and appends them as one batch; an adapter that can keep one write open while
        they stream in (SQLite) overrides it, so that creating a session of any size holds one event in
        memory at a time.
        """
        rules = LogRules()
        batch = []
        for item in events:  # checked in order as they arrive, like a streaming adapter
            e = item.envelope if isinstance(item, EncodedEvent) else item
            rules.advance(e)
            batch.append(e)
        return self.append(session_id, 0, batch)

    @abc.abstractmethod
    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        """Events of one session; an unknown session reads as empty."""

    @abc.abstractmethod
    def head(self, session_id: str) -> int:
        """The next seq of the session (0 when it has no events)."""

    @abc.abstractmethod
    def sessions(self) -> list[str]:
        """Ids of every session with at least one event, sorted."""

    @abc.abstractmethod
    def heads(self) -> dict[str, int]:
        """The head of every session with at least one event (the keys are :meth:`sessions`), in one call: what
        a reader that keeps something per session (the console's session index) compares to learn which
        sessions were appended to, without asking each session."""

    @abc.abstractmethod
    def acquire(self, session_id: str) -> WriterLease:
        """Become the session's only writer; every earlier lease is fenced from now on."""

    # -- for asyncio callers (the loop). Defaults call the methods above directly: right for a log whose
    # calls return at once (memory, the embedded SQLite file); a log that waits on a server overrides them
    # so that many sessions' calls are in flight at once without blocking the event loop.

    async def append_async(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        """:meth:`append`, awaitable."""
        return self.append(session_id, expected_seq, events, lease=lease)

    async def read_async(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        """:meth:`read`, awaitable."""
        return self.read(session_id, from_seq, to_seq)

    async def acquire_and_read_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        """:meth:`acquire_and_read`, awaitable."""
        return self.acquire_and_read(session_id)

    def acquire_and_read(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        """:meth:`acquire`, then every event of the session: what a new writer starts from.

        Default: the two calls; adapters that learn the session's state while acquiring answer both at once.
        """
        lease = self.acquire(session_id)
        return lease, self.read(session_id)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RulesCache:
    """Per-session validation state kept warm between appends, so an append costs O(batch).

    Entries are keyed by the head they describe; a miss (or a head that moved because another
    process appended) rebuilds from the log via ``load``.
    """

    def __init__(self, load: Callable[[str], list[Envelope]], capacity: int = 4096) -> None:
        self._load = load
        self._capacity = capacity
        self._entries: OrderedDict[str, LogRules] = OrderedDict()

    def get(self, session_id: str, head: int) -> LogRules:
        rules = self._entries.get(session_id)
        if rules is None or rules.next_seq != head:
            check_session_id(session_id)
            rules = LogRules()
            rules.check_batch(self._load(session_id))
        self._entries[session_id] = rules
        self._entries.move_to_end(session_id)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return rules

    def forget(self, session_id: str) -> None:
        self._entries.pop(session_id, None)
