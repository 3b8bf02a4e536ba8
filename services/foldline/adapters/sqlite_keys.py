"""The embedded key store: one SQLite file beside the log (``<data dir>/keys.sqlite3``).

A separate file from ``log.sqlite3`` on purpose: a copy or backup of the log holds no key, and the key file can be
kept elsewhere (``FOLDLINE_KEY_DIR``) or backed up under its own policy. Layout (docs/ERASURE.md)::

    meta(key, value)                          ('foldline', 'keys'), ('format_version', '1')
    keys(session_id PRIMARY KEY, kid, material, wrapped, subject, created_ms, erasure, erased_ms)
    erasures(id PRIMARY KEY, requested_ms, record)          -- the erasure record as canonical JSON
    exports(session_id, host, path, record)                 -- export files foldline wrote

A key is ``material`` (32 bytes) or, with a key-encryption key, ``wrapped`` (``adapters/sealing.py``); a destroyed
key has both ``NULL`` and ``erasure`` set. Destroying leaves no copy of the bytes in the files: the connection runs
with ``PRAGMA secure_delete=ON`` (SQLite overwrites the freed bytes of the row with zeros), and right after the
update the write-ahead log — which holds the page as it was before — is copied back and truncated to nothing
(``wal_checkpoint(TRUNCATE)``). Every commit is ``synchronous=FULL``: a key is on disk before any event sealed
with it is written to the log (one fsync of the WAL per new session: a rollback journal took three, ~3x the time
here). sqlite3 errors are translated here into StoreUnavailable / StoreBusy.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..core import codec
from ..errors import ConfigError, StoreBusy, StoreUnavailable
from ..ports.key_store import ErasureRecord, KeyStore, SessionKey, TrackedExport
from .sealing import unwrap_key, wrap_key

__all__ = ["KEYS_NAME", "SqliteKeyStore"]

KEYS_NAME = "keys.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    session_id TEXT PRIMARY KEY,
    kid TEXT NOT NULL,
    material BLOB,
    wrapped TEXT,
    subject TEXT,
    created_ms INTEGER NOT NULL,
    erasure TEXT,
    erased_ms INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_by_subject ON keys(subject) WHERE subject IS NOT NULL;
CREATE TABLE IF NOT EXISTS erasures (id TEXT PRIMARY KEY, requested_ms INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS exports (
    session_id TEXT NOT NULL,
    host TEXT NOT NULL,
    path TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session_id, host, path)
) WITHOUT ROWID;
"""
_COLUMNS = "session_id, kid, material, wrapped, subject, created_ms, erasure, erased_ms"


