"""``foldline console``: the operator console, a read-only web page over the log (README "Console")."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import ConfigError
from .options import BackendOpt, DataDirOpt, config_for
from .output import console as out
from .output import fail_on_errors, literal, write_json

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("console")(fail_on_errors(console))


def console(
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=0,
            max=65535,
            help="TCP port; 0 picks a free one [env FOLDLINE_CONSOLE_PORT; default 8765].",
            show_default=False,
        ),
    ] = None,
    bind: Annotated[
        str | None,
        typer.Option(
            "--bind",
            help="Address to listen on [env FOLDLINE_CONSOLE_BIND; default 127.0.0.1]; any other than loopback "
            "needs FOLDLINE_CONSOLE_TOKEN.",
            show_default=False,
        ),
    ] = None,
    allow_decisions: Annotated[
        bool,
        typer.Option("--allow-decisions", help="Allow approve/deny of paused turns (not available in this build)."),
    ] = False,
    data_dir: DataDirOpt = None,
    backend: BackendOpt = None,
    json: Annotated[bool, typer.Option("--json", help="Announce the address as one JSON line.")] = False,
) -> None:
    """Serve the operator console: sessions, steps, tokens, drops and proofs, rebuilt from the log.

    Read-only: it opens the stores as the audit commands do and offers no action. It binds to 127.0.0.1; any
    other address needs FOLDLINE_CONSOLE_TOKEN, which every request must then carry.
    """
    if allow_decisions:
        from ..console.server import DECISIONS_REFUSED

        raise ConfigError(DECISIONS_REFUSED)
    from ..console.server import start

    config = config_for(data_dir, backend, console__port=port, console__bind=bind)
    server = start(config)
    if json:
        write_json(
            {
                "url": server.url,
                "bind": server.host,
                "port": server.port,
                "backend": config.backend,
                "sessions": server.sessions,
                "token": config.console.token is not None,
                "readOnly": True,
            }
        )
    else:
        token = (
            " (every request needs FOLDLINE_CONSOLE_TOKEN: open it once with ?token=…)" if config.console.token else ""
        )
        out.print(
            literal(
                f"console at {server.url} — {server.sessions:,} session(s) on the {config.backend} backend, "
                f"read-only{token}; Ctrl-C stops it"
            )
        )
    server.serve()
