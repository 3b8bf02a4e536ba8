"""``foldline console``: where it may listen, and what it refuses (one line, exit 2)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.console.server import check_bind, is_loopback
from foldline.errors import ConfigError

runner = CliRunner()


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.8.9.10", "localhost", "::1", "[::1]"])
def test_loopback_needs_no_token(bind: str) -> None:
    assert is_loopback(bind)
    check_bind(bind, None)


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.1.2.3", "console.example.com"])
def test_any_other_address_needs_a_token(bind: str) -> None:
    assert not is_loopback(bind)
    with pytest.raises(ConfigError, match="FOLDLINE_CONSOLE_TOKEN"):
        check_bind(bind, None)
    with pytest.raises(ConfigError):
        check_bind(bind, "")
    check_bind(bind, "a-token")


def _one_line_error(args: list[str], env: dict[str, str] | None = None) -> str:
    res = runner.invoke(app, args, env=env)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_the_command_refuses_to_start_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    line = _one_line_error(
        ["console", "--bind", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path)], {"FOLDLINE_CONSOLE_TOKEN": ""}
    )
    assert "ConfigError" in line
    assert "FOLDLINE_CONSOLE_TOKEN" in line


def test_the_command_refuses_decisions_and_a_taken_port(tmp_path: Path) -> None:
    assert "--allow-decisions" in _one_line_error(["console", "--allow-decisions", "--data-dir", str(tmp_path)])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = _one_line_error(["console", "--port", str(port), "--data-dir", str(tmp_path)])
    assert "already in use" in line


def test_the_command_announces_where_it_listens(tmp_path: Path) -> None:
    foldline = str(Path(sys.executable).parent / "foldline")
    with subprocess.Popen(
        [foldline, "console", "--port", "0", "--data-dir", str(tmp_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            announced = json.loads(proc.stdout.readline())
        finally:
            proc.terminate()
            proc.wait(10)
    assert announced["bind"] == "127.0.0.1"
    assert announced["port"] > 0
    assert announced["url"] == f"http://127.0.0.1:{announced['port']}/"
    assert announced["readOnly"] is True
    assert announced["token"] is False
