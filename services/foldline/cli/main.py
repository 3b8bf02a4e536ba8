"""``foldline <verb>``: one typer app; each module registers the commands of its role.

Every failure ends a command with one line on stderr: a foldline error (``error: SessionNotFound: …``) or a
usage error (``error: UsageError: …``, exit status 2), the words of either shown literally
(:mod:`foldline.cli.output`). A closed stdout (``foldline show s | head``) ends the command quietly.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from . import (
    approval_commands,
    archive_commands,
    audit_commands,
    config_commands,
    console_commands,
    cost_commands,
    demo_commands,
    erase_commands,
    fleet_commands,
    replay_commands,
    session_commands,
    worker_commands,
)
from .output import EXIT_ERROR, err_console, fail, line, one_line, quiet_broken_pipe


class _OneLineErrors(TyperGroup):
    """Usage errors as one literal line, like every other failure (typer would draw a panel)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.Abort:
            sys.exit(130)
        except typer.TyperException as exc:  # typer's (vendored) click exceptions: usage errors
            if type(exc).__name__ == "NoArgsIsHelpError":
                sys.exit(EXIT_ERROR)  # the help was printed
            ctx = getattr(exc, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            err_console.print(line(("error:", "bold red"), " UsageError: ", one_line(message), hint), soft_wrap=True)
            sys.exit(getattr(exc, "exit_code", EXIT_ERROR))
        except BrokenPipeError:
            quiet_broken_pipe()
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="foldline",
    cls=_OneLineErrors,
    help="Agent loops whose every model request is rebuilt, byte for byte, from the session log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _tracing(ctx: typer.Context) -> None:
    """Agent loops whose every model request is rebuilt, byte for byte, from the session log."""
    from .. import tracing

    if not tracing.enabled():  # off unless OTEL_TRACES_EXPORTER names an exporter: nothing to set up
        return
    from ..config import Config
    from ..config.prices import load_price_table
    from ..errors import FoldlineError

    try:
        prices = load_price_table(Config.from_env().prices)
    except FoldlineError:
        prices = None  # the command reports a configuration it cannot use
    try:
        tracing.configure(f"foldline-{ctx.invoked_subcommand or 'cli'}", prices=prices)
    except FoldlineError as exc:
        fail(str(exc), type(exc).__name__)
    ctx.call_on_close(tracing.shutdown)  # what is buffered is exported before the process exits


demo_commands.register(app)
session_commands.register(app)
approval_commands.register(app)
audit_commands.register(app)
erase_commands.register(app)
replay_commands.register(app)
console_commands.register(app)
cost_commands.register(app)
worker_commands.register(app)
fleet_commands.register(app)
archive_commands.register(app)
config_commands.register(app)


def main() -> None:  # pragma: no cover - console entry
    try:
        app()
    except BrokenPipeError:
        quiet_broken_pipe()
