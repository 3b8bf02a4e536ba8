"""``foldline <verb>``: one typer app; each module registers its commands."""

from __future__ import annotations

import typer

from . import dispatcher_commands, log_commands, ops_commands, projector_commands, run_commands, session_commands

app = typer.Typer(
    name="foldline",
    help="Agent loops whose every model request is rebuilt, byte for byte, from the session log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
log_commands.register(app)
run_commands.register(app)
ops_commands.register(app)
session_commands.register(app)
dispatcher_commands.register(app)
projector_commands.register(app)


def main() -> None:  # pragma: no cover - console entry
    app()
