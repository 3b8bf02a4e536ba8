"""``foldline dispatcher``: serve handed-off steps from the Redis steps stream (docs/DISPATCHER.md)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Config, open_stores
from ..errors import ConfigError
from .common import BackendOpt, DataDirOpt, err_console, fail_on_errors
from .ops_commands import MetricsHostOpt, MetricsPortOpt

if TYPE_CHECKING:
    from ..providers.base import Provider

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("dispatcher")(fail_on_errors(dispatcher))


def _providers(anthropic_url: str | None, openai_url: str | None) -> dict[str, Provider]:
    """Real adapters posting to the given base URLs (keys from ANTHROPIC_API_KEY / OPENAI_API_KEY), or —
    for a provider without a URL — the adapter over an in-process emulator (one shared prompt cache)."""
    import httpx

    from ..providers.anthropic import AnthropicProvider
    from ..providers.emulated import emulated_provider
    from ..providers.emulator import Emulator
    from ..providers.openai import OpenAIProvider

    emulator = Emulator()
    anthropic: Provider = (
        AnthropicProvider(httpx.AsyncHTTPTransport(), os.environ.get("ANTHROPIC_API_KEY"), anthropic_url)
        if anthropic_url
        else emulated_provider("anthropic", emulator=emulator)
    )
    openai: Provider = (
        OpenAIProvider(httpx.AsyncHTTPTransport(), os.environ.get("OPENAI_API_KEY"), openai_url)
        if openai_url
        else emulated_provider("openai", emulator=emulator)
    )
    return {"anthropic": anthropic, "openai": openai}


def dispatcher(
    data_dir: DataDirOpt = None,
    backend: BackendOpt = "distributed",
    stream: Annotated[
        str | None,
        typer.Option("--stream", envvar="FOLDLINE_DISPATCH_STREAM", help="Redis stream loops hand steps to."),
    ] = None,
    group: Annotated[str | None, typer.Option("--group", help="Consumer group shared by the dispatchers.")] = None,
    consumer: Annotated[
        str | None, typer.Option("--consumer", help="This process's name in the group (default host-pid).")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Steps in flight across sessions.")] = 64,
    fold_timeout: Annotated[
        float, typer.Option("--fold-timeout", min=0.01, help="Seconds to wait for the fold to reach a boundary.")
    ] = 10.0,
    invariant: Annotated[
        bool, typer.Option("--invariant/--no-invariant", help="Rebuild every request from the raw log first.")
    ] = True,
    anthropic_url: Annotated[
        str | None,
        typer.Option("--anthropic-url", help="Anthropic base URL (key: ANTHROPIC_API_KEY); default: emulator."),
    ] = None,
    openai_url: Annotated[
        str | None, typer.Option("--openai-url", help="OpenAI base URL (key: OPENAI_API_KEY); default: emulator.")
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Dispatch handed-off steps: request from the fold, checked against the log, logged, sent, answered."""
    from ..dispatcher import DEFAULT_GROUP, DEFAULT_STREAM, Dispatcher, serve_steps
    from ..metrics import DispatcherMetrics, new_registry
    from ..metrics_server import HealthServer, serve

    config = Config.from_env(data_dir, backend)
    stores = open_stores(config)
    if stores.folds is None:
        stores.close()
        raise ConfigError(
            f"foldline dispatcher builds requests from projected folds; the {config.backend!r} backend has none — "
            "use --backend distributed (Kafka log, Redis folds, S3 attachments) with `foldline projector` running"
        )
    metrics: DispatcherMetrics | None = None
    server: HealthServer | None = None
    stop = asyncio.Event()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        assert stores.folds is not None
        worker = Dispatcher(
            stores.log,
            stores.folds,
            _providers(anthropic_url, openai_url),
            attachments=stores.attachments,
            invariant=invariant,
            fold_timeout_s=fold_timeout,
            max_concurrency=concurrency,
            metrics=metrics,
        )
        try:
            return await serve_steps(
                worker,
                config.redis_url,
                stream=stream or DEFAULT_STREAM,
                group=group or DEFAULT_GROUP,
                consumer=consumer,
                stop=stop,
                max_in_flight=concurrency,
            )
        finally:
            await worker.aclose()

    try:
        if metrics_port is not None:
            registry = new_registry()
            metrics = DispatcherMetrics(registry)
            folds = stores.folds
            ping = getattr(folds, "ping", None)  # the Redis fold store answers a PING; ready = serving and reachable

            def ready() -> bool:
                return not stop.is_set() and (ping is None or bool(ping()))

            server = serve(metrics_port, registry, host=metrics_host, ready=ready)
            err_console.print(f"metrics: {server.url}/metrics")
        err_console.print(f"dispatcher serving steps from {stream or DEFAULT_STREAM!r} (stop with SIGTERM or Ctrl-C)")
        answered = asyncio.run(main())
        err_console.print(f"dispatcher stopped after answering {answered} step(s)")
    finally:
        if server is not None:
            server.close()
        stores.close()
