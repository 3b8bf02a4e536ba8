"""The inbox: messages (and approval decisions) waiting for the session's writer — durable before anyone acts.

A session's inbox is a store beside its log (:class:`~foldline.ports.inbox.InboxStore`: the embedded log's
``inbox`` table, ``<topic>.inbox`` on Kafka). ``agent.inject()``, a tool's additional context and a decision made
in any process are *put* there and are durable when the call returns. Only the session's writer moves them into
the log, and the log records what it took:

* a step's claim takes every message entry the log has not taken yet (in the order they were put), then this
  instance's own turn prompt (which its caller holds, so it is not put anywhere); the step's opening logs
  ``inbox/claim`` with the entries' ids before their ``user/message`` s, in the same append;
* a paused turn takes decisions as ``approval/decision`` events, each naming its entry.

An entry the log names is never taken again, so a crash between the put and the claim loses nothing, and a
crash between the claim's append and the store's removal of the entry enters nothing twice. Writing the log
stays the writer's alone: a process that is not the session's writer never appends to it (docs/LOOP.md, "The
durable inbox").
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from ..core.content import ContentBlock, TextBlock
from ..core.inbox import InboxDecision, InboxEntry, InboxMessage
from ..core.validation import check_session_id
from ..errors import SessionNotFound, StoreUnavailable, WriteNotAllowed
from ..ports.event_log import EventLog
from ..ports.inbox import InboxStore
from .options import wall_clock_ms

__all__ = ["Inbox", "InboxItem", "inject", "new_entry_id"]


def new_entry_id() -> str:
    """A fresh inbox entry id (random, 32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One message a step enters: its content and source, and the inbox entry it came from (``entry``; ``None``
    for a turn's prompt or a pre-step hook's message, which no store holds)."""

    content: tuple[ContentBlock, ...]
    source: str = "user"
    entry: str | None = None


class Inbox:
    """A session's inbox as its writer sees it (module docstring). Thread-safe; ``put`` may come from any thread.

    ``Inbox()`` alone is an inbox in this process's memory; an :class:`~foldline.loop.Agent` builds its own over
    its log's store (:meth:`~foldline.ports.event_log.EventLog.inbox`), knowing every entry the log has taken.
    """

    def __init__(
        self,
        store: InboxStore | None = None,
        session_id: str = "inbox",
        *,
        taken: Iterable[str] = (),
        clock: Callable[[], int] = wall_clock_ms,
        new_id: Callable[[], str] = new_entry_id,
    ) -> None:
        if store is None:
            from ..adapters.memory_inbox import MemoryInboxStore

            store = MemoryInboxStore()
        self.store = store
        self.session_id = session_id
        self._clock = clock
        self._new_id = new_id
        self._lock = threading.Lock()
        self._local: list[InboxItem] = []  # this instance's turn prompts
        self._taken: set[str] = set(taken)  # entries the log names: never taken again
        self._claimed: set[str] = set()  # entries of a claim whose append is under way
        self._unremoved: set[str] = set()  # taken entries the store has not dropped yet

    # -------------------------------------------------------------- putting

    def put(self, item: InboxItem, *, entry_id: str | None = None) -> str:
        """Put a message into the durable inbox; returns its entry id once it is durable. A given ``entry_id``
        already in the inbox (or taken by the log) is not put again."""
        entry = self._entry(item, entry_id)
        if entry.id not in self._taken:
            self.store.put(self.session_id, entry)
        return entry.id

    async def put_async(self, item: InboxItem, *, entry_id: str | None = None) -> str:
        """:meth:`put`, awaitable."""
        entry = self._entry(item, entry_id)
        if entry.id not in self._taken:
            await self.store.put_async(self.session_id, entry)
        return entry.id

    def _entry(self, item: InboxItem, entry_id: str | None) -> InboxEntry:
        return InboxEntry(entry_id or self._new_id(), self._clock(), InboxMessage(item.content, item.source))

    def prompt(self, item: InboxItem) -> None:
        """Queue a turn's prompt for the next claim, after the durable entries (kept here: its caller holds it)."""
        with self._lock:
            self._local.append(item)

    # -------------------------------------------------------------- claiming

    def claim(self) -> tuple[InboxItem, ...]:
        """Every message the log has not taken (in put order), then the prompts; the step's opening must log
        ``inbox/claim`` for the items with an ``entry`` and then call :meth:`taken` (or :meth:`give_back`)."""
        return self._claim(self.store.entries(self.session_id))

    async def claim_async(self) -> tuple[InboxItem, ...]:
        """:meth:`claim`, awaitable. Entries the log named but the store still holds (a crash after the claim's
        append) are dropped from the store on the way."""
        entries = await self.store.entries_async(self.session_id)
        leftovers = [e.id for e in entries if e.id in self._taken]
        if leftovers:
            await self.taken(leftovers)
        return self._claim(entries)

    def _claim(self, entries: list[InboxEntry]) -> tuple[InboxItem, ...]:
        with self._lock:
            batch = [
                InboxItem(e.item.content, e.item.source, e.id)
                for e in entries
                if isinstance(e.item, InboxMessage) and e.id not in self._taken and e.id not in self._claimed
            ]
            self._claimed.update(item.entry for item in batch if item.entry is not None)
            batch += self._local
            self._local = []
        return tuple(batch)

    def give_back(self, batch: tuple[InboxItem, ...]) -> None:
        """A claimed batch nothing logged (a rejected step, a failed opening): it waits for the next claim."""
        with self._lock:
            self._claimed.difference_update(item.entry for item in batch if item.entry is not None)
            self._local[:0] = [item for item in batch if item.entry is None]

    def decisions(self, entries: list[InboxEntry], calls: Collection[str]) -> list[InboxEntry]:
        """The first decision entry for each of ``calls`` in ``entries`` that the log has not taken (a later entry
        for a call already decided — in the log or earlier in ``entries`` — never counts)."""
        out: list[InboxEntry] = []
        seen: set[str] = set()
        with self._lock:
            for e in entries:
                item = e.item
                if not isinstance(item, InboxDecision) or e.id in self._taken:
                    continue
                if item.call_id in calls and item.call_id not in seen:
                    seen.add(item.call_id)
                    out.append(e)
        return out

    def stale(self, entries: list[InboxEntry], decided: Collection[str]) -> list[str]:
        """Decision entries that can never count (their call is decided in the log): to remove."""
        with self._lock:
            return [
                e.id
                for e in entries
                if isinstance(e.item, InboxDecision) and e.item.call_id in decided and e.id not in self._taken
            ]

    async def taken(self, entry_ids: Iterable[str]) -> None:
        """The log now names ``entry_ids``: never take them again, and drop them from the store (best effort —
        one left behind is skipped, since the log names it)."""
        ids = list(entry_ids)
        with self._lock:
            self._taken.update(ids)
            self._claimed.difference_update(ids)
            self._unremoved.update(ids)
            pending = sorted(self._unremoved)
        if not pending:
            return
        try:
            await self.store.remove_async(self.session_id, pending)
        except StoreUnavailable:
            return  # removed with a later claim; the log keeps them from counting meanwhile
        with self._lock:
            self._unremoved.difference_update(pending)

    def __len__(self) -> int:
        """Messages waiting: the durable entries not taken, plus the prompts."""
        entries = self.store.entries(self.session_id)
        with self._lock:
            durable = sum(
                1 for e in entries if isinstance(e.item, InboxMessage) and e.id not in self._taken | self._claimed
            )
            return durable + len(self._local)


def inject(
    log: EventLog,
    session_id: str,
    text: str | Sequence[ContentBlock],
    *,
    source: str = "inject",
    clock: Callable[[], int] = wall_clock_ms,
    new_id: Callable[[], str] = new_entry_id,
) -> str:
    """Put a message for ``session_id``'s next step into its durable inbox, from any process (``foldline inject``);
    returns the entry id once it is durable. It never writes the log: the session's writer claims it at its next
    step (a running loop at once, else the next ``resume``). :class:`SessionNotFound` for a session the log does
    not have; a read-only log's inbox refuses (:class:`~foldline.errors.StoreUnavailable`)."""
    check_session_id(session_id)
    if log.head(session_id) == 0:
        raise SessionNotFound(session_id)
    store = log.inbox()
    if not store.writable:
        raise WriteNotAllowed(
            f"this process opened the log of session {session_id!r} read-only, so it cannot put a message into its "
            "inbox; inject from a process that can write the data directory (or the Kafka cluster)"
        )
    content = (TextBlock(text),) if isinstance(text, str) else tuple(text)
    entry = InboxEntry(new_id(), clock(), InboxMessage(content, source))
    store.put(session_id, entry)
    return entry.id
