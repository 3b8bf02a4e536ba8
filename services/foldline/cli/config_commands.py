"""``foldline config``: the configuration this process would run with, every setting and its source variable.

Secrets (the Redis URL's password, Kafka passwords and keys, provider API keys) are shown as ``***``.
"""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from .options import BackendOpt, DataDirOpt, JsonOpt, config_for
from .output import console, fail_on_errors, literal, write_json

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("config")(fail_on_errors(show_config))


def show_config(data_dir: DataDirOpt = None, backend: BackendOpt = None, json: JsonOpt = False) -> None:
    """Print every setting (environment variable, field, effective value) with secrets masked."""
    rows = config_for(data_dir, backend).describe()
    if json:
        out = {field: {"env": env, "value": value} for env, field, value in rows}
        write_json(out)
        return
    table = Table(title="foldline configuration (secrets masked)")
    table.add_column("variable")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for env, field, value in rows:
        table.add_row(env, field, literal(value) if value else Text("unset", style="dim"))
    console.print(table)
