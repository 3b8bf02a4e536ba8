"""Commands on a session's lineage and drift: diff, fork, resume."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from ..core.diff import HeaderDiff, snapshot_diffs
from ..core.events import Envelope
from ..core.fork import lineage
from ..core.projection import fold_request_header
from ..errors import ConfigError, SessionNotFound
from ..replay.verify import verify_events
from .common import BackendOpt, DataDirOpt, JsonOpt, console, fail_on_errors, stores_for

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("diff")(fail_on_errors(diff))
    app.command("fork")(fail_on_errors(fork))
    app.command("resume")(fail_on_errors(resume))


def _read(stores_log: Any, session: str) -> list[Envelope]:
    events: list[Envelope] = stores_log.read(session)
    if not events:
        raise SessionNotFound(session)
    return events


def _diff_lines(d: HeaderDiff) -> list[str]:
    if d.empty:
        return ["[dim]no change[/]"]
    lines = [f"config.{key}: {escape(repr(old))} → {escape(repr(new))}" for key, old, new in d.config]
    if d.system:
        lines.append("system prompt:")
        lines += [f"  {escape(line)}" for line in d.system]
    for label, names in (("tools added", d.tools_added), ("tools removed", d.tools_removed)):
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    if d.tools_changed:
        lines.append(f"tools changed: {', '.join(d.tools_changed)}")
    return lines


def diff(
    session: Annotated[str, typer.Argument(help="Session id.")],
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
    json: JsonOpt = False,
) -> None:
    """List a session's header snapshots (seq, reason) with a field-level diff to the one before."""
    with stores_for(data_dir, backend) as stores:
        events = _read(stores.log, session)
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
        table.add_row(str(snap.seq), snap.reason, "\n".join(_diff_lines(d)) if snap is not diffs[0][0] else "(first)")
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
    backend: BackendOpt = "embedded",
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
    with stores_for(data_dir, backend) as stores:
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
            for line in _diff_lines(drift[0]):
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
    backend: BackendOpt = "embedded",
    json: JsonOpt = False,
) -> None:
    """Continue a session with a new loop instance against the emulator (writes a `resume` snapshot)."""
    from ..demo import PROMPTS, demo_toolset
    from ..loop import Agent, AgentOptions
    from ..loop.agent import StepRecord
    from ..loop.pressure import PressurePolicy
    from ..providers.emulated import emulated_provider

    with stores_for(data_dir, backend) as stores:
        events = _read(stores.log, session)
        folded = fold_request_header(events)
        if folded is None:
            raise ConfigError(
                f"session {session!r} has no request/header yet, so there is no configuration to resume from; "
                "run a first request (e.g. with foldline demo) before resuming"
            )
        config = folded.config.with_overrides(model=model) if model else folded.config
        provider = emulated_provider("anthropic" if config.provider == "anthropic" else "openai")
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
        for line in _diff_lines(drift):
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
