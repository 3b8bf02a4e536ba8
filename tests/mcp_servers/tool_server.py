"""An MCP server written with the mcp SDK (its MCPServer), for the tests: ``python -m tests.mcp_servers.tool_server
stdio`` or ``... http PORT``.

Tools: ``add``, ``slow`` (sleeps; appends "start"/"stop" lines to $TOOL_SERVER_JOURNAL), ``grow`` (registers the
tool ``extra`` and tells subscribers the list changed), ``crash`` (the process exits at once), ``picture`` (a PNG),
``weather`` (structured content), ``reading`` (parameters declared out of alphabetical order) and ``whoami`` (the
request's Authorization header, over HTTP). When the file $TOOL_SERVER_REFUSE names exists, the server exits at start
(a server that cannot be restarted).
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image
from pydantic import BaseModel, Field

server = MCPServer("foldline-test-tools")


def _journal(line: str) -> None:
    path = os.environ.get("TOOL_SERVER_JOURNAL")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: Annotated[float, Field(description="how long to take")]) -> str:
    """Take a while, then say so."""
    _journal(f"start {seconds}")
    try:
        await asyncio.sleep(seconds)
    finally:
        _journal(f"stop {seconds}")
    return f"slept {seconds}"


def extra(text: str) -> str:
    """A tool that appears when grow is called."""
    return text[::-1]


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the tool `extra` to this server's list."""
    server.add_tool(extra)
    await ctx.notify_tools_changed()
    return "grown"


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes((x * 20) % 256 for x in range(width * 3)) for _ in range(height))
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@server.tool()
def picture() -> Image:
    """A small picture."""
    return Image(data=_png(6, 4), format="png")


class Weather(BaseModel):
    city: str
    celsius: float


@server.tool()
def weather(city: str) -> Weather:
    """The weather in a city."""
    return Weather(city=city, celsius=21.5)


@server.tool()
def reading(zeta: str, alpha: int, mid: list[float] | None = None) -> str:
    """Record a probe reading (its parameters are declared zeta, alpha, mid)."""
    return f"recorded {zeta} {alpha} {mid}"


@server.tool()
def whoami(ctx: Context) -> str:
    """The Authorization header of the request (HTTP only)."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return str(headers.get("authorization", "none")) if headers is not None else "no request"


def main() -> None:
    refuse = os.environ.get("TOOL_SERVER_REFUSE")
    if refuse and Path(refuse).exists():
        print("refusing to start", file=sys.stderr)
        sys.exit(1)
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
