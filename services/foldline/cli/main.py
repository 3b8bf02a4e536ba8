"""``foldline <verb>``: one typer app; each module registers the commands of its role."""

from __future__ import annotations

import typer

from . import archive_commands, audit_commands, config_commands, demo_commands, session_commands, worker_commands

app = typer.Typer(
    name="foldline",
    help="Agent loops whose every model request is rebuilt, byte for byte, from the session log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
demo_commands.register(app)
session_commands.register(app)
audit_commands.register(app)
worker_commands.register(app)
archive_commands.register(app)
config_commands.register(app)


def main() -> None:  # pragma: no cover - console entry
    app()
