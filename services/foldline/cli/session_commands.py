"""Commands on sessions: list, show, export, import, fork and resume them.

The data directory is ``--data-dir``, else ``$FOLDLINE_DATA_DIR``, else ``./foldline-data``.

Exit status of ``sessions``, ``export`` and ``import``: 0 on success; 2 on any reported error — a usage
error, a foldline error (unknown or existing session, a bad export line, an unavailable store) or a file
that cannot be read or written — with one line on stderr and nothing written; 1 only for an unexpected
crash (a bug: please report it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import orjson
import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..core import codec
from ..core.content import ImageBlock, TextBlock, ToolCallBlock
from ..core.diff import snapshot_diffs
from ..core.events import (
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionSummary,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from ..core.projection import fold_request_header
from ..core.wire import header_to_json
from ..errors import ConfigError, SessionNotFound
from ..export import export_session, import_session
from ..replay.verify import verify_events
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, read_session, stores_for
from .output import console, diff_lines, err_console, fail_on_errors

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("sessions", epilog=EXIT_CODES)(sessions_cmd)
    app.command("show")(fail_on_errors(show))
    app.command("export", epilog=EXIT_CODES)(export_cmd)
    app.command("import", epilog=EXIT_CODES)(import_cmd)
    app.command("fork")(fail_on_errors(fork))
    app.command("resume")(fail_on_errors(resume))


EXIT_CODES = "Exit status: 0 ok; 2 error (one line on stderr, nothing written)."


def _fail_io(what: str, exc: OSError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(what)}: {escape(str(exc.strerror or exc))}", soft_wrap=True)
    return typer.Exit(2)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@fail_on_errors
def sessions_cmd(data_dir: DataDirOpt = None, backend: BackendOpt = None, as_json: JsonOpt = False) -> None:
    """List the sessions of the log: id, event count and the time of the last event."""
    rows: list[dict[str, Any]] = []
    config = config_for(data_dir, backend)
    if config.backend != "embedded" or config.data_dir.exists():  # do not create a data dir just to list it
        with stores_for(config) as stores:
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
    backend: BackendOpt = None,
) -> None:
    """Write one session as JSON Lines: a header line, then one canonical event per line (docs/FORMAT.md)."""
    with stores_for(config_for(data_dir, backend)) as stores:
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
    backend: BackendOpt = None,
) -> None:
    """Validate an export completely, then append it as one new session — or write nothing."""
    with stores_for(config_for(data_dir, backend)) as stores:
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


def _summary(data: object) -> str:
    def blocks(content: tuple[object, ...]) -> str:
        parts = []
        for b in content:
            if isinstance(b, TextBlock):
                parts.append(b.text if len(b.text) <= 80 else b.text[:77] + "…")
            elif isinstance(b, ImageBlock):
                parts.append(f"[image {b.image.attachment_id[:15]}… {b.image.width}x{b.image.height}]")
            elif isinstance(b, ToolCallBlock):
                parts.append(f"[call {b.name}({b.arguments})]")
        return " ".join(parts)

    match data:
        case UserMessage():
            op = "" if data.surface_op == "append" else f" replace {data.surface_op.start}..{data.surface_op.end}"
            return f"({data.source}{op}) {blocks(data.content)}"
        case AssistantMessage():
            u = data.usage
            usage = f" [in {u.input} read {u.cache_read} write {u.cache_write} out {u.output}]" if u else ""
            stop = f" ({data.stop_reason})" if data.stop_reason in ("interrupted", "refusal", "pause_turn") else ""
            named = (("request", data.provider_request_id), ("message", data.provider_message_id))
            ids = [f"{k}={v}" for k, v in named if v]
            return blocks(data.content) + usage + stop + (f" {{{' '.join(ids)}}}" if ids else "")
        case LlmRetry():
            status = f"HTTP {data.status} " if data.status is not None else ""
            then = f"retry in {data.wait_ms} ms" if data.wait_ms is not None else "gave up"
            after = f" after {data.received_bytes} answer bytes" if data.received_bytes else " before any answer byte"
            rid = f" request={data.provider_request_id}" if data.provider_request_id else ""
            return f"attempt {data.attempt} failed: {status}{data.error_type}{after}; {then}{rid}"
        case AssistantChunk():
            name = f"{data.event} " if data.event else ""
            return f"attempt {data.attempt} #{data.index} {name}{data.data[:100]}"
        case ToolResult():
            op = "" if data.surface_op == "append" else " (trim)"
            return f"{data.name} {data.call_id}{op}{' ERROR' if data.is_error else ''}: {blocks(data.content)}"
        case ToolCall():
            return f"{data.name}({data.arguments}) id={data.call_id}"
        case RequestHeader():
            return f"reason={data.reason} " + orjson.dumps(header_to_json(data.header)).decode()[:160]
        case RequestDispatch():
            return f"{data.serializer}/v{data.serializer_version} {data.digest[:23]}… {data.bytes} bytes"
        case TurnEnd():
            return f"turn {data.turn} {data.reason}"
        case CompactionSummary():
            return f"{data.provider}/{data.model}: {data.summary[:100]}"
        case AttachmentQuarantine():
            return f"{data.attachment_id[:23]}… {data.failure}"
    return ""


def show(
    session: Annotated[str, typer.Argument(help="Session id.")],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Print a session's transcript, header snapshots included."""
    with stores_for(config_for(data_dir, backend)) as stores:
        events = stores.log.read(session)
    if not events:
        raise SessionNotFound(session)
    table = Table(title=f"session {session}", show_lines=False)
    table.add_column("seq", justify="right")
    table.add_column("type")
    table.add_column("summary", overflow="fold")
    for e in events:
        style = "bold magenta" if isinstance(e.data, RequestHeader) else None
        table.add_row(str(e.seq), e.type, _summary(e.data), style=style)
    console.print(table)


