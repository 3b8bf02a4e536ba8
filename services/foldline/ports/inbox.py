"""The InboxStore port: each session's durable inbox, beside its log.

Any process may put an entry (a message for a later step, an approval decision); the session's writer alone
reads the entries, moves them into the log (``inbox/claim`` + ``user/message``, ``approval/decision``) and then
removes them. The log is the record of what was taken: an entry the log names is never taken again, so a crash
between the append and the removal loses nothing and doubles nothing (docs/LOOP.md, "The durable inbox").

Contract (``tests/contracts/inbox.py`` runs it against every adapter):

* ``put`` returns only once the entry is durable (it survives the putting process being killed) and keeps it
  until ``remove``; ``entries`` lists a session's entries in the order they were put, each once. An entry whose
  id the session's inbox holds already is not stored again (``entries`` lists the first).
* With ``unique``, ``put`` stores nothing and returns False when an entry of the session with the same key is
  there: two puts of one key, however they interleave across processes, store one entry that ``entries`` lists
  (the first in the store's order). The approval decision of a call is put with the call id as its key.
* ``remove`` drops the named entries; an unknown id is ignored. ``entries`` never lists a removed entry.
* Entries of one session never appear in another's; a session without entries lists none.
* A store opened read-only refuses ``put`` and ``remove`` with :class:`~foldline.errors.StoreUnavailable`.
* ``purge`` removes every entry of the session and returns their ids (an erasure: docs/ERASURE.md); the
  embedded store leaves no byte of them in its file's pages.

A log with a sealer hands out its store wrapped in :class:`SealedInbox`: entries are sealed under the session's
data key as they are put and opened as they are read (docs/ERASURE.md); ``stored`` reads them as stored.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence

from ..core.inbox import InboxEntry
from ..errors import ConfigError
from .key_store import Sealer

__all__ = ["InboxStore", "SealedInbox"]


class InboxStore(abc.ABC):
    """Durable per-session inboxes (see the module docstring for the contract)."""

    @property
    def writable(self) -> bool:
        """False for a store opened read-only (a decision or an inject is refused before it is tried)."""
        return True

    @abc.abstractmethod
    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        """Store ``entry`` in the session's inbox, durably; False (nothing stored) when ``unique`` is taken."""

    @abc.abstractmethod
    def entries(self, session_id: str) -> list[InboxEntry]:
        """The session's entries, in the order they were put."""

    @abc.abstractmethod
    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        """Drop the named entries (the log took them); unknown ids are ignored."""

    def sessions(self) -> list[str]:
        """Sessions with at least one entry, sorted (default: none known — a store that cannot list says so)."""
        return []

    def stored(self, session_id: str) -> list[InboxEntry]:
        """The session's entries as stored (sealed content left sealed), in the order they were put."""
        return self.entries(session_id)

    def purge(self, session_id: str) -> list[str]:
        """Remove every entry of the session (an erasure); the ids of those removed, in put order."""
        ids = [e.id for e in self.stored(session_id)]
        self.remove(session_id, ids)
        return ids

    async def entries_async(self, session_id: str) -> list[InboxEntry]:
        """:meth:`entries`, awaitable (a store that waits on a server runs it off the event loop)."""
        return self.entries(session_id)

    async def put_async(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        """:meth:`put`, awaitable."""
        return self.put(session_id, entry, unique=unique)

    async def remove_async(self, session_id: str, entry_ids: Sequence[str]) -> None:
        """:meth:`remove`, awaitable."""
        self.remove(session_id, entry_ids)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class SealedInbox(InboxStore):
    """``store`` with its entries' content sealed by the log's sealer as they are put and opened as they are
    read. ``sealer(reading)`` is the sealer to use now (for reading, a log without one may offer the keys beside
    it); ``None`` puts entries as they are and refuses to read sealed ones (ConfigError)."""

    def __init__(self, store: InboxStore, sealer: Callable[[bool], Sealer | None]) -> None:
        self.inner = store
        self._sealer = sealer  # sealer(for_reading): the log's sealer, or for reading the keys beside the log

    @property
    def writable(self) -> bool:
        return self.inner.writable

    def _sealed(self, session_id: str, entry: InboxEntry) -> InboxEntry:
        sealer = self._sealer(False)
        return sealer.seal_entry(session_id, entry) if sealer is not None else entry

    def _opened(self, session_id: str, entries: list[InboxEntry]) -> list[InboxEntry]:
        if not any(e.sealed is not None for e in entries):
            return entries
        sealer = self._sealer(True)
        if sealer is None:
            raise ConfigError(
                f"the inbox of session {session_id!r} holds sealed entries but the log was opened without its key "
                "store; open it through foldline's configuration (open_stores)"
            )
        return sealer.open_entries(session_id, entries)

    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        return self.inner.put(session_id, self._sealed(session_id, entry), unique=unique)

    def entries(self, session_id: str) -> list[InboxEntry]:
        return self._opened(session_id, self.inner.entries(session_id))

    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        self.inner.remove(session_id, entry_ids)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def stored(self, session_id: str) -> list[InboxEntry]:
        return self.inner.stored(session_id)

    def purge(self, session_id: str) -> list[str]:
        return self.inner.purge(session_id)

    # A store whose calls return at once (memory, the embedded file) keeps the port's defaults, which call the
    # methods above; one that waits on a server (Kafka) runs its own awaitable forms off the event loop.

    async def entries_async(self, session_id: str) -> list[InboxEntry]:
        if type(self.inner).entries_async is InboxStore.entries_async:
            return self.entries(session_id)
        return self._opened(session_id, await self.inner.entries_async(session_id))

    async def put_async(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        if type(self.inner).put_async is InboxStore.put_async:
            return self.put(session_id, entry, unique=unique)
        return await asyncio.to_thread(self.put, session_id, entry, unique=unique)  # sealing may ask the key store

    async def remove_async(self, session_id: str, entry_ids: Sequence[str]) -> None:
        if type(self.inner).remove_async is InboxStore.remove_async:
            self.remove(session_id, entry_ids)
        else:
            await self.inner.remove_async(session_id, entry_ids)

    def close(self) -> None:
        self.inner.close()
