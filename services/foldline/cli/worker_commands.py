"""The long-running workers: ``foldline projector`` (Kafka → Redis folds) and ``foldline dispatcher``.

Both take every setting from the configuration (the environment; docs in README.md) and let options
override single fields. A projector rebuilds folds on demand too (``--rebuild``). See docs/PROJECTOR.md
and docs/DISPATCHER.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import ConfigError
from .options import BackendOpt, DataDirOpt, MetricsHostOpt, MetricsPortOpt, config_for, session_ids
from .output import console, err_console, fail_on_errors, literal, write_json

if TYPE_CHECKING:
    from ..metrics import DispatcherMetrics
    from ..metrics_server import HealthServer, ReadyCheck
    from ..projector import BatchReport, ProjectorWorker
    from ..projector.factory import ProjectorParts
    from ..projector.faust_runtime import FaustProjector

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("projector")(fail_on_errors(projector))
    app.command("dispatcher")(fail_on_errors(dispatcher))


# ------------------------------------------------------------------ foldline projector


def projector(
    sessions: Annotated[
        list[str] | None, typer.Argument(help="With --rebuild: the sessions to rebuild (default: every session).")
    ] = None,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Rebuild folds from the log (SESSION... or all), then exit.")
    ] = False,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Kafka consumer group of the projectors [env FOLDLINE_PROJECTOR_GROUP; default <topic>.projectors].",
            show_default=False,
        ),
    ] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option("--bootstrap", help="Kafka bootstrap servers [env FOLDLINE_KAFKA_BOOTSTRAP].", show_default=False),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option("--topic", help="Session-event topic [env FOLDLINE_KAFKA_TOPIC].", show_default=False),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            min=1,
            help="The topic's partition count [env FOLDLINE_KAFKA_PARTITIONS].",
            show_default=False,
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option("--redis-url", help="Redis of the folds [env FOLDLINE_REDIS_URL].", show_default=False),
    ] = None,
    redis_prefix: Annotated[
        str | None,
        typer.Option(
            "--fold-prefix", help="Redis key prefix of the folds [env FOLDLINE_FOLD_PREFIX].", show_default=False
        ),
    ] = None,
    max_batch: Annotated[
        int | None,
        typer.Option(
            "--max-batch",
            min=1,
            help="Records per poll and per apply [env FOLDLINE_PROJECTOR_MAX_BATCH].",
            show_default=False,
        ),
    ] = None,
    journal: Annotated[
        bool, typer.Option("--journal", help="Keep a per-session change journal in Redis (audits and crash tests).")
    ] = False,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every assignment and batch.")] = False,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="Consumer runtime: confluent (a confluent-kafka group consumer) or faust (a faust-streaming app) "
            "[env FOLDLINE_PROJECTOR_RUNTIME; default confluent].",
            show_default=False,
        ),
    ] = None,
    json: Annotated[
        bool, typer.Option("--json", help="Report as JSON lines: readiness and the totals, or each rebuilt fold.")
    ] = False,
) -> None:
    """Run a projector worker (one consumer-group member) until SIGINT/SIGTERM, or rebuild folds and exit.

    Start N workers with the same --group to share the partitions. "projector ready" is printed on
    stdout once the worker holds its partitions and reaches Redis; /readyz answers 200 from then on.
    """
    if sessions and not rebuild:
        raise ConfigError("session ids are only taken with --rebuild (e.g. foldline projector --rebuild s1 s2)")
    config = config_for(
        kafka__projector_group=group,
        kafka__bootstrap=bootstrap,
        kafka__topic=topic,
        kafka__partitions=partitions,
        redis__url=redis_url,
        folds__prefix=redis_prefix,
        projector__max_batch=max_batch,
        projector__runtime=runtime,
        metrics__port=metrics_port,
        metrics__host=metrics_host,
    )
    from ..projector.factory import open_projector

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    session_ids(*(sessions or ()))
    parts = open_projector(config, journal=journal)
    try:
        if rebuild:
            _rebuild(parts, sessions or [], json)
        elif config.projector.runtime == "faust":
            _run_faust(parts, json)
        else:
            _run(parts, json)
    finally:
        parts.close()


def _rebuild(parts: ProjectorParts, sessions: list[str], json: bool) -> None:
    from ..projector import BatchProjector

    ids = sessions or parts.log.sessions()
    projector = BatchProjector(parts.store, parts.log)
    for sid in ids:
        result = projector.rebuild(sid)
        if json:
            write_json({"session": sid, "appliedSeq": result.applied_seq, "status": result.status})
        else:
            console.print(literal(f"rebuilt {sid}: applied seq {result.applied_seq} ({result.status})"))
    if json:
        write_json({"rebuilt": len(ids)})
    else:
        console.print(literal(f"rebuilt {len(ids)} session fold(s)"))


def _announcer(json: bool) -> Callable[[ProjectorWorker | FaustProjector], None]:
    def announce(worker: ProjectorWorker | FaustProjector) -> None:
        url = worker.metrics_url
        if json:
            write_json({"ready": True, "group": worker.settings.group, "topic": worker.settings.topic, "metrics": url})
            return
        extra = f" metrics={url}" if url else ""
        sys.stdout.write(f"projector ready group={worker.settings.group} topic={worker.settings.topic}{extra}\n")
        sys.stdout.flush()

    return announce


def _report(totals: BatchReport, json: bool) -> None:
    if json:
        write_json(
            {
                "stopped": True,
                "events": totals.events,
                "applied": totals.applied,
                "duplicates": totals.duplicates,
                "gaps": len(totals.gaps),
                "rebuilds": len(totals.rebuilt),
                "fenced": len(totals.fenced),
                "deadLetters": totals.dead_letters,
            },
            stderr=True,
        )
        return
    err_console.print(
        f"projector stopped: {totals.events} events, {totals.applied} applied, {totals.duplicates} duplicates, "
        f"{len(totals.gaps)} gaps, {len(totals.rebuilt)} rebuilds, {len(totals.fenced)} fenced, "
        f"{totals.dead_letters} dead letters"
    )


def _run(parts: ProjectorParts, json: bool) -> None:
    from ..projector import ProjectorWorker

    worker = ProjectorWorker(
        parts.settings, store=parts.store, marks=parts.marks, log=parts.log, on_ready=_announcer(json)
    )

    def stop(_signum: int, _frame: object) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _report(worker.run(), json)


def _run_faust(parts: ProjectorParts, json: bool) -> None:
    from ..projector.faust_runtime import FaustProjector

    # faust's worker installs its own SIGTERM/SIGINT handlers: a signal stops the app cleanly
    faust = FaustProjector(
        parts.settings, store=parts.store, marks=parts.marks, log=parts.log, on_ready=_announcer(json)
    )
    _report(faust.run(), json)


# ------------------------------------------------------------------ foldline dispatcher


def dispatcher(
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    stream: Annotated[
        str | None,
        typer.Option(
            "--stream", help="Redis stream loops hand steps to [env FOLDLINE_DISPATCH_STREAM].", show_default=False
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Consumer group shared by the dispatchers [env FOLDLINE_DISPATCH_GROUP].",
            show_default=False,
        ),
    ] = None,
    consumer: Annotated[
        str | None, typer.Option("--consumer", help="This process's name in the group (default host-pid).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="Steps in flight across sessions [env FOLDLINE_DISPATCH_CONCURRENCY].",
            show_default=False,
        ),
    ] = None,
    fold_timeout: Annotated[
        float | None,
        typer.Option(
            "--fold-timeout",
            min=0.01,
            help="Seconds to wait for the fold to reach a boundary [env FOLDLINE_DISPATCH_FOLD_TIMEOUT].",
            show_default=False,
        ),
    ] = None,
    anthropic_url: Annotated[
        str | None,
        typer.Option(
            "--anthropic-url",
            help="Anthropic base URL (key: ANTHROPIC_API_KEY) [env FOLDLINE_ANTHROPIC_URL]; default: emulator.",
            show_default=False,
        ),
    ] = None,
    openai_url: Annotated[
        str | None,
        typer.Option(
            "--openai-url",
            help="OpenAI base URL (key: OPENAI_API_KEY) [env FOLDLINE_OPENAI_URL]; default: emulator.",
            show_default=False,
        ),
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Report start and stop as JSON lines on stderr.")] = False,
) -> None:
    """Serve handed-over steps: each request built from the fold, its digest answered, sent once logged."""
    from ..diagnostics import dump_tasks_on_signal
    from ..dispatcher import serve_steps
    from ..dispatcher.factory import open_dispatcher, open_dispatcher_stores
    from ..metrics import DispatcherMetrics, new_registry
    from ..metrics_server import serve
    from ..tracing import traced_dispatcher

    # a dispatcher serves the distributed backend unless told otherwise
    if backend is None and not os.environ.get("FOLDLINE_BACKEND"):
        backend = "distributed"
    config = config_for(
        data_dir,
        backend,
        dispatch__stream=stream,
        dispatch__group=group,
        dispatch__concurrency=concurrency,
        dispatch__fold_timeout_s=fold_timeout,
        providers__anthropic_url=anthropic_url,
        providers__openai_url=openai_url,
        metrics__port=metrics_port,
        metrics__host=metrics_host,
    )
    stores = open_dispatcher_stores(config)
    metrics: DispatcherMetrics | None = None
    server: HealthServer | None = None
    stop = asyncio.Event()
    d = config.dispatch

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        dump_tasks_on_signal(loop)  # kill -USR1: where every hand-over waits, on stderr
        worker = open_dispatcher(config, stores.folds, stores.attachments, metrics=metrics)
        try:
            answered = await serve_steps(
                traced_dispatcher(worker, loop=False, serve=True),
                config.redis,
                stream=d.stream,
                group=d.group,
                consumer=consumer,
                stop=stop,
                max_in_flight=d.concurrency,
                claim_idle_s=d.claim_idle_s,
                outage_s=config.outage_s,
            )
            return answered, worker.dispatched
        finally:
            await worker.aclose()

    try:
        if config.metrics.port is not None:
            registry = new_registry()
            metrics = DispatcherMetrics(registry)
            ping = getattr(stores.folds, "ping", None)  # the Redis fold store answers a PING
            attachments = stores.attachments

            def s3_answers() -> bool:
                attachments.ping()  # one HeadBucket; StoreUnavailable says why not
                return True

            # ready = serving, and every dependency answers; a 503 names each one that does not
            ready: dict[str, ReadyCheck] = {"dispatcher": lambda: not stop.is_set(), "s3": s3_answers}
            if ping is not None:
                ready["redis"] = lambda: bool(ping())
            server = serve(config.metrics.port, registry, host=config.metrics.host, ready=ready)
            if not json:
                err_console.print(literal(f"metrics: {server.url}/metrics"))
        metrics_url = f"{server.url}/metrics" if server is not None else None
        if json:
            write_json({"serving": d.stream, "group": d.group, "metrics": metrics_url}, stderr=True)
        else:
            err_console.print(literal(f"dispatcher serving steps from {d.stream!r} (stop with SIGTERM or Ctrl-C)"))
        answered, sent = asyncio.run(main())
        if json:
            write_json({"stopped": True, "sent": sent, "answered": answered}, stderr=True)
        else:
            stopped = f"dispatcher stopped after sending {sent} step(s) ({answered} hand-over(s) answered)"
            err_console.print(literal(stopped))
    finally:
        if server is not None:
            server.close()
        stores.close()
