"""Commands that run or inspect loops: demo, verify, show, requests, emulator."""

from __future__ import annotations

import sys
from typing import Annotated

import orjson
import typer
from rich.table import Table

from ..core.content import ImageBlock, TextBlock, ToolCallBlock
from ..core.events import (
    AssistantMessage,
    AttachmentQuarantine,
    CompactionSummary,
    RequestDispatch,
    RequestHeader,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from ..core.wire import header_to_json
from ..errors import SessionNotFound
from ..replay.verify import VerifyReport, rebuild_requests, verify_events
from .common import BackendOpt, DataDirOpt, JsonOpt, console, fail_on_errors, stores_for
from .ops_commands import MetricsHostOpt, MetricsLingerOpt, MetricsPortOpt, metrics_endpoint

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("verify")(fail_on_errors(verify))
    app.command("show")(fail_on_errors(show))
    app.command("requests")(fail_on_errors(requests))
    app.command("demo")(fail_on_errors(demo))
    app.command("emulator")(fail_on_errors(emulator))


def verify(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to verify (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
    json: JsonOpt = False,
) -> None:
    """Rebuild every loop request from the log and compare it with the digest recorded at dispatch."""
    with stores_for(data_dir, backend) as stores:
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
        console.print(
            f"[{colour}]verified {report.matched}/{report.checked} requests across {len(ids)} session(s)[/]"
            f" — {len(report.mismatched)} mismatched, {len(report.unreconstructable)} unreconstructable"
        )
    if not report.ok:
        raise typer.Exit(1)


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
            return blocks(data.content) + usage
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
    backend: BackendOpt = "embedded",
) -> None:
    """Print a session's transcript, header snapshots included."""
    with stores_for(data_dir, backend) as stores:
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


def requests(
    session: Annotated[str, typer.Argument(help="Session id.")],
    step: Annotated[int | None, typer.Option("--step", help="Only the N-th request of the session (0-based).")] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Re-serialize for anthropic | openai instead of the recorded one.")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
) -> None:
    """Print the exact reconstructed wire body of each loop request (one per line)."""
    from ..providers.base import Serializer, serializer_for
    from ..providers.registry import ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1

    chosen: dict[str, Serializer] = {"anthropic": ANTHROPIC_MESSAGES_V1, "openai": OPENAI_CHAT_V1}
    if provider is not None and provider not in chosen:
        raise typer.BadParameter("--provider must be anthropic or openai")
    with stores_for(data_dir, backend) as stores:
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


def demo(
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="Concurrent agent sessions.")] = 4,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Loop steps (model requests) per session.")] = 24,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
    json: JsonOpt = False,
    fresh: Annotated[bool, typer.Option("--fresh/--keep", help="Start from an empty data directory.")] = True,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    metrics_linger: MetricsLingerOpt = 0.0,
    projectors: Annotated[
        int, typer.Option("--projectors", min=1, help="Backend distributed: projector processes to start.")
    ] = 1,
    dispatchers: Annotated[
        int,
        typer.Option("--dispatchers", min=0, help="Backend distributed: dispatcher processes (0 = one in-process)."),
    ] = 0,
) -> None:
    """The main job: N concurrent scripted agent sessions with tools against the local emulator."""
    from ..demo import print_demo, run_demo_cli

    with metrics_endpoint(metrics_port, metrics_host, metrics_linger) as metrics:
        result = run_demo_cli(
            data_dir=data_dir,
            backend=backend,
            sessions=sessions,
            steps=steps,
            fresh=fresh,
            quiet=json,
            metrics=metrics,
            projectors=projectors,
            dispatchers=dispatchers,
        )
        if json:
            sys.stdout.write(orjson.dumps(result.to_json()).decode() + "\n")
        else:
            print_demo(result, console)
    if not result.verified_ok:
        raise typer.Exit(1)


def emulator(
    port: Annotated[int, typer.Option("--port", help="TCP port on 127.0.0.1.")] = 8089,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
) -> None:
    """Serve the provider emulator over HTTP (Anthropic Messages and OpenAI Chat Completions)."""
    from ..providers.emulator import serve

    console.print(f"emulator listening on http://{host}:{port} (POST /v1/messages, /v1/chat/completions)")
    serve(host, port)