def fork(
    session: Annotated[str, typer.Argument(help="Parent session id.")],
    at: Annotated[int, typer.Option("--at", help="Keep the parent's events 0..SEQ (a step boundary).")],
    model: Annotated[str | None, typer.Option("--model", help="Model for the child from its first request.")] = None,
    system_file: Annotated[
        Path | None, typer.Option("--system-file", help="Override the system prompt with this file's text.")
    ] = None,
    as_id: Annotated[str | None, typer.Option("--as", help="Child id (default PARENT-fork-SEQ).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Create a child session from a parent's prefix; overrides become a logged `resume` snapshot."""
    from ..loop.fork import fork_session

    system: str | None = None
    if system_file is not None:
        try:
            system = system_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read --system-file {system_file}: {exc.strerror}; pass a readable file") from exc
    with stores_for(config_for(data_dir, backend)) as stores:
        result = fork_session(stores.log, session, at, as_id, model=model, system=system)
        report = verify_events(result.child_id, stores.log.read(result.child_id), stores.attachments)
    drift = [d for s, d in snapshot_diffs(result.events) if s.seq == result.override_seq]
    if json:
        out = {
            "child": result.child_id,
            "parent": result.parent_id,
            "seedLength": result.seed_length,
            "overrideSeq": result.override_seq,
            "drift": drift[0].to_json() if drift else None,
            "verify": report.to_json(),
        }
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        console.print(
            f"forked [bold]{session}[/] at seq {at} → [bold]{result.child_id}[/] "
            f"(seed length {result.seed_length}, session/end-seed at seq {result.seed_length})"
        )
        if drift:
            console.print(f"override snapshot (reason resume) at seq {result.override_seq}:")
            for line in diff_lines(drift[0]):
                console.print(f"  {line}")
        console.print(f"the child verifies on its own: {report.matched}/{report.checked} requests match")
    if not report.ok:
        raise typer.Exit(1)


def resume(
    session: Annotated[str, typer.Argument(help="Session id (e.g. a demo session).")],
    model: Annotated[str | None, typer.Option("--model", help="Reconfigure the model for this instance.")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Loop steps to run.")] = 4,
    budget: Annotated[
        int | None, typer.Option("--budget", min=200, help="Token budget: trim / compact above it (default: off).")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Continue a session with a new loop instance against the emulator (writes a `resume` snapshot)."""
    from ..demo import PROMPTS, demo_toolset
    from ..loop import Agent, AgentOptions
    from ..loop.agent import StepRecord
    from ..loop.pressure import PressurePolicy
    from ..providers.emulated import emulated_provider, wire_format_of

    with stores_for(config_for(data_dir, backend)) as stores:
        events = read_session(stores.log, session)
        folded = fold_request_header(events)
        if folded is None:
            raise ConfigError(
                f"session {session!r} has no request/header yet, so there is no configuration to resume from; "
                "run a first request (e.g. with foldline demo) before resuming"
            )
        config = folded.config.with_overrides(model=model) if model else folded.config
        last = next((e.data.serializer for e in reversed(events) if isinstance(e.data, RequestDispatch)), None)
        provider = emulated_provider(wire_format_of(last, config.provider))
        policy = (
            PressurePolicy(budget, keep_recent_tokens=budget // 3, summary_max_tokens=max(64, budget // 4))
            if budget
            else None
        )
        options = AgentOptions(config=config, system=folded.system, tools=demo_toolset(), pressure=policy)
        agent = Agent(session, stores.log, provider, options, attachments=stores.attachments)
        records: list[StepRecord] = []
        agent.step_listeners.append(records.append)

        async def run() -> None:
            try:
                turn = 0
                while len(records) < steps:
                    agent.options.max_steps_per_turn = steps - len(records)
                    await agent.run_turn(f"[{session}] {PROMPTS[turn % len(PROMPTS)]}")
                    turn += 1
            finally:
                await provider.aclose()

        asyncio.run(run())
        after = stores.log.read(session)
        report = verify_events(session, after, stores.attachments)
    resume_snaps = [(s, d) for s, d in snapshot_diffs(after) if s.seq >= len(events) and s.reason == "resume"]
    snap, drift = resume_snaps[0]
    if json:
        out = {
            "session": session,
            "resumeSeq": snap.seq,
            "drift": drift.to_json(),
            "steps": [
                {
                    "step": i,
                    "header": r.header_reason,
                    "prompt_tokens": r.usage.prompt_tokens,
                    "cache_read_tokens": r.usage.cache_read,
                    "cache_write_tokens": r.usage.cache_write,
                    "output_tokens": r.usage.output,
                }
                for i, r in enumerate(records)
            ],
            "verified": report.ok,
        }
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        console.print(f"resumed [bold]{session}[/]: snapshot (reason resume) at seq {snap.seq}")
        for line in diff_lines(drift):
            console.print(f"  {line}")
        table = Table(title="steps of this loop instance")
        for col in ("step", "header", "prompt", "cache read", "ratio"):
            table.add_column(col, justify="right" if col != "header" else "left")
        for i, r in enumerate(records):
            u = r.usage
            ratio = u.cache_read / u.prompt_tokens if u.prompt_tokens else 0.0
            table.add_row(str(i), r.header_reason or "", str(u.prompt_tokens), str(u.cache_read), f"{ratio:.2f}")
        console.print(table)
        console.print(
            "a new process starts with a cold emulator cache, so the first request reads nothing; "
            f"verify: {report.matched}/{report.checked} requests match"
        )
    if not report.ok:
        raise typer.Exit(1)
