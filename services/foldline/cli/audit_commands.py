"""Commands that audit a log: verify, requests, drops, diff — from the log alone, nothing is sent or written.

* ``verify`` rebuilds every loop request and proves it against the digest recorded at dispatch;
* ``requests`` prints the exact rebuilt wire bodies;
* ``drops`` lists every cache-read drop and its cause;
* ``diff`` lists the header snapshots with their field-level differences.

They open the stores read-only: a missing data directory is an error (never created), and a read-only
data directory or copy serves.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.table import Table
from rich.text import Text

from ..config.prices import load_price_table
from ..core import codec
from ..core.cost import PricedStep, drop_key, price_step
from ..core.diff import snapshot_diffs
from ..core.drops import DROP_CAUSES, Drop, classify_session
from ..core.events import Envelope
from ..core.fork import lineage
from ..core.sealing import erased_view
from ..errors import SessionNotFound
from .cost_commands import amount_json, money
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, read_session, session_ids, stores_for
from .output import console, diff_lines, err_console, fail_on_errors, json_safe, line, literal, write_json

if TYPE_CHECKING:
    from ..replay.verify import VerifyReport, VerifyStatus

__all__ = ["VERIFY_EXIT_CODES", "register"]

VERIFY_EXIT_CODES = (
    "Exit status: 0 every request of every session verified; 1 a request differs from its recorded digest; "
    "3 a request could not be rebuilt (unreconstructable); 5 a session's content was erased (its requests "
    "cannot be rebuilt, by design); 4 nothing could be verified (no sessions, or a session without "
    "request/dispatch records); 2 an error (one line on stderr). The worst outcome wins, in the order "
    "1, 3, 5, 4, 0."
)


def register(app: typer.Typer) -> None:
    app.command("verify", epilog=VERIFY_EXIT_CODES)(fail_on_errors(verify))
    app.command("requests")(fail_on_errors(requests))
    app.command("drops")(fail_on_errors(drops))
    app.command("diff")(fail_on_errors(diff))


_ORDER: tuple[VerifyStatus, ...] = ("verified", "not-verifiable", "erased", "unreconstructable", "mismatched")


def verify(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to verify (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Rebuild every loop request from the log and compare it with the digest recorded at dispatch.

    Each session is verified (every request matches), mismatched, unreconstructable (a request cannot be
    rebuilt, e.g. an attachment is missing), erased (its content key was destroyed: `foldline erase`) or not
    verifiable (it has no request/dispatch records, so there is nothing to prove); a run that checks nothing
    at all is not verifiable either.
    """
    from ..replay.verify import VERIFY_EXIT_STATUS, VerifyReport, verify_events

    session_ids(*(sessions or ()))
    report = VerifyReport()
    per_session: list[tuple[str, VerifyReport]] = []
    with stores_for(config_for(data_dir, backend), read_only=True) as stores:
        ids = sessions or stores.log.sessions()
        for sid in ids:
            events = stores.log.read(sid)
            if not events:
                raise SessionNotFound(sid)
            one = verify_events(sid, events, stores.attachments, read=stores.log.read)
            per_session.append((sid, one))
            report.merge(one)
    statuses = [one.status for _, one in per_session] or ["not-verifiable"]
    status = max(statuses, key=_ORDER.index)
    if json:
        out = {
            **report.to_json(),
            "status": status,
            "sessions": [
                {"id": sid, "status": one.status, "checked": one.checked, "matched": one.matched}
                for sid, one in per_session
            ],
        }
        write_json(out)  # the report's fields first, as they always were
    else:
        for m in report.mismatched:
            where = (
                f"first differing byte at offset {m.first_diff_offset}"
                if m.first_diff_offset is not None
                else "original body not archived, offset unknown"
            )
            console.print(
                line(
                    ("MISMATCH", "red"),
                    f" {m.session} turn {m.turn} step {m.step} (seq {m.seq}): "
                    f"recorded {m.recorded[:19]}… rebuilt {m.rebuilt[:19]}…; {where}",
                )
            )
        for u in report.unreconstructable:
            console.print(
                line(
                    ("UNRECONSTRUCTABLE", "yellow"),
                    f" {u.session} turn {u.turn} step {u.step} (seq {u.seq}): {u.reason}",
                )
            )
        for sid, one in per_session:
            if one.status == "not-verifiable":
                console.print(
                    line(("NOT VERIFIABLE", "yellow"), f" {sid}: no request/dispatch records, so nothing to prove")
                )
            elif one.status == "erased":
                console.print(
                    line(
                        ("ERASED", "cyan"),
                        f" {sid}: its content was erased; {one.erased_dispatches} request/dispatch digest(s) kept, "
                        "none can be rebuilt (`foldline erasures` says when and why)",
                    )
                )
        unverifiable = sum(1 for _, one in per_session if one.status == "not-verifiable")
        erased = f", {len(report.erased)} session(s) erased" if report.erased else ""
        colour = "green" if status == "verified" else "red"
        retried = f", {report.retries} failed attempt(s) resent the same bytes" if report.retries else ""
        console.print(
            line(
                (f"{status}:", f"bold {colour}"),
                f" {report.matched}/{report.checked} requests match across {len(per_session)} session(s) — "
                f"{len(report.mismatched)} mismatched, {len(report.unreconstructable)} unreconstructable, "
                f"{unverifiable} session(s) not verifiable{erased}{retried}",
            )
        )
    if VERIFY_EXIT_STATUS[status]:
        raise typer.Exit(VERIFY_EXIT_STATUS[status])


