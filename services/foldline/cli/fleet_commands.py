"""``foldline fleet``: run many concurrent loops against the operator's projectors and dispatchers."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from .options import DataDirOpt, JsonOpt, config_for
from .output import console, err_console, fail_on_errors

if TYPE_CHECKING:
    from ..fleet import FleetResult

__all__ = ["print_fleet", "register"]


def register(app: typer.Typer) -> None:
    app.command("fleet")(fail_on_errors(fleet))


def fleet(
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="Concurrent new sessions in this process.")] = 100,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Loop steps (model requests) per session.")] = 10,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Redis stream the dispatchers serve (default: configured).")
    ] = None,
    prefix: Annotated[
        str | None, typer.Option("--prefix", help="Session ids are PREFIX-NNNNN (default: fleet-<random>).")
    ] = None,
    ramp: Annotated[
        float,
        typer.Option(
            "--ramp",
            min=0.0,
            help="Seconds over which the sessions start their first step, evenly spread (0: all at once).",
        ),
    ] = 0.0,
    invariant: Annotated[
        bool,
        typer.Option(
            "--invariant/--no-invariant",
            help="Check each request against the log before it is sent (the default, as every loop does); "
            "--no-invariant measures what that check costs a fleet.",
        ),
    ] = True,
    data_dir: DataDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Run N concurrent scripted agent sessions whose steps external `foldline dispatcher` processes serve.

    Start `foldline projector` and `foldline dispatcher` processes first (same configuration). Prints
    steps/s, new sessions/s, per-step latency p50/p99 with its breakdown, and verifies every session; exits
    1 if a session failed or a request did not verify.
    """
    from ..config import open_stores
    from ..diagnostics import dump_tasks_on_signal
    from ..dispatcher.factory import step_client
    from ..fleet import run_fleet
    from ..tracing import traced_dispatcher

    config = config_for(data_dir, "distributed")
    stores = open_stores(config, writer=True)
    try:
        dispatcher = traced_dispatcher(step_client(config, stream=stream), loop=True, serve=False)

        async def main(progress: Progress | None) -> FleetResult:
            dump_tasks_on_signal(asyncio.get_running_loop())  # kill -USR1: where every session waits, on stderr
            task: list[TaskID] = []

            def on_phase(name: str, total: int) -> None:
                if progress is None:
                    return
                if task:
                    progress.update(task[0], completed=progress.tasks[0].total)
                    progress.stop_task(task[0])
                task[:] = [progress.add_task(name, total=total)]

            def on_step() -> None:
                if progress is not None and task:
                    progress.advance(task[0])

            try:
                return await run_fleet(
                    config,
                    stores,
                    dispatcher,
                    sessions=sessions,
                    steps=steps,
                    prefix=prefix,
                    ramp_s=ramp,
                    invariant=invariant,
                    on_phase=on_phase,
                    on_step=on_step,
                )
            finally:
                await dispatcher.aclose()

        if json:
            result = asyncio.run(main(None))
        else:
            columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err_console) as progress:
                result = asyncio.run(main(progress))
    finally:
        stores.close()
    if json:
        sys.stdout.write(orjson.dumps(result.to_json()).decode() + "\n")
    else:
        print_fleet(result)
    if not result.ok:
        raise typer.Exit(1)


def print_fleet(result: FleetResult) -> None:
    from ..fleet import PHASES, percentile

    n = len(result.sessions)
    opens = [s.open_s for s in result.sessions if s.open_s is not None]
    if result.ramp_s:  # each session opened as it arrived
        opened = (
            f"each opened as it arrived over {result.ramp_s:g} s, in p50 {percentile(opens, 0.5) * 1000:.1f} ms / "
            f"p99 {percentile(opens, 0.99) * 1000:.1f} ms"
        )
    else:
        opened = f"opened in {result.open_s:.2f} s = {n / result.open_s if result.open_s else 0:,.0f} new sessions/s"
    console.print(
        f"{n:,} sessions x {result.steps_per_session} steps: {result.steps:,} steps in {result.run_s:.2f} s "
        f"= [bold]{result.steps / result.run_s if result.run_s else 0:,.1f} steps/s[/]; {opened} "
        f"(the log warmed first in {result.warm_s * 1000:.0f} ms)"
    )
    table = Table(title="seconds per step")
    table.add_column("part")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    for name in (*PHASES, "overhead"):
        values = result.phase(name)
        table.add_row(name, f"{percentile(values, 0.5) * 1000:.1f} ms", f"{percentile(values, 0.99) * 1000:.1f} ms")
    for place, values in result.overhead_by_place().items():  # a session's first step carries its start
        if values:
            table.add_row(
                f"overhead, {place} steps",
                f"{percentile(values, 0.5) * 1000:.1f} ms",
                f"{percentile(values, 0.99) * 1000:.1f} ms",
            )
    console.print(table)
    for s in result.failed:
        console.print(f"[red]failed[/] {s.id}: {s.error}")
    verdict = "[green]verified[/]" if result.ok else "[red]NOT verified[/]"
    console.print(
        f"{verdict}: {result.verified:,}/{result.checked:,} requests rebuilt byte for byte "
        f"({result.steps:,} steps, {len(result.failed)} failed sessions) in {result.verify_s:.2f} s"
    )
