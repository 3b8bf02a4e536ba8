"""``foldline sessions | export | import``: list, export and import session logs.

The data directory is ``--data-dir``, else ``$FOLDLINE_DATA_DIR``, else ``./foldline-data``.

Exit status: 0 on success; 2 on any reported error — a usage error, a foldline error (unknown or
existing session, a bad export line, an unavailable store) or a file that cannot be read or written —
with one line on stderr and nothing written; 1 only for an unexpected crash (a bug: please report it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..config import Config
from ..core import codec
from ..export import export_session, import_session
from .common import BackendOpt, DataDirOpt, JsonOpt, console, err_console, fail_on_errors, stores_for

__all__ = ["register"]

EXIT_CODES = "Exit status: 0 ok; 2 error (one line on stderr, nothing written)."


def _fail_io(what: str, exc: OSError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(what)}: {escape(str(exc.strerror or exc))}", soft_wrap=True)
    return typer.Exit(2)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@fail_on_errors
def sessions_cmd(data_dir: DataDirOpt = None, backend: BackendOpt = "embedded", as_json: JsonOpt = False) -> None:
    """List the sessions of the log: id, event count and the time of the last event."""
    rows: list[dict[str, Any]] = []
    config = Config.from_env(data_dir, backend)
    if config.backend != "embedded" or config.data_dir.exists():  # do not create a data dir just to list it
        with stores_for(data_dir, backend) as stores:
            for sid in stores.log.sessions():
                head = stores.log.head(sid)
                last = stores.log.read(sid, head - 1, head)
                last_ms = last[0].time if last else None
                rows.append(
                    {
                        "id": sid,
                        "events": head,
                        "lastEventTime": last_ms,
                        "lastEventAt": None if last_ms is None else _iso(last_ms),
                    }
                )
    if as_json:
        sys.stdout.write(codec.canonical_json(rows).decode() + "\n")
        return
    if not rows:
        console.print(
            f"no sessions in {config.data_dir}" if config.backend == "embedded" else "no sessions", markup=False
        )
        return
    table = Table(title=Text(f"sessions in {config.data_dir}" if config.backend == "embedded" else "sessions"))
    table.add_column("session")
    table.add_column("events", justify="right")
    table.add_column("last event (UTC)")
    for row in rows:
        table.add_row(Text(row["id"]), f"{row['events']:,}", row["lastEventAt"] or "-")
    console.print(table)


@contextlib.contextmanager
def _atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A file at ``path`` that appears only if the block succeeds (temp file + rename)."""
    target = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fp:
            yield fp
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@fail_on_errors
def export_cmd(
    session: Annotated[str, typer.Argument(help="The session id to export.", show_default=False)],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="File to write (JSON Lines); '-' writes to stdout.", show_default=False),
    ],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
) -> None:
    """Write one session as JSON Lines: a header line, then one canonical event per line (docs/FORMAT.md)."""
    with stores_for(data_dir, backend) as stores:
        if str(out) == "-":
            summary = export_session(stores.log, session, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            err_console.print(
                f"exported {summary.events:,} events of {summary.session_id!r} ({summary.digest})",
                soft_wrap=True,
                markup=False,
            )
            return
        try:
            with _atomic_output(out) as fp:
                summary = export_session(stores.log, session, fp)
        except OSError as exc:
            raise _fail_io(f"cannot write {out}", exc) from exc
    console.print(
        f"exported {summary.events:,} events of {summary.session_id!r} to {out} ({summary.digest})",
        soft_wrap=True,
        markup=False,
    )


@fail_on_errors
def import_cmd(
    file: Annotated[Path, typer.Argument(help="An export file; '-' reads stdin.", show_default=False)],
    as_id: Annotated[
        str | None, typer.Option("--as", help="Import under this new session id instead of the file's.")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
) -> None:
    """Validate an export completely, then append it as one new session — or write nothing."""
    with stores_for(data_dir, backend) as stores:
        if str(file) == "-":
            summary = import_session(stores.log, sys.stdin.buffer, as_id)
        else:
            try:
                fp = file.open("rb")
            except OSError as exc:
                raise _fail_io(f"cannot read {file}", exc) from exc
            with fp:
                summary = import_session(stores.log, fp, as_id)
    console.print(
        f"imported {summary.events:,} events as session {summary.session_id!r} ({summary.digest})",
        soft_wrap=True,
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``sessions``, ``export`` and ``import`` to the ``foldline`` app."""
    app.command("sessions", epilog=EXIT_CODES)(sessions_cmd)
    app.command("export", epilog=EXIT_CODES)(export_cmd)
    app.command("import", epilog=EXIT_CODES)(import_cmd)
