"""Commands of paused turns and the durable inbox: list pending approvals, decide one, inject a message.

* ``approvals`` lists every pending approval across sessions (or of the sessions named): session, call, tool, its
  arguments, and — once decided — the decision waiting in the inbox for the session's loop. It only reads.
* ``approve SESSION CALL_ID --allow|--deny`` records a decision from this process: it never writes the session's
  log, it puts the decision into the session's durable inbox (docs/LOOP.md, "Approvals"); the session's loop takes
  it — a loop waiting on it at once, else ``foldline resume SESSION``.
* ``inject SESSION TEXT`` puts a message into the session's inbox the same way, for its next step.

Exit status: 0 done; 2 an error (one line on stderr, nothing recorded): an unknown session
(``SessionNotFound``), a call that is not pending (``ApprovalNotPending``), a call decided already
(``AlreadyDecided``), a read-only data directory (``WriteNotAllowed``), arguments that are not a JSON object
(``InputError``).
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from ..config import Config, Stores
from ..config.factories import check_data_dir
from ..core.inbox import InboxDecision, InboxEntry
from ..core.pauses import PendingApproval
from ..errors import InputError, StoreUnavailable
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, session_ids, stores_for
from .output import console, fail_on_errors, line, literal, write_json

__all__ = ["register"]

_T = TypeVar("_T")
EXIT_CODES = "Exit status: 0 ok; 2 error (one line on stderr, nothing recorded)."


def register(app: typer.Typer) -> None:
    app.command("approvals", epilog=EXIT_CODES)(fail_on_errors(approvals))
    app.command("approve", epilog=EXIT_CODES)(fail_on_errors(approve))
    app.command("inject", epilog=EXIT_CODES)(fail_on_errors(inject_cmd))


def _iso(ms: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)).isoformat(timespec="seconds")


def _decision_json(entry: InboxEntry | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    item = entry.item
    assert isinstance(item, InboxDecision)
    return {
        "entry": entry.id,
        "verdict": item.verdict,
        "reason": item.reason,
        "arguments": item.arguments,
        "decidedBy": item.decided_by,
        "decidedAt": entry.time,
    }


def approvals(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to look at (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """List the pending approvals: tool calls a paused turn waits on, with the decision once one is made.

    A decided call stays listed until the session's loop takes the decision into its log (`foldline resume`).
    """
    from ..loop.approvals import pending

    session_ids(*(sessions or ()))
    config = config_for(data_dir, backend)
    found: list[tuple[PendingApproval, InboxEntry | None]] = []
    if config.backend != "embedded" or config.data_dir.exists():  # do not create a data dir just to list it
        with stores_for(config, read_only=True) as stores:
            found = pending(stores.log, sessions or None)
    if json:
        write_json(
            [
                {**p.to_json(), "requestedAtIso": _iso(p.requested_at), "decision": _decision_json(entry)}
                for p, entry in found
            ],
            canonical=True,
        )
        return
    if not found:
        console.print(literal("no pending approvals"))
        return
    table = Table(title=literal(f"{len(found)} pending approval(s)"))
    for col in ("session", "call", "tool", "arguments", "requested (UTC)", "decision"):
        table.add_column(col)
    for p, entry in found:
        args = p.arguments if len(p.arguments) <= 60 else p.arguments[:57] + "…"
        if entry is None:
            verdict = "awaiting decision"
        else:
            assert isinstance(entry.item, InboxDecision)
            verdict = f"{entry.item.verdict} (waiting for the session's loop: foldline resume {p.session_id})"
        table.add_row(
            literal(p.session_id),
            literal(p.call_id),
            literal(p.name),
            literal(args),
            _iso(p.requested_at),
            literal(verdict),
        )
    console.print(table)


def _read_arguments(arguments: str | None, arguments_file: Path | None) -> str | None:
    from ..loop.approvals import parse_arguments

    if arguments is not None and arguments_file is not None:
        raise InputError("give the changed arguments once: --arguments JSON or --arguments-file FILE")
    if arguments_file is not None:
        try:
            text = arguments_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read --arguments-file {arguments_file}: {exc.strerror or exc}") from exc
        return parse_arguments(text, f"--arguments-file {arguments_file}")
    if arguments is not None:
        return parse_arguments(arguments)
    return None


def approve(
    session: Annotated[str, typer.Argument(help="Session id.", show_default=False)],
    call_id: Annotated[str, typer.Argument(help="The tool call's id (`foldline approvals` lists them).")],
    allow: Annotated[bool, typer.Option("--allow", help="Let the call run.")] = False,
    deny: Annotated[bool, typer.Option("--deny", help="Do not run it: the model gets an error result.")] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (a denial's reason reaches the model).", show_default=False)
    ] = None,
    arguments: Annotated[
        str | None,
        typer.Option("--arguments", help="Allow it with these arguments instead (a JSON object).", show_default=False),
    ] = None,
    arguments_file: Annotated[
        Path | None,
        typer.Option("--arguments-file", help="The same, read from a file.", show_default=False),
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Who decides [default: user@host].", show_default=False)
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Decide a pending approval: --allow (optionally with --arguments) or --deny [--reason TEXT].

    The decision goes into the session's durable inbox, never straight into its log: the session's loop takes it
    (a loop waiting on it at once, else `foldline resume SESSION`) and continues the turn.
    """
    from ..loop.approvals import decide

    session_ids(session)
    if allow == deny:
        raise InputError("give exactly one of --allow or --deny")
    changed = _read_arguments(arguments, arguments_file)
    if changed is not None and deny:
        raise InputError("a denial carries no arguments: give --arguments only with --allow")
    who = by if by is not None else _who()
    config = config_for(data_dir, backend)
    if config.backend == "embedded":
        check_data_dir(config, read_only=True)  # a missing data directory is an error, not a new empty log
    entry = _writing(
        config,
        lambda stores: decide(stores.log, session, call_id, allow=allow, reason=reason, arguments=changed, by=who),
    )
    out = {
        "session": session,
        "callId": call_id,
        "verdict": "allow" if allow else "deny",
        "entry": entry.id,
        "reason": reason,
        "arguments": changed,
        "decidedBy": who,
        "next": f"foldline resume {session}",
    }
    if json:
        write_json(out)
        return
    verdict = ("allowed", "green") if allow else ("denied", "red")
    changed_note = f" with arguments {changed}" if changed is not None else ""
    console.print(line(verdict, f" call {call_id} of {session}{changed_note} (inbox entry {entry.id})"))
    console.print(
        literal(
            f"the session's loop takes it from its inbox: a loop waiting on it now, else `foldline resume {session}`"
        )
    )


