"""Where ``foldline demo`` may write and what it may clear: never anything foldline did not create.

A demo run takes its data directory with :func:`demo_data_dir`:

* **One demo at a time.** It holds an exclusive lock (``flock`` on ``.foldline-demo.lock`` in the data
  directory) for the whole run; a second demo on the same directory fails at once with
  :class:`~foldline.errors.StoreBusy`, before it touches anything, so concurrent demos cannot destroy each
  other's work.
* **A fresh run (``--fresh``, the default) starts from an empty directory.** A missing or empty directory
  is created and marked as the demo's (``.foldline-demo``). A directory the demo marked earlier is cleared
  of exactly the files the demo writes — the SQLite log (``log.sqlite3`` and its ``-wal``/``-shm``), its key
  store (``keys.sqlite3``: the demo sessions' content keys, docs/ERASURE.md), the attachment objects
  (``attachments/objects/<2 hex>/<64 hex>`` and their ``.meta.json``) and the worker logs (``logs/*.log``) —
  and only when its log holds nothing but demo sessions and no other process has it open; every other file
  stays. Any other non-empty directory is refused with :class:`~foldline.errors.ConfigError`: it is not the
  demo's to clear.
* **``--keep``** adds the demo's sessions to whatever log the directory holds and deletes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from .errors import ConfigError, StoreBusy

__all__ = ["DEMO_SESSION_RE", "LOCK_NAME", "MARKER_NAME", "demo_data_dir"]

MARKER_NAME = ".foldline-demo"
LOCK_NAME = ".foldline-demo.lock"
#: The ids the demo writes: demo-000 …, demo-think, demo-responses, and demo-NNN.K for a fork made again on a
#: persistent log.
DEMO_SESSION_RE = re.compile(r"^demo-[a-z0-9]+(\.\d+)?$")
_MARKER_TEXT = (
    "This directory was created by `foldline demo`. A fresh demo run may clear the files the demo writes here\n"
    "(log.sqlite3*, keys.sqlite3*, attachments/objects/, logs/*.log) while its log holds only demo sessions;\n"
    "nothing else.\n"
)
_DB_FILES = (
    "log.sqlite3",
    "log.sqlite3-wal",
    "log.sqlite3-shm",
    "log.sqlite3-journal",
    "keys.sqlite3",
    "keys.sqlite3-journal",
)
_OBJECT_RE = re.compile(r"^[0-9a-f]{64}(\.meta\.json)?$|^\.tmp-")


@contextlib.contextmanager
def demo_data_dir(data_dir: Path, *, fresh: bool, embedded: bool = True) -> Iterator[None]:
    """Hold ``data_dir`` for one demo run (see the module docstring); ``embedded``: the log lives there."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"the data directory {data_dir} is a file, not a directory; pass another --data-dir")
    state = _state(data_dir)
    if fresh and state == "foreign":
        raise ConfigError(
            f"the data directory {data_dir} is not empty and no foldline demo created it, so the demo will not "
            "clear it; pass a new or empty --data-dir, or --keep to add the demo's sessions to the log there"
        )
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot use the data directory {data_dir}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(lock_fd, 64, 0).decode(errors="replace").strip()
            raise StoreBusy(
                f"another foldline demo{f' (pid {holder})' if holder.isdigit() else ''} is running in {data_dir}; "
                "wait for it to finish, or pass another --data-dir"
            ) from None
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, str(os.getpid()).encode(), 0)
        if state in ("missing", "empty"):
            (data_dir / MARKER_NAME).write_text(_MARKER_TEXT, encoding="utf-8")
        elif fresh and state == "demo" and embedded:
            _clear(data_dir)
        yield
    finally:
        os.close(lock_fd)  # releases the lock; the lock file stays (removing it would race a waiting run)


def _state(data_dir: Path) -> str:
    """``missing``, ``empty`` (nothing, or only the lock file), ``demo`` (marked) or ``foreign``."""
    if not data_dir.exists():
        return "missing"
    if (data_dir / MARKER_NAME).is_file():
        return "demo"
    try:
        names = {p.name for p in data_dir.iterdir()}
    except OSError as exc:
        raise ConfigError(f"cannot read the data directory {data_dir}: {exc.strerror or exc}") from exc
    return "empty" if names <= {LOCK_NAME} else "foreign"


def _clear(data_dir: Path) -> None:
    """Remove the files an earlier demo run wrote in ``data_dir`` (held under the lock)."""
    db = data_dir / "log.sqlite3"
    if db.exists():
        _check_demo_log(db)
    for name in _DB_FILES:
        with contextlib.suppress(FileNotFoundError):
            (data_dir / name).unlink()
    objects = data_dir / "attachments" / "objects"
    if objects.is_dir():
        for shard in objects.iterdir():
            if shard.is_dir() and re.fullmatch(r"[0-9a-f]{2}", shard.name):
                for obj in shard.iterdir():
                    if obj.is_file() and _OBJECT_RE.match(obj.name):
                        obj.unlink()
                with contextlib.suppress(OSError):
                    shard.rmdir()  # only when empty
        for d in (objects, objects.parent):
            with contextlib.suppress(OSError):
                d.rmdir()
    logs = data_dir / "logs"
    if logs.is_dir():
        for log in logs.glob("*.log"):
            if log.is_file():
                log.unlink()
        with contextlib.suppress(OSError):
            logs.rmdir()


def _check_demo_log(db: Path) -> None:
    """Refuse to clear a log that holds more than demo sessions, or that another process has open."""
    try:
        conn = sqlite3.connect(str(db), timeout=0.5, isolation_level=None)
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot open {db} to check it before a fresh demo run: {exc}") from exc
    try:
        try:
            ids = [str(r[0]) for r in conn.execute("SELECT id FROM sessions WHERE head > 0")]
        except sqlite3.Error as exc:
            raise ConfigError(
                f"{db} is not a log the demo wrote ({exc}); move it away, or pass --keep or another --data-dir"
            ) from exc
        others = [sid for sid in ids if not DEMO_SESSION_RE.match(sid)]
        if others:
            shown = ", ".join(repr(s[:40]) for s in others[:3]) + (" …" if len(others) > 3 else "")
            raise ConfigError(
                f"the demo's log {db} now also holds {len(others)} session(s) the demo did not write ({shown}), so a "
                "fresh run will not clear it; pass --keep to add to it, or another --data-dir"
            )
        try:
            # leaving WAL mode needs the only connection to the file: another open connection means
            # another foldline process is using this log right now
            mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        except sqlite3.Error:
            mode = "wal"
        if str(mode).lower() == "wal":
            raise StoreBusy(
                f"the demo's log {db} is open in another process; stop it before a fresh demo run, or pass --keep"
            )
    finally:
        conn.close()
