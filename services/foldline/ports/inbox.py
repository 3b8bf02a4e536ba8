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
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from ..core.inbox import InboxEntry

__all__ = ["InboxStore"]


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