def requests(
    session: Annotated[str, typer.Argument(help="Session id.")],
    step: Annotated[int | None, typer.Option("--step", help="Only the N-th request of the session (0-based).")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Re-serialize for anthropic | openai instead of the recorded one.")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON object per request: seq, turn, step, serializer, version, digest, bytes and the body.",
        ),
    ] = False,
) -> None:
    """Print the reconstructed wire body of each loop request (one per line).

    Each body is the exact JSON value sent, with the characters a terminal acts on (DEL, C1 controls, bidi and
    other format characters, line separators) written as \\uXXXX escapes; --json carries its digest and size.
    """
    from ..providers.base import Serializer, serializer_for
    from ..providers.registry import ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1
    from ..replay.verify import rebuild_requests

    session_ids(session)
    chosen: dict[str, Serializer] = {"anthropic": ANTHROPIC_MESSAGES_V1, "openai": OPENAI_CHAT_V1}
    if provider is not None and provider not in chosen:
        raise typer.BadParameter("--provider must be anthropic or openai")
    with stores_for(config_for(data_dir, backend), read_only=True) as stores:
        events = stores.log.read(session)
        if not events:
            raise SessionNotFound(session)
        if any(e.sealed is not None for e in events):
            _erased_requests(session, events, step, json)
            return
        rebuilt = list(rebuild_requests(session, events))
        if step is not None:
            if not 0 <= step < len(rebuilt):
                raise typer.BadParameter(f"--step must be within 0..{len(rebuilt) - 1} for this session")
            rebuilt = [rebuilt[step]]
        out = sys.stdout.buffer
        for dispatch, seq, request in rebuilt:
            ser = chosen[provider] if provider else serializer_for(dispatch.serializer, dispatch.serializer_version)
            body = ser.serialize(request, stores.attachments)
            if json:
                row = {
                    "seq": seq,
                    "turn": dispatch.turn,
                    "step": dispatch.step,
                    "serializer": ser.name,
                    "serializerVersion": ser.version,
                    "digest": codec.digest_bytes(body),
                    "recordedDigest": dispatch.digest,
                    "bytes": len(body),
                    "body": orjson.Fragment(body),  # the exact bytes, embedded as they are
                }
                out.write(json_safe(orjson.dumps(row).decode()).encode() + b"\n")
            else:  # the same JSON value, with what a terminal would act on escaped as in every human output
                out.write(json_safe(body.decode()).encode() + b"\n")
        out.flush()


def _erased_requests(session: str, events: list[Envelope], step: int | None, json: bool) -> None:
    """What ``requests`` prints for an erased session: each request's recorded digest and size, no body."""
    from ..core.events import RequestDispatch

    dispatches = [(e.seq, e.data) for e in events if isinstance(e.data, RequestDispatch)]
    if step is not None:
        if not 0 <= step < len(dispatches):
            raise typer.BadParameter(f"--step must be within 0..{len(dispatches) - 1} for this session")
        dispatches = [dispatches[step]]
    out = sys.stdout.buffer
    for seq, d in dispatches:
        if json:
            row = {
                "seq": seq,
                "turn": d.turn,
                "step": d.step,
                "serializer": d.serializer,
                "serializerVersion": d.serializer_version,
                "recordedDigest": d.digest,
                "bytes": d.bytes,
                "body": None,
                "erased": True,
            }
            out.write(orjson.dumps(row) + b"\n")
        else:
            text = f"seq {seq} turn {d.turn} step {d.step}: erased — recorded {d.digest} ({d.bytes:,} bytes)"
            out.write(json_safe(f"{text}, {d.serializer} v{d.serializer_version}").encode() + b"\n")
    out.flush()
    err_console.print(
        line(("erased:", "cyan"), f" the content of {session!r} was erased; its request bodies cannot be rebuilt")
    )


