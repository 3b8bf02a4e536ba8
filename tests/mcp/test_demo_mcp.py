"""``foldline demo`` runs demo-mcp on the reference MCP server and ends with every session verified, the MCP
session's log holding its ``change`` snapshot; without Node, or without the mcp extra, it says so in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from foldline.config import Config, open_stores
from foldline.core.events import RequestHeader
from tests.adversarial.helpers import cli_env
from tests.mcp.conftest import REPO

_BLOCK_MCP = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("mcp", "mcp_types", "jsonschema"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
sys.argv = ['foldline', *sys.argv[1:]]
from foldline.cli.main import main
main()
"""


def _demo(data: Path, env: dict[str, str], *, block_mcp: bool = False) -> Any:
    code = (
        _BLOCK_MCP if block_mcp else "from foldline.cli.main import main\nimport sys\nsys.argv[0] = 'foldline'\nmain()"
    )
    args = ["demo", "--sessions", "2", "--steps", "6", "--data-dir", str(data), "--json"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_demo_runs_demo_mcp_and_every_session_verifies(everything: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = _demo(data, cli_env(FOLDLINE_DEMO_MCP_SERVER=str(everything)))
    sessions = {s["id"]: s for s in result["sessions"]}
    assert "demo-mcp" in sessions
    assert all(s["verified"] for s in sessions.values())
    assert result["skipped"] == []
    stores = open_stores(Config(data_dir=data), read_only=True)
    try:
        reasons = [e.data.reason for e in stores.log.read("demo-mcp") if isinstance(e.data, RequestHeader)]
    finally:
        stores.close()
    assert reasons == ["initial", "change"]


def test_without_node_the_demo_says_so_in_one_line_and_skips_demo_mcp(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    result = _demo(tmp_path / "data", cli_env(PATH=f"{bin_dir}:/usr/sbin:/sbin", FOLDLINE_DEMO_MCP_SERVER=""))
    ids = [s["id"] for s in result["sessions"]]
    assert ids == ["demo-000", "demo-001", "demo-think", "demo-responses", "demo-approval", "demo-structured"]
    [line] = result["skipped"]
    assert line.startswith("demo-mcp skipped: Node.js (node) is not on PATH")
    assert "\n" not in line


def test_without_the_mcp_extra_the_demo_names_it_and_skips_demo_mcp(tmp_path: Path) -> None:
    result = _demo(tmp_path / "data", cli_env(FOLDLINE_DEMO_MCP_SERVER=""), block_mcp=True)
    [line] = result["skipped"]
    assert "demo-mcp skipped" in line
    assert "'mcp' extra" in line
