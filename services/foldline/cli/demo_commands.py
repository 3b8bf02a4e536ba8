"""Commands that run loops against the provider emulator: ``foldline demo`` and ``foldline emulator``."""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Config, MetricsConfig
from ..errors import ConfigError
from .options import BackendOpt, DataDirOpt, JsonOpt, MetricsHostOpt, MetricsPortOpt, config_for
from .output import console, err_console, fail_on_errors, literal, write_json

if TYPE_CHECKING:
    from ..metrics import LoopMetrics

__all__ = ["emulator_only", "metrics_endpoint", "register"]

MetricsLingerOpt = Annotated[
    float,
    typer.Option("--metrics-linger", min=0, help="Keep serving metrics this many seconds after the run ends."),
]


def register(app: typer.Typer) -> None:
    app.command("demo")(fail_on_errors(demo))
    app.command("emulator")(fail_on_errors(emulator))


@contextmanager
def metrics_endpoint(
    metrics: MetricsConfig, linger: float = 0.0, prices: Path | None = None
) -> Iterator[LoopMetrics | None]:
    """Yield loop metrics served on ``metrics.host:metrics.port`` for the duration (``None`` without a port).

    The endpoint's address goes to stderr. After the body, it keeps serving ``linger`` seconds so a
    scraper can read the final counters, then stops. Costs are priced with the shipped price table and
    ``prices`` (``FOLDLINE_PRICES``) over it.
    """
    if metrics.port is None:
        yield None
        return
    from ..config.prices import load_price_table
    from ..metrics import LoopMetrics, new_registry
    from ..metrics_server import serve

    registry = new_registry()
    loop_metrics = LoopMetrics(registry, prices=load_price_table(prices))
    server = serve(metrics.port, registry, host=metrics.host)
    err_console.print(literal(f"metrics: {server.url}/metrics"))
    try:
        yield loop_metrics
        if linger:
            sys.stdout.flush()
            time.sleep(linger)
    finally:
        server.close()


def emulator_only(config: Config, command: str) -> None:
    """Refuse to run ``command`` — whose requests the built-in emulator answers — while the configuration
    sends some provider's requests to a server: the setting would look active (``foldline config``) and do
    nothing."""
    chosen = config.providers.configured_variables()
    if chosen:
        one = len(chosen) == 1
        raise ConfigError(
            f"{command} answers every request with the built-in emulator, but {', '.join(chosen)} "
            f"{'is' if one else 'are'} set and would not be used; unset {'it' if one else 'them'} for this command "
            "(servers are reached by `foldline dispatcher` and by the library's provider adapters)"
        )


def demo(
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="Concurrent agent sessions.")] = 4,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Loop steps (model requests) per session.")] = 24,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh/--keep",
            help="Start from an empty data directory (a new or empty one, or one an earlier demo wrote, whose demo "
            "files it clears; any other directory is refused) or add to the log there (--keep, deletes nothing).",
        ),
    ] = True,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = None,
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

    config = config_for(data_dir, backend, metrics__port=metrics_port, metrics__host=metrics_host)
    emulator_only(config, "foldline demo")
    with metrics_endpoint(config.metrics, metrics_linger, config.prices) as metrics:
        result = run_demo_cli(
            config,
            sessions=sessions,
            steps=steps,
            fresh=fresh,
            quiet=json,
            metrics=metrics,
            projectors=projectors,
            dispatchers=dispatchers,
        )
        if json:
            write_json(result.to_json())
        else:
            print_demo(result, console)
    if not result.verified_ok:
        raise typer.Exit(1)


def emulator(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port (0 picks a free one).")] = 8089,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    fault_at: Annotated[
        list[str] | None,
        typer.Option(
            "--fault", "--fault-at", help="INDEX=FAULT: answer request INDEX (0-based) with FAULT; repeatable."
        ),
    ] = None,
    fault_rate: Annotated[
        list[str] | None,
        typer.Option("--fault-rate", help="RATE=FAULT: answer that share of requests with FAULT; repeatable."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Which requests the rates pick (deterministic).")] = 0,
    event_delay: Annotated[float, typer.Option("--event-delay", min=0, help="Seconds between streamed events.")] = 0.0,
    latency: Annotated[
        float, typer.Option("--latency", min=0, help="Seconds before each answer's first byte (a model's time).")
    ] = 0.0,
    latency_spread: Annotated[
        float,
        typer.Option("--latency-spread", min=0, max=0.99, help="Each answer takes (1 ± this) x the latency."),
    ] = 0.0,
    json: Annotated[bool, typer.Option("--json", help="Announce the address as one JSON line.")] = False,
) -> None:
    """Serve the provider emulator over HTTP (Anthropic Messages, OpenAI Chat Completions and Responses, DeepSeek).

    FAULT is 429[:RETRY_AFTER_S], 529, 500 (any status), reset-before, reset-mid, error-mid[:TYPE] (a streamed
    answer broken off by the API's error event) or slow:SECONDS.
    """
    from ..providers.emulator import Emulator, EmulatorServer, Fault, FaultPlan

    try:
        by_index = {int(i): Fault.parse(f) for i, _, f in (x.partition("=") for x in fault_at or ())}
        rates = [(float(r), Fault.parse(f)) for r, _, f in (x.partition("=") for x in fault_rate or ())]
        plan = FaultPlan(by_index, rates, seed) if by_index or rates else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        emulated = Emulator(faults=plan, event_delay_s=event_delay, latency_s=latency, latency_spread=latency_spread)
        server = EmulatorServer(host, port, emulator=emulated, quiet=False)
    except OSError as exc:
        taken = "the port is already in use" if exc.errno == errno.EADDRINUSE else str(exc.strerror or exc)
        raise ConfigError(
            f"cannot serve the emulator on {host}:{port}: {taken}; pass another --port (0 picks a free one)"
        ) from exc
    paths = list(emulated.apis)
    if json:
        write_json({"url": server.url, "paths": paths})
    else:
        console.print(literal(f"emulator listening on {server.url} (POST {', '.join(paths)})"))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
