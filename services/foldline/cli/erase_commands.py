"""``foldline erase`` and ``foldline erasures``: destroy a session's (or a subject's) content, and list what was.

``erase`` runs :func:`foldline.erasure.erase_sessions` against the configured stores: the data keys are
destroyed, the folds, archived request bodies, attachments and export files made of the content are removed,
and the erasure is recorded (docs/ERASURE.md). Run again after an interruption, it completes what was begun;
run on a session erased already, it says so. ``erasures`` lists the erasure records of the key store.

Exit status: 0 the content is erased (now or before); 2 an error (one line on stderr), e.g. an unknown
session (NothingToErase), a lost key (KeyMissing) or content the log cannot erase (NotErasable).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.table import Table

from ..errors import ConfigError
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, session_ids, stores_for
from .output import console, err_console, fail_on_errors, line, literal, write_json

__all__ = ["register"]

EXIT_CODES = "Exit status: 0 the content is erased (now, or it was already); 2 an error (one line on stderr)."
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_STEPS = {
    "reading": "reading the session(s)",
    "sessions": "erasing",
    "references": "checking other sessions' references",
}


def register(app: typer.Typer) -> None:
    app.command("erase", epilog=EXIT_CODES)(fail_on_errors(erase))
    app.command("erasures", epilog="Exit status: 0 ok; 2 an error (one line on stderr).")(fail_on_errors(erasures))


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """Progress of the long steps on stderr when it is a terminal; ``tell(step, done, total)``."""
    if not err_console.is_terminal:
        yield lambda _step, _done, _total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console
    ) as progress:
        tasks: dict[str, TaskID] = {}

        def tell(step: str, done: int, total: int) -> None:
            task = tasks.get(step)
            if task is None:
                task = tasks[step] = progress.add_task(_STEPS.get(step, step), total=total or None)
            progress.update(task, completed=done, total=total or None)

        yield tell


def erase(
    session: Annotated[str | None, typer.Argument(help="The session to erase.", show_default=False)] = None,
    subject: Annotated[
        str | None,
        typer.Option("--subject", help="Erase every session bound to this subject id instead.", show_default=False),
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (kept in the erasure record and the session's log).")
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Who asks (default: the user and host running the command).")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Erase a session's content, or every session of a subject: destroy the data key(s) everywhere and purge
    what was derived from the content; the structure (seqs, types, ids, usage, digests) stays.

    A running loop on the session stops at its next append (ContentErased); processes that cached the key can
    read it for at most FOLDLINE_KEY_CACHE_TTL seconds more. Interrupted, run it again: it completes.
    """
    from ..config.factories import session_archive
    from ..erasure import erase_sessions

    if (session is None) == (subject is None):
        raise typer.BadParameter("name a SESSION or --subject ID (one of them)")
    if session is not None:
        session_ids(session)
    if subject is not None and not subject.strip():
        raise typer.BadParameter("--subject must not be empty")
    if reason is not None and len(reason.encode()) > 4096:
        raise ConfigError("--reason is longer than 4096 bytes; keep it short (it is logged in the clear)")
    config = config_for(data_dir, backend)
    # the embedded log is sealed in place when it holds content logged unsealed; its archive cannot be, so the
    # erasure looks there first (the Kafka log reads its archive itself)
    archive = session_archive(config) if config.backend == "embedded" else None
    try:
        with stores_for(config) as stores, _progress() as tell:
            outcome = erase_sessions(
                stores, session=session, subject=subject, by=by, reason=reason, progress=tell, archive=archive
            )
    finally:
        if archive is not None:
            archive.close()
    record = outcome.record
    if json:
        write_json(outcome.to_json())
        return
    what = f"session {session!r}" if session is not None else f"{len(record.sessions)} session(s) of the subject"
    if outcome.already:
        console.print(
            line(
                ("already erased:", "bold cyan"),
                f" {what} — by {record.by} at {_iso(record.done_ms)} ({record.erasure_id})",
            )
        )
        return
    resumed = " (an interrupted erasure, completed)" if outcome.resumed else ""
    console.print(line(("erased:", "bold green"), f" {what} — {record.erasure_id}{resumed}"))
    console.print(
        literal(
            f"  keys destroyed {outcome.keys_destroyed}, folds erased {outcome.folds_erased}, objects removed "
            f"{len(outcome.objects_removed)} (kept, still referenced elsewhere: {len(outcome.objects_kept)}), "
            f"export files removed {len(outcome.exports_removed)}, inbox entries removed {len(outcome.inbox_removed)}"
        )
    )
    if outcome.sealed_in_place:
        console.print(literal(f"  {outcome.sealed_in_place} event(s) logged unsealed were sealed in place first"))
    for where in outcome.exports_elsewhere:
        err_console.print(
            line(("note:", "yellow"), f" an export of the session was written on another host: {where}; remove it")
        )


def erasures(data_dir: DataDirOpt = None, backend: BackendOpt = None, json: JsonOpt = False) -> None:
    """List the erasure records of the key store: when, by whom, why, which sessions, what was removed."""
    from ..config.factories import key_store

    config = config_for(data_dir, backend)
    keys = key_store(config, read_only=True)
    try:
        records = keys.erasures()
    finally:
        keys.close()
    if json:
        write_json({"erasures": [r.to_json() for r in records]})
        return
    table = Table(title=f"{len(records)} erasure(s)")
    for column in ("erasure", "state", "requested", "by", "scope", "sessions", "reason"):
        table.add_column(column)
    for r in records:
        table.add_row(
            literal(r.erasure_id),
            r.state,
            _iso(r.requested_ms),
            literal(r.by),
            r.scope,
            literal(", ".join(r.sessions)),
            literal(r.reason or ""),
        )
    console.print(table)
