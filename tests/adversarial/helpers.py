"""Running the ``foldline`` command the way a user (or an attacker) does, and judging what it printed.

``invoke`` runs the typer app in-process (fast); ``run`` starts ``python -m foldline.cli`` as a real
process, for what only a process shows: the bytes a terminal would get, resource limits, another user's
permissions, concurrent runs. Both strip the environment's ``FOLDLINE_BACKEND``/``FOLDLINE_DATA_DIR`` so
every command names its data directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from foldline.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
_STRIPPED = ("FOLDLINE_BACKEND", "FOLDLINE_DATA_DIR", "FOLDLINE_SQLITE_BUSY_TIMEOUT", "COLUMNS")


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    env.update(extra)
    return env


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes = b""


def invoke(*args: str | Path, input: bytes | None = None, env: dict[str, str] | None = None) -> Outcome:
    """The typer app in this process."""
    runner = CliRunner()
    blank = dict.fromkeys(_STRIPPED)
    result = runner.invoke(app, [str(a) for a in args], input=input, env={**blank, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Outcome(result.exit_code, result.stdout, result.stderr, result.stdout_bytes)


def run(
    *args: str | Path,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> Outcome:
    """``python -m foldline.cli ARGS`` as its own process."""
    proc = subprocess.run(
        [sys.executable, "-m", "foldline.cli", *map(str, args)],
        input=input,
        capture_output=True,
        env=env if env is not None else cli_env(),
        preexec_fn=preexec,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    return Outcome(
        proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), proc.stdout
    )


def assert_one_line_error(out: Outcome, *needles: str, code: int = 2) -> str:
    """A failure as the commands promise it: status ``code``, one line on stderr, typed, no traceback."""
    assert out.code == code, f"exit {out.code}; stdout={out.stdout[-400:]!r} stderr={out.stderr[-800:]!r}"
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {out.stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def printable_output(text: str) -> bool:
    """No byte a terminal would act on: no C0 control but newline (and tab), no DEL, C1 or bidi override."""
    return not any(
        (ord(c) < 0x20 and c not in "\n\t")
        or 0x7F <= ord(c) < 0xA0
        or 0x2028 <= ord(c) <= 0x202E
        or 0x2066 <= ord(c) <= 0x2069
        for c in text
    )


def demo(data: Path, *, sessions: int = 2, steps: int = 4, extra: Sequence[str] = ()) -> Outcome:
    return invoke("demo", "--sessions", str(sessions), "--steps", str(steps), "--data-dir", data, "--json", *extra)
