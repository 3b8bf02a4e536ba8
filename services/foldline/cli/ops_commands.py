"""Operations commands: ``foldline drops`` lists every cache-read drop and its cause, from the log alone."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.table import Table

from ..core.drops import DROP_CAUSES, Drop, session_drops
from ..errors import SessionNotFound
from .common import BackendOpt, DataDirOpt, JsonOpt, console, err_console, fail_on_errors, stores_for

if TYPE_CHECKING:
    from ..metrics import LoopMetrics

__all__ = ["MetricsHostOpt", "MetricsLingerOpt", "MetricsPortOpt", "metrics_endpoint", "register"]

MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        envvar="FOLDLINE_METRICS_PORT",
        min=0,
        help="Serve Prometheus metrics on this port (/metrics, /healthz, /readyz) while running; 0 picks one.",
        show_default=False,
    ),
]
MetricsHostOpt = Annotated[str, typer.Option("--metrics-host", help="Address the metrics endpoint binds to.")]
MetricsLingerOpt = Annotated[
    float,
    typer.Option("--metrics-linger", min=0, help="Keep serving metrics this many seconds after the run ends."),
]


@contextmanager
def metrics_endpoint(port: int | None, host: str = "127.0.0.1", linger: float = 0.0) -> Iterator[LoopMetrics | None]:
    """Yield loop metrics served on ``host:port`` for the duration (``None`` when no port is asked for).

    The endpoint's address goes to stderr. After the body, it keeps serving ``linger`` seconds so a
    scraper can read the final counters, then stops.
    """
    if port is None:
        yield None
        return
    from ..metrics import LoopMetrics, new_registry
    from ..metrics_server import serve

    registry = new_registry()
    metrics = LoopMetrics(registry)
    server = serve(port, registry, host=host)
    err_console.print(f"metrics: {server.url}/metrics")
    try:
        yield metrics
        if linger:
            sys.stdout.flush()
            time.sleep(linger)
    finally:
        server.close()


def register(app: typer.Typer) -> None:
    app.command("drops")(fail_on_errors(drops))


def drops(
    sessions: Annotated[list[str] | None, typer.Argument(help="Sessions to classify (default: all).")] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "embedded",
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
    with stores_for(data_dir, backend) as stores:
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
        summary = ", ".join(f"{cause} {n}" for cause, n in counts.items() if n)
        console.print(f"{len(found)} drop(s){': ' + summary if summary else ''}")
    if fail_on_unexplained and counts["unexplained"]:
        raise typer.Exit(1)
