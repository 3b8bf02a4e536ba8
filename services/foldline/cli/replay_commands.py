"""``foldline replay``: test a change to an agent against recorded sessions (docs/REPLAY.md).

Sessions come by id (from the configured log: the embedded data directory, or Kafka with its archive), from
export files (``--export``), or all of the log (``--all``). Nothing is written unless ``--live --as NEW_ID``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import InputError, NothingToReplay
from .options import BackendOpt, DataDirOpt, JsonOpt, config_for, session_ids, stores_for
from .output import console, err_console, fail_on_errors, line, literal, write_json

if TYPE_CHECKING:
    from ..replayer import ReplayReport

__all__ = ["REPLAY_EXIT_CODES", "register"]

REPLAY_EXIT_CODES = (
    "Exit status: 0 every replayed session built every recorded request identically; 1 a session diverged "
    "(the report says where and what); 2 an error (one line on stderr)."
)
#: A line of a divergence's detail (a system prompt's diff line) is shown up to this many characters.
_DETAIL_CHARS = 200


def register(app: typer.Typer) -> None:
    app.command("replay", epilog=REPLAY_EXIT_CODES)(fail_on_errors(replay))


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[], None]]:
    """A progress bar of identical requests on stderr when it is a terminal (else nothing)."""
    if not err_console.is_terminal:
        yield lambda: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task("identical requests", total=total or None)
        yield lambda: progress.advance(task)


def _write_atomically(path: Path, data: bytes) -> None:
    target = path.resolve()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InputError(f"cannot write --junit {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def replay(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to replay, by id.")] = None,
    export: Annotated[
        list[Path] | None,
        typer.Option(
            "--export", help="An export file (foldline export) to replay; repeat for more.", show_default=False
        ),
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="Every session of the log.")] = False,
    attachments: Annotated[
        Path | None,
        typer.Option(
            "--attachments", help="The export files' attachment objects (export --attachments).", show_default=False
        ),
    ] = None,
    system_file: Annotated[
        Path | None,
        typer.Option("--system-file", help="The changed system prompt, from this file.", show_default=False),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="The changed model.", show_default=False)] = None,
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            help="The changed tools: MODULE:OBJECT, a Toolset or a function returning one.",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config-file",
            help="Changed call-config fields (JSON, or TOML), by their logged names.",
            show_default=False,
        ),
    ] = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live/--until-divergence",
            help="Past the divergence, go on against the emulator (or the configured provider) as a fork child.",
        ),
    ] = False,
    as_id: Annotated[
        str | None,
        typer.Option("--as", help="With --live: write the fork child to the log under this id.", show_default=False),
    ] = None,
    determinism: Annotated[
        bool,
        typer.Option(
            "--determinism-check/--no-determinism-check",
            help="On a divergence, run the agent a second time and name what differs between the two runs.",
        ),
    ] = True,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Also write a JUnit XML report to this file.", show_default=False)
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Replay recorded sessions through the agent with a change; report the first request that differs.

    The recorded inputs go through the loop's own code with the change applied. While each request is
    byte-identical to the recorded one, the recorded answer and tool results are used (nothing runs); the first
    request that differs is reported — the header field or message, the byte offset in the body, and the
    prompt-cache cost of the change there.
    """
    from ..replayer import Change, Live, Recording, replay_sessions
    from ..replayer.live import configured_providers

    ids = list(sessions or [])
    session_ids(*ids, as_id)
    if not ids and not export and not all_sessions:
        raise typer.BadParameter("name sessions to replay: ids, --export FILE, or --all")
    if as_id is not None and not live:
        raise typer.BadParameter("--as names the child a --live replay writes; add --live")
    if as_id is not None and len(ids) + len(export or ()) + (1 if all_sessions else 0) != 1:
        raise typer.BadParameter("--as names one child: replay one session with it")
    if all_sessions and ids:
        raise typer.BadParameter("--all replays every session of the log; do not name ids beside it")
    change = Change.from_inputs(system_file=system_file, model=model, tools=tools, config_file=config_file)
    settings = config_for(data_dir, backend)
    recordings = [Recording.from_export(path, attachments_dir=attachments) for path in export or ()]
    needs_log = bool(ids) or all_sessions or as_id is not None
    with contextlib.ExitStack() as stack:
        stores = stack.enter_context(stores_for(settings, read_only=as_id is None)) if needs_log else None
        if stores is not None:
            names = stores.log.sessions() if all_sessions else ids
            recordings += [Recording.from_log(stores.log, sid, stores.attachments) for sid in names]
            if all_sessions and not names:
                raise NothingToReplay(
                    None, "the log holds no session to replay; record some first (e.g. foldline demo)"
                )
        writes = as_id is not None and stores is not None
        target = Live(
            as_id,
            stores.log if writes and stores is not None else None,
            configured_providers(settings),
            stores.attachments if writes and stores is not None else None,
        )
        total = sum(sum(1 for e in r.events if e.type == "request/dispatch") for r in recordings)
        with _progress(total) as advance:
            report = replay_sessions(
                recordings,
                change,
                check_determinism=determinism,
                live=target if live else None,
                skip_empty=all_sessions,
                on_request=advance,
            )
    if all_sessions and all(s.status == "skipped" for s in report.sessions):
        raise NothingToReplay(None, "no session of the log holds a request/dispatch record to replay")
    if junit is not None:
        _write_atomically(junit, report.junit_xml())
    if json:
        write_json(report.to_json())
    else:
        _print(report)
    raise typer.Exit(report.exit_code)


def _print(report: ReplayReport) -> None:
    console.print(literal(f"change: {report.change.describe()}"))
    for s in report.sessions:
        if s.status == "skipped":
            console.print(line(("- ", "dim"), (s.session, "bold"), f"  skipped: {s.skipped}"))
            continue
        seed = f" (after its fork seed from {s.parent})" if s.parent is not None else ""
        if s.divergence is None:
            console.print(
                line(("✓ ", "green"), (s.session, "bold"), f"  identical: {s.compared}/{s.requests} requests{seed}")
            )
            continue
        d = s.divergence
        console.print(
            line(
                ("✗ ", "red"),
                (s.session, "bold"),
                f"  diverged at request {d.request if d.request is not None else '-'} of {s.requests}{seed}: ",
                d.summary(),
            )
        )
        for text in d.lines()[1:]:
            shown = text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"
            console.print(line("    ", shown))
        if s.live is not None:
            lv = s.live
            where = "written to the log" if lv.written else "in memory"
            console.print(
                line(
                    "    live: ",
                    (lv.child, "bold"),
                    f" ({where}; fork of {lv.parent}, seed length {lv.seed_length}): {lv.turns} turns, {lv.steps} "
                    f"steps, cache read {lv.usage.cache_read} / write {lv.usage.cache_write} tokens; verify "
                    f"{lv.verified}/{lv.checked}",
                )
            )
    cost = report.cost
    money = "unknown (a model without a price; FOLDLINE_PRICES adds one)" if cost.money is None else f"{cost.money}"
    console.print(
        literal(
            f"cost of the change: {cost.cache_write_tokens} cache-write tokens over {cost.sessions} sessions "
            f"({cost.per_session:.1f} a session, {cost.per_1000_sessions:,.0f} per 1,000 sessions); money: {money}"
        )
    )
    verdict = "identical" if report.identical else "diverged"
    console.print(
        line(("status: ", "bold"), (verdict, "green" if report.identical else "red"), f" (exit {report.exit_code})")
    )