class SqliteKeyStore(KeyStore):
    """The key store in one SQLite file; ``read_only`` opens it without creating or changing anything (a missing
    file holds no keys). ``kek``: the key-encryption key new keys are wrapped with (and old ones unwrapped)."""

    def __init__(
        self, path: str | Path, *, read_only: bool = False, kek: bytes | None = None, busy_timeout_s: float = 10.0
    ) -> None:
        self.path = Path(path)
        self.where = f"the key store {self.path}"
        self.read_only = read_only
        self._kek = kek
        self._timeout = busy_timeout_s
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._opened = False

    # -------------------------------------------------------------- connection

    def _conn(self) -> sqlite3.Connection | None:
        """The connection, opened on first use; ``None`` for a read-only store whose file does not exist."""
        if self._opened:
            return self._db
        path = self.path
        try:
            if self.read_only:
                if not path.exists():
                    self._opened = True
                    return None
                db = self._open_read_only(path)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(str(path), timeout=self._timeout, isolation_level=None, check_same_thread=False)
                tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if tables and "keys" not in tables:
                    db.close()
                    raise StoreUnavailable(f"{path} is a SQLite database but not a foldline key store; name another")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                db.executescript(_SCHEMA)
                db.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('foldline', 'keys'), ('format_version', '1')"
                )
                with contextlib.suppress(OSError):
                    path.chmod(0o600)
            db.execute("PRAGMA secure_delete=ON")
        except sqlite3.Error as exc:
            raise self._translated(exc, "opening") from exc
        except OSError as exc:
            raise StoreUnavailable(f"{self.where}: cannot create its directory: {exc.strerror or exc}") from exc
        self._db, self._opened = db, True
        return db

    def _open_read_only(self, path: Path) -> sqlite3.Connection:
        """``mode=ro``; where no ``-shm`` can be made (a read-only directory or copy), the file as immutable."""
        uri = f"file:{quote(str(path.resolve()))}"
        failure: sqlite3.Error | None = None
        for target in (f"{uri}?mode=ro", f"{uri}?immutable=1"):
            db = sqlite3.connect(target, uri=True, timeout=self._timeout, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA query_only=1")
                db.execute("SELECT count(*) FROM keys").fetchone()
                return db
            except sqlite3.Error as exc:
                db.close()
                failure = exc
        assert failure is not None
        raise failure

    def _translated(self, exc: sqlite3.Error, what: str) -> StoreUnavailable:
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return StoreBusy(
                f"{self.where} is locked by another process (waited {self._timeout:g}s while {what}); retry"
            )
        return StoreUnavailable(f"{self.where}: {what} failed: {' '.join(str(exc).split())} ({name})")

    def _write(self, what: str, sql: str, args: tuple[Any, ...]) -> None:
        if self.read_only:
            raise StoreUnavailable(f"{self.where} was opened read-only; {what} needs a writable key store")
        with self._lock:
            db = self._conn()
            assert db is not None
            try:
                db.execute(sql, args)
            except sqlite3.Error as exc:
                raise self._translated(exc, what) from exc

    def _rows(self, what: str, sql: str, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            db = self._conn()
            if db is None:
                return []
            try:
                return db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise self._translated(exc, what) from exc

    # -------------------------------------------------------------- keys

    def _record(self, row: Any) -> SessionKey:
        session_id, kid, material, wrapped, subject, created_ms, erasure, erased_ms = row
        key: bytes | None = None
        if erasure is None:
            if wrapped is not None:
                if self._kek is None:
                    raise ConfigError(
                        f"{self.where} keeps its data keys wrapped; set FOLDLINE_KEY_ENCRYPTION_KEY to the "
                        "key-encryption key it was written with"
                    )
                key = unwrap_key(self._kek, session_id, kid, wrapped, self.where)
            else:
                key = bytes(material)
        return SessionKey(session_id, kid, key, int(created_ms), subject, erasure, erased_ms)

    def create(self, key: SessionKey) -> SessionKey:
        assert key.material is not None
        wrapped = wrap_key(self._kek, key) if self._kek is not None else None
        self._write(
            f"creating the key of session {key.session_id!r}",
            f"INSERT OR IGNORE INTO keys({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)",
            (key.session_id, key.kid, None if wrapped else key.material, wrapped, key.subject, key.created_ms),
        )
        stored = self.get(key.session_id)
        assert stored is not None
        return stored

    def get(self, session_id: str) -> SessionKey | None:
        rows = self._rows(
            f"reading the key of session {session_id!r}",
            f"SELECT {_COLUMNS} FROM keys WHERE session_id=?",
            (session_id,),
        )
        return self._record(rows[0]) if rows else None

    def destroy(self, session_id: str, erasure: str, now_ms: int) -> SessionKey | None:
        self._write(
            f"destroying the key of session {session_id!r}",
            "UPDATE keys SET material=NULL, wrapped=NULL, erasure=?, erased_ms=? "
            "WHERE session_id=? AND erasure IS NULL",
            (erasure, now_ms, session_id),
        )
        self._checkpoint()  # the WAL's copy of the page as it was goes too
        return self.get(session_id)

    def _checkpoint(self) -> None:
        with self._lock:
            db = self._conn()
            assert db is not None
            try:
                busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise self._translated(exc, "checkpointing") from exc
        if busy:
            raise StoreBusy(
                f"{self.where}: another process reads the key store, so its write-ahead log (which still holds a "
                "destroyed key's page) could not be emptied; the key is destroyed — run the erasure again to finish"
            )

    def sessions_of_subject(self, subject: str) -> list[str]:
        rows = self._rows(
            "listing a subject's sessions",
            "SELECT session_id FROM keys WHERE subject=? ORDER BY session_id",
            (subject,),
        )
        return [str(r[0]) for r in rows]

    def vacuum(self) -> None:
        """Rewrite the file without free pages (after an erasure: nothing of a destroyed key is left anywhere)."""
        if self.read_only:
            return
        with self._lock:
            db = self._conn()
            assert db is not None
            try:
                db.execute("VACUUM")
            except sqlite3.Error as exc:
                raise self._translated(exc, "vacuuming") from exc
        self._checkpoint()

    # -------------------------------------------------------------- erasure records, exports

    def put_erasure(self, record: ErasureRecord) -> None:
        self._write(
            f"writing erasure {record.erasure_id}",
            "INSERT OR REPLACE INTO erasures(id, requested_ms, record) VALUES (?, ?, ?)",
            (record.erasure_id, record.requested_ms, codec.canonical_json(record.to_json()).decode()),
        )

    def erasures(self) -> list[ErasureRecord]:
        rows = self._rows("listing erasures", "SELECT record FROM erasures ORDER BY requested_ms, id", ())
        return [ErasureRecord.from_json(codec.loads(r[0])) for r in rows]

    def track_export(self, export: TrackedExport) -> None:
        self._write(
            f"noting the export {export.path}",
            "INSERT OR REPLACE INTO exports(session_id, host, path, record) VALUES (?, ?, ?, ?)",
            (export.session_id, export.host, export.path, codec.canonical_json(export.to_json()).decode()),
        )

    def exports(self, session_id: str) -> list[TrackedExport]:
        rows = self._rows(
            "listing exports", "SELECT record FROM exports WHERE session_id=? ORDER BY host, path", (session_id,)
        )
        return [TrackedExport.from_json(codec.loads(r[0])) for r in rows]

    def forget_export(self, export: TrackedExport) -> None:
        self._write(
            f"forgetting the export {export.path}",
            "DELETE FROM exports WHERE session_id=? AND host=? AND path=?",
            (export.session_id, export.host, export.path),
        )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
            self._db, self._opened = None, False
