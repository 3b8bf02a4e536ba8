"""The log outliving Kafka's retention: ``foldline archiver``, ``foldline restore`` and ``foldline doctor``.

* ``archiver`` runs an archiver (a member of the archivers' consumer group on Kafka, a poller of the
  embedded log) until SIGTERM;
* ``restore`` puts archived sessions back into the log (a cluster rebuilt from the archive): every session
  it can, each one that fails reported, exit status 1 if one did;
* ``doctor`` prints every check that says whether this deployment can lose the log, and exits 1 when one
  fails (and never 0 without having checked something).

docs/RETENTION.md has the model behind all three.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import ConfigError, FoldlineError, SessionNotFound
from .options import BackendOpt, DataDirOpt, JsonOpt, MetricsHostOpt, MetricsPortOpt, config_for, session_ids
from .output import console, err_console, fail_on_errors, line, literal, one_line, write_json

if TYPE_CHECKING:
    from ..archiver.worker import ArchiverWorker

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("archiver")(fail_on_errors(archiver))
    app.command("restore")(fail_on_errors(restore))
    app.command("doctor")(fail_on_errors(doctor))


def _announcer(json: bool) -> Callable[[ArchiverWorker], None]:
    def announce(worker: ArchiverWorker) -> None:
        url = worker.metrics_url
        if json:
            write_json({"ready": True, "metrics": url})
            return
        extra = f" metrics={url}" if url else ""
        sys.stdout.write(f"archiver ready{extra}\n")
        sys.stdout.flush()

    return announce


def archiver(
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Consumer group of the archivers [env FOLDLINE_ARCHIVE_GROUP; default <topic>.archivers].",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="Segments written at once [env FOLDLINE_ARCHIVE_CONCURRENCY; default 16].",
            show_default=False,
        ),
    ] = None,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every segment written.")] = False,
    json: Annotated[
        bool, typer.Option("--json", help="Report readiness and the totals as JSON lines on stdout.")
    ] = False,
) -> None:
    """Archive sessions to the configured archive (FOLDLINE_ARCHIVE) until SIGINT/SIGTERM.

    On Kafka, start N archivers with the same group to share the partitions; "archiver ready" is printed
    on stdout once one is running. Which sessions are archived, and when, is configuration
    (FOLDLINE_ARCHIVE_SESSIONS, _IDLE, _MAX_DELAY, _SEGMENT_EVENTS).
    """
    from ..archiver.factory import open_archiver
    from ..metrics import ArchiverMetrics, new_registry

    config = config_for(data_dir, backend, archive__group=group, metrics__port=metrics_port, metrics__host=metrics_host)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    metrics = ArchiverMetrics(new_registry()) if config.metrics.port is not None else None
    worker = open_archiver(config, metrics=metrics, on_ready=_announcer(json))

    def stop(_signum: int, _frame: object) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()
    events, segments = worker.archiver.archived_events, worker.archiver.segments
    if json:
        write_json({"stopped": True, "events": events, "segments": segments})
    else:
        err_console.print(line(f"archiver stopped: {events} events in {segments} segment(s)"))


def restore(
    sessions: Annotated[
        list[str] | None, typer.Argument(help="Sessions to restore (default: every archived one).")
    ] = None,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: JsonOpt = False,
) -> None:
    """Put archived sessions back into the log (Kafka or the embedded log), under its fencing rules.

    Each session gets a new writer lease and the events the log lacks, appended after the prefix the log
    already holds (which must equal the archive's). Restoring again is a no-op. A session named that the
    archive does not hold, or an archive without sessions, is an error (nothing is restored). A session that
    cannot be restored (a corrupt or missing segment, another history in the log) is reported and the others
    are still restored; the exit status is then 1.
    """
    from ..archiver.factory import open_archive, restore_target
    from ..archiver.restore import restore_session

    session_ids(*(sessions or ()))
    config = config_for(data_dir, backend)
    archive = open_archive(config)
    try:
        archived = archive.sessions()
        where = archive.store.where("")
        if not archived:
            raise ConfigError(f"the archive at {where} holds no session; nothing to restore")
        if sessions:
            held = set(archived)
            missing = [sid for sid in sessions if sid not in held]
            if missing:
                raise SessionNotFound(missing[0], f"the archive at {where} does not hold it (nothing was restored)")
        ids = list(dict.fromkeys(sessions)) if sessions else archived
        log = restore_target(config)
        try:
            appended, failed = 0, 0
            for sid in ids:
                try:
                    result = restore_session(archive, log, sid)
                except FoldlineError as exc:  # this session stays as it was; the others are still restored
                    failed += 1
                    if json:
                        write_json({"session": sid, "error": f"{type(exc).__name__}: {exc}"})
                    else:
                        why = f" {type(exc).__name__}: {one_line(str(exc))}"
                        err_console.print(line(literal(sid, "bold"), ": ", ("not restored:", "bold red"), why))
                    continue
                appended += result.appended
                if json:
                    write_json(
                        {
                            "session": sid,
                            "archived": result.archived,
                            "present": result.present,
                            "appended": result.appended,
                        }
                    )
                else:
                    console.print(
                        line(
                            literal(sid, "bold"),
                            f": archived {result.archived}, the log held {result.present}, appended {result.appended}",
                        )
                    )
        finally:
            log.close()
    finally:
        archive.close()
    restored = len(ids) - failed
    if json:
        write_json({"restored": restored, "failed": failed, "appended": appended})
    else:
        summary = f"restored {restored} session(s), {appended} event(s) appended"
        console.print(
            line((summary + f"; {failed} session(s) not restored" if failed else summary, "red" if failed else ""))
        )
    if failed:
        raise typer.Exit(1)


_MARK = {"ok": ("OK  ", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "bold red")}


def doctor(
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    audit: Annotated[
        bool,
        typer.Option(
            "--audit", help="Also read every archive object: orphans, missing or corrupt segments, sessions ahead."
        ),
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Check that the log cannot be lost: topic settings, the archive and the archivers' progress.

    Exits 0 when every check passed, 1 when one failed.
    """
    from ..archiver.doctor import run_checks

    config = config_for(data_dir, backend)
    checks = run_checks(config, audit=audit)
    failed = [c for c in checks if c.status == "fail"]
    if json:
        write_json({"ok": not failed and bool(checks), "checks": [c.to_json() for c in checks]})
    else:
        console.print(line(f"backend {config.backend}, archive {config.archive.store}"))
        for c in checks:
            console.print(line(_MARK[c.status], f" {c.area:8} {c.name}: {c.detail}"), soft_wrap=True)
            if c.fix and c.status != "ok":
                console.print(line(f"        {c.fix}"), soft_wrap=True)
        colour = "red" if failed or not checks else "green"
        console.print(line((f"{len(checks) - len(failed)}/{len(checks)} checks passed", colour)))
    if failed or not checks:
        raise typer.Exit(1)
