"""Options and error handling shared by the CLI commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ..config import Config, Stores, open_stores
from ..errors import FoldlineError

__all__ = ["BackendOpt", "DataDirOpt", "JsonOpt", "console", "err_console", "fail_on_errors", "stores_for"]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="FOLDLINE_DATA_DIR",
        help="Data directory of the embedded default (default ./foldline-data).",
        show_default=False,
    ),
]
BackendOpt = Annotated[str, typer.Option("--backend", envvar="FOLDLINE_BACKEND", help="embedded | kafka | distributed")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


@contextmanager
def stores_for(data_dir: Path | None, backend: str = "embedded") -> Iterator[Stores]:
    stores = open_stores(Config.from_env(data_dir, backend))
    try:
        yield stores
    finally:
        stores.close()


def fail_on_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn FoldlineError into a one-line message and exit status 2 (no traceback)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FoldlineError as exc:
            err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True)
            sys.exit(2)

    return wrapper
