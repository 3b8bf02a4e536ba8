"""Settings every test process starts with.

``foldline demo`` runs ``demo-mcp`` on a real MCP server wherever Node is; the tests of the demo's other sessions
run it with that session off (``FOLDLINE_DEMO_MCP_SERVER=off``), and tests/mcp/ turn it on with the server that
``deploy/local/mcp.sh install`` installs.
"""

from __future__ import annotations

import os

os.environ.setdefault("FOLDLINE_DEMO_MCP_SERVER", "off")
