"""How the commands print: log text as literal text, failures as one line, and output that fits a pipe.

* **Literal text.** Anything that comes from a log, a file or the command line (ids, message text, tool
  output, error messages that quote them) is printed with :func:`literal`: a Rich ``Text`` that is never
  parsed as markup, with every control, format and line-separator character shown as an escape
  (``\\n``, ``\\x1b``, ``\\u202e``), so no log can style, hide, move or rewrite what a terminal shows.
  Markup is used only in text written here.
* **Pipes.** On a terminal the consoles draw tables at the terminal's width; into a pipe or a file they
  never wrap or cut a line (``foldline verify | tail -1`` is the whole summary line).
* **Failures.** :func:`fail_on_errors` turns a :class:`~foldline.errors.FoldlineError` (and the file and
  encoding errors of a command's own inputs, and a module of an extra that is not installed) into one line on
  stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import unicodedata
from collections.abc import Callable
from typing import Any

import orjson
from rich.console import Console, ConsoleDimensions
from rich.text import Text

from ..core.diff import HeaderDiff
from ..errors import FoldlineError

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "PipeAwareConsole",
    "console",
    "diff_lines",
    "err_console",
    "escape_controls",
    "fail",
    "fail_on_errors",
    "json_safe",
    "line",
    "literal",
    "one_line",
    "quiet_broken_pipe",
    "write_json",
]

EXIT_ERROR = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE
PIPE_WIDTH = 1_000_000  # "unlimited": a line into a pipe is as long as its content
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


class PipeAwareConsole(Console):
    """A Rich console that draws at the terminal's width on a terminal and never wraps into a pipe or file."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(highlight=False, **kwargs)

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal:
            return size
        return ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("soft_wrap") is None and not self.is_terminal:
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)


console = PipeAwareConsole()
err_console = PipeAwareConsole(stderr=True)


def escape_controls(text: str) -> str:
    """``text`` with every control, format, surrogate and line/paragraph-separator character escaped
    (``\\n``, ``\\t``, ``\\x1b``, ``\\u202e``; a backslash before such an escape is doubled), everything else kept."""
    if text.isprintable():
        return text
    out: list[str] = []
    hidden = False
    for c in text:
        if c in _NAMED:
            out.append(_NAMED[c])
            hidden = hidden or c != "\\"
        elif unicodedata.category(c) in _HIDDEN_CATEGORIES:
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
            hidden = True
        else:
            out.append(c)
    # a text whose only "non-printable" characters are ones shown as themselves (e.g. a no-break space)
    # stays exactly as it was, backslashes included
    return "".join(out) if hidden else text


def json_safe(text: str) -> str:
    """JSON text with the characters JSON may leave raw but a terminal acts on (DEL, C1 controls, format
    characters such as bidi overrides, line/paragraph separators) written as ``\\uXXXX``: the same JSON
    value, safe to show. (They can only stand inside strings: JSON's own syntax is ASCII.)"""
    if text.isascii() and "\x7f" not in text:
        return text
    return "".join(
        f"\\u{ord(c):04x}"
        if ord(c) == 0x7F or (ord(c) >= 0x80 and unicodedata.category(c) in _HIDDEN_CATEGORIES)
        else c
        for c in text
    )


def write_json(value: object, *, stderr: bool = False, canonical: bool = False) -> None:
    """One JSON line on stdout (or stderr): insertion-ordered keys, or sorted with ``canonical``;
    terminal-safe (:func:`json_safe`)."""
    from ..core import codec

    encoded = codec.canonical_json(value) if canonical else orjson.dumps(value)
    stream = sys.stderr if stderr else sys.stdout
    stream.write(json_safe(encoded.decode()) + "\n")
    stream.flush()


def literal(text: object, style: str = "") -> Text:
    """``text`` (any value, as ``str``) to print exactly as it is: never markup, control characters escaped."""
    return Text(escape_controls(str(text)), style=style)


def line(*parts: str | Text | tuple[str, str]) -> Text:
    """One line of output: ``str`` parts are literal text, ``(text, style)`` parts are literal and styled."""
    out = Text()
    for part in parts:
        if isinstance(part, Text):
            out.append_text(part)
        elif isinstance(part, tuple):
            out.append_text(literal(part[0], part[1]))
        else:
            out.append_text(literal(part))
    return out


def one_line(text: str) -> str:
    """A message on one line: its lines joined by " / " (control characters are escaped when printed)."""
    return " / ".join(part.strip() for part in str(text).splitlines() if part.strip())


def fail(message: str, kind: str | None = None) -> None:
    """Print ``error: [kind: ]message`` as one line on stderr and exit with status 2."""
    prefix = f"{kind}: " if kind else ""
    err_console.print(line(("error:", "bold red"), " ", prefix, one_line(message)), soft_wrap=True)
    sys.exit(EXIT_ERROR)


def quiet_broken_pipe() -> None:
    """The reader of stdout went away (``foldline show s | head``): stop quietly, as a Unix filter does."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
    except (OSError, ValueError):
        pass
    sys.exit(EXIT_BROKEN_PIPE)


def fail_on_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn FoldlineError into a one-line message and exit status 2 (no traceback).

    The command's own inputs failing are reported the same way: a file it cannot read or write
    (``OSError``), text that is not UTF-8 (``UnicodeError``).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FoldlineError as exc:
            fail(str(exc), type(exc).__name__)
        except ModuleNotFoundError as exc:  # an optional part of foldline that is not installed: say which
            from ..config.extras import missing_extra

            missing = missing_extra(exc)
            if missing is None:
                raise
            fail(str(missing), type(missing).__name__)
        except UnicodeError as exc:
            fail(f"input is not UTF-8 text: {exc}", type(exc).__name__)
        except BrokenPipeError:
            quiet_broken_pipe()
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}", type(exc).__name__)

    return wrapper


def diff_lines(d: HeaderDiff) -> list[Text]:
    """A header snapshot's field-level difference to the one before, one line each."""
    if d.empty:
        return [literal("no change", "dim")]
    lines = [line(f"config.{key}: {old!r} → {new!r}") for key, old, new in d.config]
    if d.system:
        lines.append(literal("system prompt:"))
        lines += [line("  ", text) for text in d.system]
    for label, names in (("tools added", d.tools_added), ("tools removed", d.tools_removed)):
        if names:
            lines.append(line(f"{label}: {', '.join(names)}"))
    if d.tools_changed:
        lines.append(line(f"tools changed: {', '.join(d.tools_changed)}"))
    return lines
