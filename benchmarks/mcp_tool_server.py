"""An MCP server (the mcp SDK's MCPServer, over stdio) with 20 tools, for ``bench_tools``: ``python -m
benchmarks.mcp_tool_server NAME``."""

from __future__ import annotations

import sys
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "bench"
    server = MCPServer(name)
    for i in range(20):

        def tool(query: Annotated[str, Field(description="what to look for")], limit: int = 10, i: int = i) -> str:
            return f"{i}: {query[:limit]}"

        server.add_tool(tool, name=f"lookup_{i:02d}", description=f"Look things up in index {i} of {name}.")
    server.run("stdio")


if __name__ == "__main__":
    main()
