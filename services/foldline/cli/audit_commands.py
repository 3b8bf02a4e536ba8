"""Commands that audit a log: verify, requests, drops, diff — from the log alone, nothing is sent.

* ``verify`` rebuilds every loop request and proves it against the digest recorded at dispatch;
* ``requests`` prints the exact rebuilt wire bodies;
* ``drops`` lists every cache-read drop and its cause;
* ``diff`` lists the header snapshots with their field-level differences.
"""

from __future__ import annotations

import sys
from typing import Annotated

import orjson
import typer
from rich.table import Table

from ..core.diff import snapshot_diffs
from ..core.drops import DROP_CAUSES, Drop, session_drops
from ..core.fork import lineage
from ..errors import SessionNotFound
from ..replay.verify import VerifyReport, rebuild_requests, verify_events
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, read_session, stores_for
from .output import console, diff_lines, fail_on_errors

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("verify")(fail_on_errors(verify))
    app.command("requests")(fail_on_errors(requests))
    app.command("drops")(fail_on_errors(drops))
    app.command("diff")(fail_on_errors(diff))


def verify(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to verify (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Rebuild every loop request from the log and compare it with the digest recorded at dispatch."""
    with stores_for(config_for(data_dir, backend)) as stores:
        ids = sessions or stores.log.sessions()
        report = VerifyReport()
        for sid in ids:
            events = stores.log.read(sid)
            if not events:
                raise SessionNotFound(sid)
            report.merge(verify_events(sid, events, stores.attachments))
    if json:
        sys.stdout.write(orjson.dumps(report.to_json()).decode() + "\n")
    else:
        for m in report.mismatched:
            where = (
                f"first differing byte at offset {m.first_diff_offset}"
                if m.first_diff_offset is not None
                else ("original body not archived, offset unknown")
            )
            console.print(
                f"[red]MISMATCH[/] {m.session} turn {m.turn} step {m.step} (seq {m.seq}): "
                f"recorded {m.recorded[:19]}… rebuilt {m.rebuilt[:19]}…; {where}"
            )
        for u in report.unreconstructable:
            console.print(
                f"[yellow]UNRECONSTRUCTABLE[/] {u.session} turn {u.turn} step {u.step} (seq {u.seq}): {u.reason}"
            )
        colour = "green" if report.ok else "red"
        retried = f", {report.retries} failed attempt(s) resent the same bytes" if report.retries else ""
        console.print(
            f"[{colour}]verified {report.matched}/{report.checked} requests across {len(ids)} session(s)[/]"
            f" — {len(report.mismatched)} mismatched, {len(report.unreconstructable)} unreconstructable{retried}"
        )
    if not report.ok:
        raise typer.Exit(1)


def requests(
    session: Annotated[str, typer.Argument(help="Session id.")],
    step: Annotated[int | None, typer.Option("--step", help="Only the N-th request of the session (0-based).")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Re-serialize for anthropic | openai instead of the recorded one.")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Print the exact reconstructed wire body of each loop request (one per line)."""
    from ..providers.base import Serializer, serializer_for
    from ..providers.registry import ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1

    chosen: dict[str, Serializer] = {"anthropic": ANTHROPIC_MESSAGES_V1, "openai": OPENAI_CHAT_V1}
    if provider is not None and provider not in chosen:
        raise typer.BadParameter("--provider must be anthropic or openai")
    with stores_for(config_for(data_dir, backend)) as stores:
        events = stores.log.read(session)
        if not events:
            raise SessionNotFound(session)
        rebuilt = list(rebuild_requests(session, events))
        if step is not None:
            if not 0 <= step < len(rebuilt):
                raise typer.BadParameter(f"--step must be within 0..{len(rebuilt) - 1} for this session")
            rebuilt = [rebuilt[step]]
        out = sys.stdout.buffer
        for dispatch, _seq, request in rebuilt:
            ser = chosen[provider] if provider else serializer_for(dispatch.serializer, dispatch.serializer_version)
            out.write(ser.serialize(request, stores.attachments) + b"\n")
        out.flush()


def diff(
    session: Annotated[str, typer.Argument(help="Session id.")],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """List a session's header snapshots (seq, reason) with a field-level diff to the one before."""
    with stores_for(config_for(data_dir, backend)) as stores:
        events = read_session(stores.log, session)
    diffs = snapshot_diffs(events)
    seed = lineage(events)
    if json:
        out = {
            "session": session,
            "lineage": {"parentId": seed.parent_id, "seedLength": seed.seed_length} if seed else None,
            "snapshots": [{"seq": s.seq, "reason": s.reason, "diff": d.to_json()} for s, d in diffs],
        }
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
        return
    if seed is not None:
        console.print(f"fork of [bold]{seed.parent_id}[/]: the first {seed.seed_length} events are its prefix")
    table = Table(title=f"header snapshots of {session}")
    table.add_column("seq", justify="right")
    table.add_column("reason")
    table.add_column("difference to the previous snapshot", overflow="fold")
    for snap, d in diffs:
        table.add_row(str(snap.seq), snap.reason, "\n".join(diff_lines(d)) if snap is not diffs[0][0] else "(first)")
    console.print(table)


def drops(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to classify (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
    unexplained: Annotated[
        bool, typer.Option("--unexplained", help="List only the drops the log does not explain.")
    ] = False,
    fail_on_unexplained: Annotated[
        bool, typer.Option("--fail-on-unexplained", help="Exit with status 1 when any drop is unexplained.")
    ] = False,
) -> None:
    """List every step whose cache-read tokens dropped against the previous request, with its cause.

    Causes: first-request, header-change, resume, compaction, trim, cache-ttl, or unexplained
    (docs/METRICS.md defines a drop and each cause).
    """
    found: list[Drop] = []
    with stores_for(config_for(data_dir, backend)) as stores:
        ids = sessions or stores.log.sessions()
        for sid in ids:
            events = stores.log.read(sid)
            if not events:
                raise SessionNotFound(sid)
            found.extend(session_drops(sid, events))
    counts = {cause: sum(1 for d in found if d.cause == cause) for cause in DROP_CAUSES}
    listed = [d for d in found if not d.explained] if unexplained else found
    if json:
        out = {"sessions": len(ids), "counts": counts, "drops": [d.to_json() for d in listed]}
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        table = Table(title=f"cache-read drops in {len(ids)} session(s)")
        table.add_column("session")
        for col in ("seq", "turn.step", "read", "baseline", "gap s"):
            table.add_column(col, justify="right")
        table.add_column("cause")
        for d in listed:
            s = d.step
            colour = "red" if not d.explained else "green"
            table.add_row(
                d.session_id,
                str(s.dispatch_seq),
                f"{s.turn}.{s.step}",
                str(s.usage.cache_read),
                str(d.baseline_tokens),
                "" if d.gap_seconds is None else f"{d.gap_seconds:.1f}",
                f"[{colour}]{', '.join(d.causes)}[/]",
            )
        console.print(table)
        for d in listed:
            if not d.explained:
                prev = d.previous.message_id if d.previous else None
                console.print(
                    f"[red]unexplained[/] {d.session_id} seq {d.step.dispatch_seq}: provider request "
                    f"{d.step.request_id or 'unknown'}, message {d.step.message_id or 'unknown'} "
                    f"(previous message {prev or 'unknown'})"
                )
        summary = ", ".join(f"{cause} {n}" for cause, n in counts.items() if n)
        console.print(f"{len(found)} drop(s){': ' + summary if summary else ''}")
    if fail_on_unexplained and counts["unexplained"]:
        raise typer.Exit(1)