def diff(
    session: Annotated[str, typer.Argument(help="Session id.")],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """List a session's header snapshots (seq, reason) with a field-level diff to the one before."""
    session_ids(session)
    with stores_for(config_for(data_dir, backend), read_only=True) as stores:
        events = [erased_view(e) for e in read_session(stores.log, session)]  # erased content shows as such
    diffs = snapshot_diffs(events)
    seed = lineage(events)
    if json:
        out = {
            "session": session,
            "lineage": {"parentId": seed.parent_id, "seedLength": seed.seed_length} if seed else None,
            "snapshots": [{"seq": s.seq, "reason": s.reason, "diff": d.to_json()} for s, d in diffs],
        }
        write_json(out)
        return
    if seed is not None:
        console.print(
            line("fork of ", (seed.parent_id or "", "bold"), f": the first {seed.seed_length} events are its prefix")
        )
    table = Table(title=literal(f"header snapshots of {session}"))
    table.add_column("seq", justify="right")
    table.add_column("reason")
    table.add_column("difference to the previous snapshot", overflow="fold")
    for snap, d in diffs:
        cell = literal("(first)") if snap is diffs[0][0] else Text("\n").join(diff_lines(d))
        table.add_row(str(snap.seq), literal(snap.reason), cell)
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
    session_ids(*(sessions or ()))
    config = config_for(data_dir, backend)
    table_of_prices = load_price_table(config.prices)
    found: list[tuple[Drop, PricedStep]] = []
    with stores_for(config, read_only=True) as stores:
        ids = sessions or stores.log.sessions()
        for sid in ids:
            events = stores.log.read(sid)
            if not events:
                raise SessionNotFound(sid)
            for verdict in classify_session(sid, [erased_view(e) for e in events]):
                if verdict.drop is not None:
                    found.append((verdict.drop, price_step(verdict, table_of_prices)))
    counts = {cause: sum(1 for d, _ in found if d.cause == cause) for cause in DROP_CAUSES}
    listed = [(d, p) for d, p in found if not d.explained] if unexplained else found
    currency = table_of_prices.currency
    if json:
        drops_json = [
            {**d.to_json(), "cost": amount_json(p.drop_cost), "cost_cause": drop_key(d), "currency": currency}
            for d, p in listed
        ]
        write_json({"sessions": len(ids), "counts": counts, "drops": drops_json})
    else:
        table = Table(title=f"cache-read drops in {len(ids)} session(s)")
        table.add_column("session")
        for col in ("seq", "turn.step", "read", "baseline", "gap s", "cost"):
            table.add_column(col, justify="right")
        table.add_column("cause")
        for d, priced in listed:
            s = d.step
            table.add_row(
                literal(d.session_id),
                str(s.dispatch_seq),
                f"{s.turn}.{s.step}",
                str(s.usage.cache_read),
                str(d.baseline_tokens),
                "" if d.gap_seconds is None else f"{d.gap_seconds:.1f}",
                money(priced.drop_cost, currency),
                literal(
                    ", ".join(d.causes) + (f" ({', '.join(d.header_fields)})" if d.header_fields else ""),
                    "green" if d.explained else "red",
                ),
            )
        console.print(table)
        for d, _ in listed:
            if not d.explained:
                prev = d.previous.message_id if d.previous else None
                console.print(
                    f"[red]unexplained[/] {d.session_id} seq {d.step.dispatch_seq}: provider request "
                    f"{d.step.request_id or 'unknown'}, message {d.step.message_id or 'unknown'} "
                    f"(previous message {prev or 'unknown'})"
                )
        summary = ", ".join(f"{cause} {n}" for cause, n in counts.items() if n)
        console.print(literal(f"{len(found)} drop(s){': ' + summary if summary else ''}"))
    if fail_on_unexplained and counts["unexplained"]:
        raise typer.Exit(1)
