"""``foldline projector``: fold the Kafka session-event topic into Redis, or rebuild folds on demand."""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ..config import Config
from ..errors import ConfigError
from .common import console, err_console, fail_on_errors
from .ops_commands import MetricsHostOpt, MetricsPortOpt

if TYPE_CHECKING:
    from ..projector import ProjectorWorker, WorkerSettings

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("projector")(fail_on_errors(projector))


def projector(
    sessions: Annotated[
        list[str] | None, typer.Argument(help="With --rebuild: the sessions to rebuild (default: every session).")
    ] = None,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Rebuild folds from the log (SESSION... or all), then exit.")
    ] = False,
    group: Annotated[
        str, typer.Option("--group", envvar="FOLDLINE_PROJECTOR_GROUP", help="Kafka consumer group of the projectors.")
    ] = "foldline-projector",
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap", help="Kafka bootstrap servers (default $FOLDLINE_KAFKA_BOOTSTRAP).", show_default=False
        ),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option("--topic", help="Session-event topic (default $FOLDLINE_KAFKA_TOPIC).", show_default=False),
    ] = None,
    partitions: Annotated[
        int,
        typer.Option("--partitions", envvar="FOLDLINE_KAFKA_PARTITIONS", min=1, help="The topic's partition count."),
    ] = 12,
    redis_url: Annotated[
        str | None,
        typer.Option("--redis-url", help="Redis of the folds (default $FOLDLINE_REDIS_URL).", show_default=False),
    ] = None,
    redis_prefix: Annotated[
        str, typer.Option("--fold-prefix", envvar="FOLDLINE_FOLD_PREFIX", help="Redis key prefix of the folds.")
    ] = "foldline:fold:",
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="Records per poll and per apply.")] = 5000,
    journal: Annotated[
        bool, typer.Option("--journal", help="Keep a per-session change journal in Redis (audits and crash tests).")
    ] = False,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every assignment and batch.")] = False,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            envvar="FOLDLINE_PROJECTOR_RUNTIME",
            help="Consumer runtime: confluent (a confluent-kafka group consumer) or faust (a faust-streaming app).",
        ),
    ] = "confluent",
) -> None:
    """Run a projector worker (one consumer-group member) until SIGINT/SIGTERM, or rebuild folds and exit.

    Start N workers with the same --group to share the partitions. "projector ready" is printed on
    stdout once the worker holds its partitions and reaches Redis; /readyz answers 200 from then on.
    """
    from ..projector import WorkerSettings

    if runtime not in ("confluent", "faust"):
        raise ConfigError(f"--runtime must be confluent or faust, not {runtime!r}")
    if sessions and not rebuild:
        raise ConfigError("session ids are only taken with --rebuild (e.g. foldline projector --rebuild s1 s2)")
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    config = Config.from_env()
    settings = WorkerSettings(
        bootstrap=bootstrap or config.kafka_bootstrap,
        topic=topic or config.kafka_topic,
        group=group,
        redis_url=redis_url or config.redis_url,
        redis_prefix=redis_prefix,
        partitions=partitions,
        max_batch=max_batch,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        journal=journal,
    )
    if rebuild:
        _rebuild(settings, sessions or [])
    elif runtime == "faust":
        _run_faust(settings)
    else:
        _run(settings)


def _rebuild(settings: WorkerSettings, sessions: list[str]) -> None:
    from ..adapters.kafka import KafkaEventLog
    from ..adapters.redis_folds import RedisFoldStore
    from ..projector import BatchProjector

    log = KafkaEventLog(settings.bootstrap, topic=settings.topic, partitions=settings.partitions)
    store = RedisFoldStore(settings.redis_url, prefix=settings.redis_prefix, journal=settings.journal)
    try:
        ids = sessions or log.sessions()
        projector = BatchProjector(store, log)
        for sid in ids:
            result = projector.rebuild(sid)
            console.print(f"rebuilt {sid}: applied seq {result.applied_seq} ({result.status})")
        console.print(f"rebuilt {len(ids)} session fold(s)")
    finally:
        store.close()
        log.close()


def _run(settings: WorkerSettings) -> None:
    from ..projector import ProjectorWorker

    def announce(worker: ProjectorWorker) -> None:
        url = worker.metrics_url
        extra = f" metrics={url}" if url else ""
        sys.stdout.write(f"projector ready group={settings.group} topic={settings.topic}{extra}\n")
        sys.stdout.flush()

    worker = ProjectorWorker(settings, on_ready=announce)

    def stop(_signum: int, _frame: object) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    totals = worker.run()
    err_console.print(
        f"projector stopped: {totals.events} events, {totals.applied} applied, {totals.duplicates} duplicates, "
        f"{len(totals.gaps)} gaps, {len(totals.rebuilt)} rebuilds, {len(totals.fenced)} fenced, "
        f"{totals.dead_letters} dead letters"
    )


def _run_faust(settings: WorkerSettings) -> None:
    from ..projector.faust_runtime import FaustProjector

    def announce(worker: FaustProjector) -> None:
        url = worker.metrics_url
        extra = f" metrics={url}" if url else ""
        sys.stdout.write(f"projector ready group={settings.group} topic={settings.topic}{extra}\n")
        sys.stdout.flush()

    # faust's worker installs its own SIGTERM/SIGINT handlers: a signal stops the app cleanly
    totals = FaustProjector(settings, on_ready=announce).run()
    err_console.print(
        f"projector stopped: {totals.events} events, {totals.applied} applied, {totals.duplicates} duplicates, "
        f"{len(totals.gaps)} gaps, {len(totals.rebuilt)} rebuilds, {len(totals.fenced)} fenced, "
        f"{totals.dead_letters} dead letters"
    )
