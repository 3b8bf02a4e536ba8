"""Options shared by the commands, the configuration they override, and the stores it names.

Every setting comes from :meth:`foldline.config.Config.from_env`; an option given on the command line
replaces one field of it. Options therefore default to ``None`` ("not given") and carry no defaults of
their own (those live in :mod:`foldline.config`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import Config, Stores, open_stores
from ..core.events import Envelope
from ..core.validation import check_session_id
from ..errors import SessionNotFound
from ..ports.event_log import EventLog

__all__ = [
    "BackendOpt",
    "DataDirOpt",
    "JsonOpt",
    "MetricsHostOpt",
    "MetricsPortOpt",
    "config_for",
    "read_session",
    "session_ids",
    "stores_for",
]

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory of the embedded default [env FOLDLINE_DATA_DIR; default ./foldline-data].",
        show_default=False,
    ),
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help="embedded | kafka | distributed [env FOLDLINE_BACKEND; default embedded].",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        help="Serve Prometheus metrics on this port (/metrics, /healthz, /readyz) while running; 0 picks one "
        "[env FOLDLINE_METRICS_PORT; default off].",
        show_default=False,
    ),
]
MetricsHostOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-host",
        help="Address the metrics endpoint binds to [env FOLDLINE_METRICS_HOST; default 127.0.0.1].",
        show_default=False,
    ),
]


def config_for(data_dir: Path | None = None, backend: str | None = None, **fields: Any) -> Config:
    """The environment's configuration with the options that were given (``section__field=value``)."""
    return Config.from_env().overridden(data_dir=data_dir, backend=backend, **fields)


@contextmanager
def stores_for(config: Config, *, read_only: bool = False) -> Iterator[Stores]:
    """The stores of ``config``; ``read_only`` for the commands that only read (nothing is created)."""
    stores = open_stores(config, read_only=read_only)
    try:
        yield stores
    finally:
        stores.close()


def session_ids(*ids: str | None) -> None:
    """Hold every session id given on the command line to the id rules (ValidationError, one line)."""
    for sid in ids:
        if sid is not None:
            check_session_id(sid)


def read_session(log: EventLog, session: str) -> list[Envelope]:
    """The session's events; :class:`SessionNotFound` when it has none."""
    events = log.read(session)
    if not events:
        raise SessionNotFound(session)
    return events
