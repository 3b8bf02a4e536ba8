"""The embedded event log: one SQLite database (WAL) per data directory.

Each append is one ``BEGIN IMMEDIATE`` transaction: the head and writer epoch are checked, the batch is
validated against the session's rules, every event is inserted and the head moved — or nothing is.
SQLite's journal makes that hold under ``kill -9`` too. With ``durability="normal"`` (default) a commit
survives a process crash; ``"full"`` also fsyncs every commit so it survives power loss.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a background thread with
its own connection instead of inside whichever commit crosses SQLite's auto-checkpoint threshold: that
commit used to stall for tens of milliseconds, and every commit paid for the threshold check. A PASSIVE
checkpoint never blocks a writer or a reader; ``close`` runs a last one.

Every sqlite3 call is translated here (:func:`_translate`): a lock held by another writer past the busy
timeout is :class:`~foldline.errors.StoreBusy`; a full disk, a read-only file, a damaged database or any
other failure is :class:`~foldline.errors.StoreUnavailable` naming the file and the cause. A failed append
is rolled back: nothing of it is written.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ..core.events import SESSION_FORMAT_VERSION, Envelope
from ..core.wire import decode_event, encode_event
from ..errors import ConflictError, FencedError, FormatError, StoreBusy, StoreUnavailable
from ..ports.event_log import EventLog, RulesCache, WriterLease

__all__ = ["SqliteEventLog"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    head INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"""

DB_NAME = "log.sqlite3"


def _translate(exc: sqlite3.Error, path: Path, what: str, busy_timeout_s: float) -> StoreUnavailable:
    """The foldline error for a sqlite3 failure while doing ``what`` on the log at ``path``."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreBusy(
            f"event log {path} is locked by another writer (waited {busy_timeout_s:g}s while {what}); another "
            "foldline process is writing this data directory — retry when it has finished. Nothing was written."
        )
    if name.startswith("SQLITE_FULL"):
        cause = "the disk is full — free space and retry"
    elif name.startswith("SQLITE_READONLY"):
        cause = "the database is read-only — check the file's permissions"
    elif name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        cause = "the database file is damaged or not a foldline log — restore it from a copy"
    elif name.startswith("SQLITE_CANTOPEN"):
        cause = "the database file cannot be opened — check the path and its permissions"
    else:
        cause = f"{name or type(exc).__name__}"
    return StoreUnavailable(f"event log {path}: {what} failed: {exc} ({cause})")


class SqliteEventLog(EventLog):
    def __init__(
        self,
        path: str | Path,
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout_s: float = 10.0,
        checkpoint_interval_s: float = 0.25,
    ) -> None:
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
            path = path / DB_NAME
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
            if row is None:
                self._db.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('format_version', ?)",
                    (str(SESSION_FORMAT_VERSION),),
                )
            elif row[0] != str(SESSION_FORMAT_VERSION):
                raise FormatError(
                    "format-version",
                    f"{path} holds session format {row[0]}; this foldline reads format {SESSION_FORMAT_VERSION}",
                )
        except sqlite3.Error as exc:
            raise _translate(exc, path, "opening the log", busy_timeout_s) from exc
        self._rules = RulesCache(self._read_all)
        self._checkpointer = _Checkpointer(path, checkpoint_interval_s) if checkpoint_interval_s > 0 else None
        if self._checkpointer is not None:
            self._db.execute("PRAGMA wal_autocheckpoint=0")

    # -------------------------------------------------------------- EventLog

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if not events:
            return self.head(session_id)
        bodies = [(session_id, e.seq, encode_event(e)) for e in events]
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    row = db.execute("SELECT head, epoch FROM sessions WHERE id=?", (session_id,)).fetchone()
                    head, epoch = (row[0], row[1]) if row else (0, 0)
                    if lease is not None and lease.epoch != epoch:
                        raise FencedError(session_id, lease.epoch, epoch)
                    if expected_seq != head:
                        raise ConflictError(session_id, expected_seq, head)
                    self._rules.get(session_id, head).check_batch(events)
                    new_head = head + len(events)
                    try:
                        db.executemany("INSERT INTO events(session_id, seq, body) VALUES (?, ?, ?)", bodies)
                        db.execute(
                            "INSERT INTO sessions(id, head, epoch) VALUES (?, ?, ?) "
                            "ON CONFLICT(id) DO UPDATE SET head=excluded.head",
                            (session_id, new_head, epoch),
                        )
                        db.execute("COMMIT")
                    except BaseException:
                        self._rules.forget(session_id)  # its rules already count the batch
                        raise
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")  # nothing of the batch is written
                    raise
            except sqlite3.Error as exc:
                raise self._translated(exc, f"appending to session {session_id!r}") from exc
        return new_head

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            try:
                return self._read(session_id, from_seq, to_seq)
            except sqlite3.Error as exc:
                raise self._translated(exc, f"reading session {session_id!r}") from exc

    def head(self, session_id: str) -> int:
        with self._lock:
            try:
                row = self._db.execute("SELECT head FROM sessions WHERE id=?", (session_id,)).fetchone()
            except sqlite3.Error as exc:
                raise self._translated(exc, f"reading the head of session {session_id!r}") from exc
        return int(row[0]) if row else 0

    def sessions(self) -> list[str]:
        with self._lock:
            try:
                rows = self._db.execute("SELECT id FROM sessions WHERE head > 0 ORDER BY id").fetchall()
            except sqlite3.Error as exc:
                raise self._translated(exc, "listing the sessions") from exc
        return [str(r[0]) for r in rows]

    def acquire(self, session_id: str) -> WriterLease:
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute(
                        "INSERT INTO sessions(id, head, epoch) VALUES (?, 0, 1) "
                        "ON CONFLICT(id) DO UPDATE SET epoch = epoch + 1",
                        (session_id,),
                    )
                    (epoch,) = db.execute("SELECT epoch FROM sessions WHERE id=?", (session_id,)).fetchone()
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._translated(exc, f"acquiring the writer lease of session {session_id!r}") from exc
        return WriterLease(session_id, int(epoch))

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error as exc:
                raise self._translated(exc, "closing the log") from exc

    def _translated(self, exc: sqlite3.Error, what: str) -> StoreUnavailable:
        return _translate(exc, self.path, what, self._busy_timeout_s)

    # -------------------------------------------------------------- internals

    def _read_all(self, session_id: str) -> list[Envelope]:
        return self._read(session_id, 0, None)

    def _read(self, session_id: str, from_seq: int, to_seq: int | None) -> list[Envelope]:
        upper = to_seq if to_seq is not None else 1 << 62
        rows = self._db.execute(
            "SELECT seq, body FROM events WHERE session_id=? AND seq>=? AND seq<? ORDER BY seq",
            (session_id, from_seq, upper),
        ).fetchall()
        out = []
        for seq, body in rows:
            env = decode_event(body)
            if env.seq != seq:
                raise FormatError("seq-gapless", f"stored row {seq} holds an event with seq {env.seq}", seq=seq)
            out.append(env)
        return out


class _Checkpointer:
    """A daemon thread that runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval_s`` on its own connection."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self._path = path
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"foldline-wal-checkpoint:{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(str(self._path), timeout=1.0, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(self._interval):
                self._checkpoint(db)
            self._checkpoint(db)
        finally:
            db.close()

    @staticmethod
    def _checkpoint(db: sqlite3.Connection) -> None:
        # Busy or locked: the next round checkpoints; the WAL keeps every commit meanwhile.
        with contextlib.suppress(sqlite3.OperationalError):
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
