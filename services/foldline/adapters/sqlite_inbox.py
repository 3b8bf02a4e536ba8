"""The embedded inbox store: the ``inbox`` table of the embedded log's own SQLite database.

One row per entry — session id, entry id, the optional unique key (an approval decision's call id) and the
entry's canonical JSON (docs/FORMAT.md §6) — in a rowid table, so ``rowid`` order is put order. A put is one
``INSERT`` in a ``BEGIN IMMEDIATE`` transaction: durable when it returns (the log's WAL, same ``synchronous``
setting as its events), and a unique key already held by a row of the session (a partial unique index) stores
nothing. Any process that can open the data directory for writing may put; only a session's writer removes.

It shares the log's connection and lock (:meth:`SqliteEventLog.inbox`): a read-only log has a read-only inbox,
and every sqlite3 failure is translated like the log's (:class:`~foldline.errors.StoreBusy`,
:class:`~foldline.errors.StoreUnavailable`). A database written before the table existed reads as empty
inboxes; a writable open creates the table.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import Protocol

from ..core.inbox import InboxEntry, decode_entry, encode_entry
from ..core.validation import check_session_id
from ..errors import StoreUnavailable
from ..ports.inbox import InboxStore

__all__ = ["INBOX_SCHEMA", "SqliteHost", "SqliteInboxStore"]

INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    session_id TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    unique_key TEXT,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, entry_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS inbox_unique ON inbox(session_id, unique_key) WHERE unique_key IS NOT NULL;
"""


class SqliteHost(Protocol):
    """What the inbox uses of its embedded log (:class:`~.sqlite_log.SqliteEventLog`): its connection and lock,
    whether it is read-only, and how it names a failure."""

    _db: sqlite3.Connection
    _lock: threading.Lock
    read_only: bool

    def _writable(self, what: str) -> None: ...
    def _translated(self, exc: sqlite3.Error, what: str) -> StoreUnavailable: ...


class SqliteInboxStore(InboxStore):
    """The inbox table of one embedded log (see the module docstring)."""

    def __init__(self, log: SqliteHost) -> None:
        self._log = log

    @property
    def writable(self) -> bool:
        return not self._log.read_only

    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        check_session_id(session_id)
        log = self._log
        log._writable(f"putting an entry into the inbox of session {session_id!r}")
        body = encode_entry(entry)
        with log._lock:
            db = log._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    if unique is not None:
                        held = db.execute(
                            "SELECT 1 FROM inbox WHERE session_id=? AND unique_key=?", (session_id, unique)
                        ).fetchone()
                        if held is not None:
                            db.execute("ROLLBACK")
                            return False
                    db.execute(
                        "INSERT INTO inbox(session_id, entry_id, unique_key, body) VALUES (?, ?, ?, ?)",
                        (session_id, entry.id, unique, body),
                    )
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.IntegrityError:
                return False  # the same entry id, or the unique key taken between the check and the insert
            except sqlite3.Error as exc:
                raise log._translated(exc, f"putting an entry into the inbox of session {session_id!r}") from exc
        return True

    def entries(self, session_id: str) -> list[InboxEntry]:
        log = self._log
        with log._lock:
            try:
                rows = log._db.execute(
                    "SELECT entry_id, body FROM inbox WHERE session_id=? ORDER BY rowid", (session_id,)
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []  # a log written before the inbox existed, opened read-only
                raise log._translated(exc, f"reading the inbox of session {session_id!r}") from exc
            except sqlite3.Error as exc:
                raise log._translated(exc, f"reading the inbox of session {session_id!r}") from exc
        return [
            decode_entry(bytes(body), f"inbox entry {entry_id!r} of session {session_id!r}") for entry_id, body in rows
        ]

    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        log = self._log
        log._writable(f"removing entries from the inbox of session {session_id!r}")
        with log._lock:
            try:
                log._db.executemany(
                    "DELETE FROM inbox WHERE session_id=? AND entry_id=?", [(session_id, x) for x in entry_ids]
                )
            except sqlite3.Error as exc:
                raise log._translated(exc, f"removing entries from the inbox of session {session_id!r}") from exc

    def purge(self, session_id: str) -> list[str]:
        """Delete every row of the session with ``secure_delete`` on (the freed cells are zeroed); the log's
        ``scrub`` then leaves no copy in the write-ahead log or free pages."""
        check_session_id(session_id)
        log = self._log
        log._writable(f"purging the inbox of session {session_id!r}")
        with log._lock:
            db = log._db
            try:
                db.execute("PRAGMA secure_delete=ON")
                db.execute("BEGIN IMMEDIATE")
                try:
                    rows = db.execute(
                        "SELECT entry_id FROM inbox WHERE session_id=? ORDER BY rowid", (session_id,)
                    ).fetchall()
                    db.execute("DELETE FROM inbox WHERE session_id=?", (session_id,))
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise log._translated(exc, f"purging the inbox of session {session_id!r}") from exc
            except sqlite3.Error as exc:
                raise log._translated(exc, f"purging the inbox of session {session_id!r}") from exc
        return [str(r[0]) for r in rows]

    def sessions(self) -> list[str]:
        log = self._log
        with log._lock:
            try:
                rows = log._db.execute("SELECT DISTINCT session_id FROM inbox ORDER BY session_id").fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise log._translated(exc, "listing the inboxes") from exc
            except sqlite3.Error as exc:
                raise log._translated(exc, "listing the inboxes") from exc
        return [str(r[0]) for r in rows]
