"""The embedded event log: one SQLite database (WAL) per data directory.

Each append is one ``BEGIN IMMEDIATE`` transaction: the head and writer epoch are checked, the batch is
validated against the session's rules, every event is inserted and the head moved — or nothing is. (One
conditional ``UPDATE`` checks the head and epoch and moves the head; the row is read only when it moves
nothing, to say why.)
SQLite's journal makes that hold under ``kill -9`` too. With ``durability="normal"`` (default) a commit
survives a process crash; ``"full"`` also fsyncs every commit so it survives power loss. :meth:`create`
writes a whole new session in one such transaction while its events stream in, so an import of any size
holds one event in memory at a time.

Events live in a rowid table with a unique ``(session_id, seq)`` index: rows are added at the end of the
table however sessions interleave, so its pages stay full, and a row up to a page long stays on its page.
(A clustered ``WITHOUT ROWID`` table split half-full pages when sessions interleaved and moved most of a
1-4 KB event to an overflow page: up to 4x the event bytes on disk.) Files written that way are read the
same. docs/FORMAT.md §6 has the layout.

Checkpoints (copying the WAL back into the database file, with an fsync) run on a background thread with
its own connection instead of inside whichever commit crosses SQLite's auto-checkpoint threshold: that
commit used to stall for tens of milliseconds, and every commit paid for the threshold check. A PASSIVE
checkpoint never blocks a writer or a reader; ``close`` runs a last one. ``journal_size_limit`` gives the
WAL's disk space back after a large write.

``read_only=True`` opens the log for reading only, and never creates or changes a file: a missing
database reads as an empty log; a read-only directory or a read-only copy without its ``-shm`` file is
opened as an immutable file (nothing can be writing it then). Appends are refused.

Every sqlite3 call is translated here (:func:`_translate`): a lock held by another writer past the busy
timeout is :class:`~foldline.errors.StoreBusy`; a full disk, a read-only file, a damaged database or any
other failure is :class:`~foldline.errors.StoreUnavailable` naming the file and the cause. A failed append
is rolled back: nothing of it is written.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from ..core.events import SESSION_FORMAT_VERSION, Envelope
from ..core.limits import check_stored_size
from ..core.sealing import has_content
from ..core.validation import LogRules, check_session_id
from ..core.wire import decode_event, encode_event, encoded_size
from ..errors import ConflictError, FencedError, FormatError, StoreBusy, StoreUnavailable
from ..ports.event_log import EncodedEvent, EventLog, RulesCache, WriterLease, opened
from ..ports.inbox import InboxStore, SealedInbox
from ..ports.key_store import Sealer
from .sqlite_inbox import INBOX_SCHEMA, SqliteInboxStore

__all__ = ["DB_NAME", "SqliteEventLog"]

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
);
"""

DB_NAME = "log.sqlite3"
PAGE_SIZE = 4096  # a new database's page size (docs/FORMAT.md §6)
_WAL_KEEP = 64 << 20  # journal_size_limit: the WAL is truncated to this after a checkpoint
_DB_SUFFIXES = frozenset({".sqlite3", ".sqlite", ".db"})


