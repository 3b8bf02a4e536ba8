"""Where the commands write, how a header diff reads, and how a foldline error ends a command (one line, status 2)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..core.diff import HeaderDiff
from ..errors import FoldlineError

__all__ = ["console", "diff_lines", "err_console", "fail_on_errors"]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail_on_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn FoldlineError into a one-line message and exit status 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FoldlineError as exc:
            err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", soft_wrap=True)
            sys.exit(2)

    return wrapper


def diff_lines(d: HeaderDiff) -> list[str]:
    """A header snapshot's field-level difference to the one before, as console markup lines."""
    if d.empty:
        return ["[dim]no change[/]"]
    lines = [f"config.{key}: {escape(repr(old))} → {escape(repr(new))}" for key, old, new in d.config]
    if d.system:
        lines.append("system prompt:")
        lines += [f"  {escape(line)}" for line in d.system]
    for label, names in (("tools added", d.tools_added), ("tools removed", d.tools_removed)):
        if names:
            lines.append(f"{label}: {', '.join(names)}")
    if d.tools_changed:
        lines.append(f"tools changed: {', '.join(d.tools_changed)}")
    return lines