def _writing(config: Config, record: Callable[[Stores], _T]) -> _T:
    """``record(stores)`` on stores opened for writing — or, on a data directory this process cannot write, on
    stores opened read-only: the call still says what is wrong with the session or call, else that it may not
    write (``WriteNotAllowed``)."""
    try:
        with stores_for(config) as stores:
            return record(stores)
    except StoreUnavailable as exc:
        if config.backend != "embedded" or not ("read-only" in str(exc) or "readonly" in str(exc)):
            raise
    with stores_for(config, read_only=True) as read_only:
        return record(read_only)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def inject_cmd(
    session: Annotated[str, typer.Argument(help="Session id.", show_default=False)],
    text: Annotated[str, typer.Argument(help="The message.", show_default=False)],
    source: Annotated[str, typer.Option("--source", help="Who enters it (the user/message's source).")] = "inject",
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Put a message into a session's durable inbox for its next step (its loop claims it; never written here)."""
    from ..loop.inbox import inject

    session_ids(session)
    config = config_for(data_dir, backend)
    if config.backend == "embedded":
        check_data_dir(config, read_only=True)
    entry_id = _writing(config, lambda stores: inject(stores.log, session, text, source=source))
    if json:
        write_json({"session": session, "entry": entry_id, "source": source})
        return
    console.print(literal(f"put into the inbox of {session} (entry {entry_id}); its next step enters it"))