def _translate(exc: sqlite3.Error, path: Path, what: str, busy_timeout_s: float) -> StoreUnavailable:
    """The foldline error for a sqlite3 failure while doing ``what`` on the log at ``path``."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreBusy(
            f"event log {path} is locked by another writer (waited {busy_timeout_s:g}s while {what}); another "
            "foldline process is writing this data directory — retry when it has finished. Nothing was written."
        )
    if name.startswith("SQLITE_FULL") or "database or disk is full" in str(exc):
        cause = "the disk is full — free space and retry; nothing of this write was kept"
    elif name.startswith("SQLITE_READONLY"):
        cause = "the database is read-only — check the file's permissions"
    elif name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        cause = "the database file is damaged or not a foldline log — restore it from a copy"
    elif name.startswith("SQLITE_CANTOPEN"):
        cause = "the database file cannot be opened — check the path and its permissions"
    elif name.startswith("SQLITE_IOERR"):
        cause = "the disk refused a read or write (full, too large for the file-size limit, or failing) — check it"
    else:
        cause = f"{name or type(exc).__name__}"
    return StoreUnavailable(f"event log {path}: {what} failed: {' '.join(str(exc).split())} ({cause})")


def database_path(path: str | Path) -> Path:
    """The database file a log path names: the path itself for an existing file or a ``.sqlite3`` /
    ``.sqlite`` / ``.db`` name, else ``<path>/log.sqlite3`` (a data directory, dots in its name or not)."""
    path = Path(path)
    if path.is_file() or (not path.is_dir() and path.suffix in _DB_SUFFIXES):
        return path
    return path / DB_NAME


class SqliteEventLog(EventLog):
    seals_in_place = True  # its rows are rewritten where they are (an erasure of content logged unsealed)

    def __init__(
        self,
        path: str | Path,
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout_s: float = 10.0,
        checkpoint_interval_s: float = 0.25,
        read_only: bool = False,
        sealer: Sealer | None = None,
    ) -> None:
        path = database_path(path)
        self.path = path
        self.read_only = read_only
        self.sealer = sealer
        self._beside: Sealer | None = None  # the keys beside the log, for a log opened without a sealer
        self._busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        self._rules = RulesCache(self._read_all)
        self._checkpointer: _Checkpointer | None = None
        self._inbox = SealedInbox(
            SqliteInboxStore(self),
            lambda reading: self.sealer if self.sealer is not None or not reading else self._keys_beside(),
        )
        if read_only:
            self._db = self._open_read_only(path, busy_timeout_s)
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(
                f"event log {path}: cannot create its directory {path.parent}: {exc.strerror or exc} "
                "(a data directory must be a directory you can write)"
            ) from exc
        try:
            self._db = sqlite3.connect(str(path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
            tables = {str(r[0]) for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "meta" not in tables:  # before anything changes the file
                raise StoreUnavailable(
                    f"{path} is a SQLite database but not a foldline log (it holds the tables "
                    f"{', '.join(sorted(tables)[:5])}); foldline will not write into it — pass another --data-dir"
                )
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect only in a new database
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durability == 'full' else 'NORMAL'}")
            self._db.execute(f"PRAGMA journal_size_limit={_WAL_KEEP}")
            self._db.executescript(_SCHEMA + INBOX_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
            if row is None:
                self._db.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('format_version', ?)",
                    (str(SESSION_FORMAT_VERSION),),
                )
            else:
                _check_format(path, row[0])
        except sqlite3.Error as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            raise _translate(exc, path, "opening the log", busy_timeout_s) from exc
        except BaseException:
            self._db.close()
            raise
        self._checkpointer = _Checkpointer(path, checkpoint_interval_s) if checkpoint_interval_s > 0 else None
        if self._checkpointer is not None:
            self._db.execute("PRAGMA wal_autocheckpoint=0")

    @staticmethod
    def _open_read_only(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
        """A connection that cannot write (see the module docstring); an empty log when there is no file."""
        if not path.exists() or path.stat().st_size == 0:  # no log yet: an empty one
            db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            db.executescript(_SCHEMA)
            db.execute("PRAGMA query_only=1")
            return db
        uri = "file:" + quote(str(path.resolve()))
        attempts = [f"{uri}?mode=ro"]
        wal = path.with_name(path.name + "-wal")
        shm = path.with_name(path.name + "-shm")
        # Without write access for a -shm file, WAL readers cannot coordinate; then nothing can be writing
        # the file either, and it is read as immutable — unless its WAL holds commits a checkpoint never
        # copied back, which an immutable reader would not see.
        if not shm.exists() and not (wal.exists() and wal.stat().st_size > 0):
            attempts.append(f"{uri}?immutable=1")
        failure: sqlite3.Error | None = None
        for target in attempts:
            db = sqlite3.connect(
                target, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                db.execute("PRAGMA query_only=1")
                tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if "meta" not in tables:
                    db.close()
                    what = f"holds the tables {', '.join(sorted(tables)[:5])}" if tables else "has no tables"
                    raise StoreUnavailable(f"event log {path} is not a foldline log (the SQLite file {what})")
                row = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
            except sqlite3.Error as exc:
                db.close()
                failure = exc
                continue
            if row is None:
                db.close()
                raise StoreUnavailable(f"event log {path} has no format version; it is not a foldline log")
            try:
                _check_format(path, row[0])
            except BaseException:
                db.close()
                raise
            return db
        assert failure is not None
        if not os.access(path.parent, os.W_OK) and wal.exists() and not shm.exists():
            raise StoreUnavailable(
                f"event log {path}: its write-ahead log {wal.name} holds commits not yet in the database, and the "
                f"read-only directory has no {shm.name} to read them with; copy the data directory somewhere "
                "writable (with its -wal file) and read the copy"
            ) from failure
        raise _translate(failure, path, "opening the log read-only", busy_timeout_s) from failure

    # -------------------------------------------------------------- EventLog

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if not events:
            return self.head(session_id)
        self._writable(f"appending to session {session_id!r}")
        bodies = self._bodies(session_id, events)
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    # The head moves only from the expected one, and (with a lease) only under its epoch: one
                    # statement checks both and moves it. When it moves nothing, the row says why — or there
                    # is no row yet (a session at 0 without a lease), and it is inserted with the events.
                    new_head = expected_seq + len(events)
                    if lease is not None:
                        moved = db.execute(
                            "UPDATE sessions SET head=? WHERE id=? AND head=? AND epoch=?",
                            (new_head, session_id, expected_seq, lease.epoch),
                        ).rowcount
                    else:
                        moved = db.execute(
                            "UPDATE sessions SET head=? WHERE id=? AND head=?", (new_head, session_id, expected_seq)
                        ).rowcount
                    if not moved:
                        row = db.execute("SELECT head, epoch FROM sessions WHERE id=?", (session_id,)).fetchone()
                        head, epoch = (row[0], row[1]) if row else (0, 0)
                        if lease is not None and lease.epoch != epoch:
                            raise FencedError(session_id, lease.epoch, epoch)
                        if expected_seq != head:
                            raise ConflictError(session_id, expected_seq, head)
                    self._rules.get(session_id, expected_seq).check_batch(events)
                    try:
                        db.executemany("INSERT INTO events(session_id, seq, body) VALUES (?, ?, ?)", bodies)
                        if not moved:  # no row yet: a new session, written without a lease (epoch 0)
                            db.execute("INSERT INTO sessions(id, head, epoch) VALUES (?, ?, 0)", (session_id, new_head))
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

    def create(self, session_id: str, events: Iterable[Envelope | EncodedEvent]) -> int:
        """Write a new session from ``events`` in ONE transaction as they stream in (bounded memory)."""
        self._writable(f"creating session {session_id!r}")
        rules = LogRules()
        check_session_id(session_id)

        sealer = self.sealer if self.sealer is not None and self.sealer.seal_new else None

        def rows() -> Iterator[tuple[str, int, bytes]]:
            for item in events:
                if isinstance(item, EncodedEvent):
                    e, body = item.envelope, item.body
                else:
                    e, body = item, encode_event(item)
                rules.advance(e)  # a failure rolls the whole session back, and these rules are dropped
                stored = sealer.seal(session_id, (e,))[0] if sealer is not None else e
                if stored is not e:
                    body = encode_event(stored)
                check_stored_size(len(body), stored is not e, functools.partial(encoded_size, e), e.seq)
                yield session_id, e.seq, body

        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    row = db.execute("SELECT head FROM sessions WHERE id=?", (session_id,)).fetchone()
                    head = row[0] if row else 0
                    if head != 0:
                        raise ConflictError(session_id, 0, head)
                    db.executemany("INSERT INTO events(session_id, seq, body) VALUES (?, ?, ?)", rows())
                    if rules.next_seq:
                        db.execute(
                            "INSERT INTO sessions(id, head, epoch) VALUES (?, ?, 0) "
                            "ON CONFLICT(id) DO UPDATE SET head=excluded.head",
                            (session_id, rules.next_seq),
                        )
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")  # nothing of the session is written
                    raise
                finally:
                    self._rules.forget(session_id)
            except sqlite3.Error as exc:
                raise self._translated(exc, f"creating session {session_id!r}") from exc
        return rules.next_seq

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            try:
                return self._read(session_id, from_seq, to_seq)
            except sqlite3.Error as exc:
                raise self._translated(exc, f"reading session {session_id!r}") from exc

    def read_stored(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            try:
                return self._read(session_id, from_seq, to_seq, open_=False)
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

    def heads(self) -> dict[str, int]:
        with self._lock:
            try:
                rows = self._db.execute("SELECT id, head FROM sessions WHERE head > 0").fetchall()
            except sqlite3.Error as exc:
                raise self._translated(exc, "listing the sessions' heads") from exc
        return {str(r[0]): int(r[1]) for r in rows}

    def acquire(self, session_id: str) -> WriterLease:
        self._writable(f"acquiring the writer lease of session {session_id!r}")
        check_session_id(session_id)
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

    def inbox(self) -> InboxStore:
        """The ``inbox`` table of this database (:mod:`.sqlite_inbox`), on this log's connection; entries sealed
        and opened by this log's sealer (:class:`~foldline.ports.inbox.SealedInbox`)."""
        return self._inbox

    def close(self) -> None:
        if self._beside is not None:
            self._beside.close()
            self._beside = None
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

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise StoreUnavailable(f"event log {self.path} was opened read-only; {what} needs a writable log")

    # -------------------------------------------------------------- internals

    def _bodies(self, session_id: str, events: Sequence[Envelope]) -> list[tuple[str, int, bytes]]:
        """The rows of ``events``: their stored bytes (sealed when a sealer seals), each within the size limit."""
        stored = self.sealer.seal(session_id, events) if self.sealer is not None else events
        bodies = []
        for plain, e in zip(events, stored, strict=True):
            body = encode_event(e)
            if plain.sealed is None:  # one given sealed (restored from an archive) was checked when first appended
                check_stored_size(len(body), e is not plain, functools.partial(encoded_size, plain), e.seq)
            bodies.append((session_id, e.seq, body))
        return bodies

    def _read_all(self, session_id: str) -> list[Envelope]:
        return self._read(session_id, 0, None)

    def _read(self, session_id: str, from_seq: int, to_seq: int | None, *, open_: bool = True) -> list[Envelope]:
        upper = to_seq if to_seq is not None else 1 << 62
        rows = self._db.execute(
            "SELECT seq, body FROM events WHERE session_id=? AND seq>=? AND seq<? ORDER BY seq",
            (session_id, from_seq, upper),
        ).fetchall()
        out = []
        for seq, body in rows:
            env = decode_event(bytes(body))
            if env.seq != seq:
                raise FormatError("seq-gapless", f"stored row {seq} holds an event with seq {env.seq}", seq=seq)
            out.append(env)
        if not open_:
            return out
        sealer = self.sealer
        if sealer is None and any(e.sealed is not None for e in out):
            sealer = self._keys_beside()
        return opened(f"event log {self.path}", session_id, sealer, out)

    def _keys_beside(self) -> Sealer:
        """A data directory holds its keys beside its log (``keys.sqlite3``): a log opened without a sealer opens
        sealed content with them, read-only (a missing file: KeyMissing)."""
        if self._beside is None:
            from .sealing import ContentSealer
            from .sqlite_keys import KEYS_NAME, SqliteKeyStore

            self._beside = ContentSealer(SqliteKeyStore(self.path.parent / KEYS_NAME, read_only=True), seal_new=False)
        return self._beside

    # -------------------------------------------------------------- erasure

    def seal_in_place(self, session_id: str) -> int:
        """Rewrite the session's unsealed events that hold content as sealed rows (one transaction), with
        ``secure_delete`` on, so the old bytes are overwritten on their pages; :meth:`scrub` then leaves no copy
        in the write-ahead log or free pages. Needs a sealer (its key store)."""
        self._writable(f"sealing session {session_id!r} in place")
        if self.sealer is None:
            raise StoreUnavailable(f"event log {self.path}: sealing needs the key store (open it with its config)")
        sealer = self.sealer
        with self._lock:
            db = self._db
            try:
                rows = db.execute(
                    "SELECT seq, body FROM events WHERE session_id=? ORDER BY seq", (session_id,)
                ).fetchall()
                plain = [decode_event(bytes(body)) for _, body in rows]
                todo = [e for e in plain if e.sealed is None and has_content(type(e.data))]
                if not todo:
                    return 0
                sealed = sealer.seal(session_id, todo, always=True)  # the key exists before the rows change
                changed = [
                    (encode_event(s), session_id, s.seq) for p, s in zip(todo, sealed, strict=True) if s is not p
                ]
                db.execute("PRAGMA secure_delete=ON")
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany("UPDATE events SET body=? WHERE session_id=? AND seq=?", changed)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._translated(exc, f"sealing session {session_id!r} in place") from exc
            finally:
                self._rules.forget(session_id)
        return len(changed)

    def scrub(self) -> None:
        """Copy the write-ahead log back and truncate it, then rebuild the file without free pages (VACUUM, with
        ``secure_delete`` on): no earlier version of a rewritten row is left in ``log.sqlite3`` or its ``-wal``."""
        if self.read_only:
            return
        with self._lock:
            db = self._db
            try:
                db.execute("PRAGMA secure_delete=ON")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                db.execute("VACUUM")
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise self._translated(exc, "scrubbing the log file") from exc


def _check_format(path: Path, version: str) -> None:
    if version != str(SESSION_FORMAT_VERSION):
        raise FormatError(
            "format-version",
            f"{path} holds session format {version}; this foldline reads format {SESSION_FORMAT_VERSION}",
        )


class _Checkpointer:
    """A daemon thread that runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval_s`` on its own connection."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self._path = path
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"foldline-wal-checkpoint:{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Any failure here (busy, a full disk, a damaged file) only delays checkpoints: the WAL keeps every
        # commit meanwhile, and the writer's own connection reports what is wrong on its next call.
        try:
            db = sqlite3.connect(str(self._path), timeout=1.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(self._interval):
                self._checkpoint(db)
            self._checkpoint(db)
        finally:
            db.close()

    @staticmethod
    def _checkpoint(db: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
