"""The EventLog port: an append-only, per-session, gapless log of event envelopes."""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..core.events import Envelope
from ..core.validation import LogRules, check_session_id
from ..errors import ConfigError, NotErasable
from .inbox import InboxStore
from .key_store import Sealer

__all__ = ["EncodedEvent", "EventLog", "RulesCache", "WriterLease", "opened"]


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
    * With a :attr:`sealer` (encryption, docs/ERASURE.md) the content of every event is stored sealed and read
      back opened: callers see the events they appended (an event appended sealed already — an archived one
      restored — is stored as it is). An event whose key was destroyed (erased) is read
      back still sealed (its ``sealed`` marker set); a lost key is :class:`~foldline.errors.KeyMissing`.
    """

    #: Seals new events and opens stored ones (``None``: encryption is not configured for this log).
    sealer: Sealer | None = None
    #: Whether :meth:`seal_in_place` can rewrite stored events (the embedded logs can; Kafka's records cannot).
    seals_in_place: bool = False

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

    @abc.abstractmethod
    def inbox(self) -> InboxStore:
        """The durable inbox beside this log (:mod:`foldline.ports.inbox`): where any process puts messages and
        approval decisions for a session's writer, which alone moves them into the log. Held by the log (the
        same store on every call) and closed with it; read-only when the log is."""

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

    def read_stored(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        """Events as the log stores them: content sealed when it was sealed (what an archive and a restore move,
        without a key). Appending such events stores them as they are. Default: :meth:`read` (a log without a
        sealer stores what it returns)."""
        if self.sealer is not None:  # pragma: no cover - every log with a sealer implements it
            raise NotImplementedError(f"{type(self).__name__} cannot read events as stored")
        return self.read(session_id, from_seq, to_seq)

    def erased(self, session_id: str) -> bool:
        """Whether the session's content was erased (its key destroyed); False without a sealer."""
        return self.sealer is not None and self.sealer.erased(session_id)

    def seal_in_place(self, session_id: str) -> int:
        """Seal, where they are stored, the session's events that hold content but were logged unsealed (before
        encryption was on), so that destroying its key erases them too; returns how many. A log whose records
        cannot be rewritten (Kafka) raises :class:`~foldline.errors.NotErasable`."""
        raise NotErasable(
            f"session {session_id!r} holds content logged before encryption was on, and this log cannot rewrite "
            "its records; destroying the key cannot erase them (docs/ERASURE.md, 'Sessions logged unsealed')"
        )

    def warm(self) -> None:  # noqa: B027 - optional hook
        """Start now what the first sessions would otherwise start on first use (clients, writers, first reads),
        so a long-running process that calls it before it takes sessions serves its first ones like the rest.
        Blocking; nothing to do for a log without such parts."""

    def scrub(self) -> None:  # noqa: B027 - optional hook
        """Leave no copy of rewritten or removed bytes in the store's files (free pages, journals)."""

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


def opened(log_where: str, session_id: str, sealer: Sealer | None, events: list[Envelope]) -> list[Envelope]:
    """``events`` read from a log, opened by ``sealer``; ConfigError for sealed events without one."""
    if sealer is not None:
        return sealer.open(session_id, events) if any(e.sealed is not None for e in events) else events
    for e in events:
        if e.sealed is not None:
            raise ConfigError(
                f"{log_where}: session {session_id!r} holds sealed content (event seq {e.seq}) but the log was "
                "opened without its key store; open it through foldline's configuration (open_stores)"
            )
    return events
