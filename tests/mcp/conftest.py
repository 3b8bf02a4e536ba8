"""Real MCP servers for the tests: the reference server (installed by ``deploy/local/mcp.sh install``, run over stdio
and Streamable HTTP) and the servers in tests/mcp_servers/ (written with the mcp SDK, or by hand for garbage)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the MCP server exited with status {proc.returncode} before it listened on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"the MCP server did not listen on {port} within {timeout} s")


def processes_marked(mark: str) -> list[int]:
    """The pids of live processes whose environment holds FOLDLINE_TEST_MARK=<mark> (servers we started)."""
    found = []
    needle = f"FOLDLINE_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                status = (entry / "status").read_text()
                if "\nState:\tZ" not in status:
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="session")
def everything() -> Path:
    """The entry script of @modelcontextprotocol/server-everything, installed by the project's own script."""
    if shutil.which("node") is None:
        pytest.fail("node (Node.js 20+) is not on PATH; it runs the reference MCP server (apt-get install nodejs npm)")
    done = subprocess.run(
        ["bash", str(REPO / "deploy" / "local" / "mcp.sh"), "install"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        pytest.fail(f"`deploy/local/mcp.sh install` failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    entry = Path(done.stdout.strip().splitlines()[-1])
    assert entry.is_file(), entry
    return entry


@pytest.fixture
def mark() -> str:
    """A marker put in the environment of the servers a test starts, to find their processes."""
    return uuid.uuid4().hex


@pytest.fixture
def everything_http(everything: Path, mark: str) -> Iterator[str]:
    """server-everything over Streamable HTTP on a free port; its URL."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "FOLDLINE_TEST_MARK": mark}
    proc = subprocess.Popen(
        ["node", str(everything), "streamableHttp"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def tool_server_http(mark: str) -> Iterator[str]:
    """tests/mcp_servers/tool_server.py over Streamable HTTP on a free port; its URL."""
    port = free_port()
    env = {**os.environ, "FOLDLINE_TEST_MARK": mark}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers.tool_server", "http", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
