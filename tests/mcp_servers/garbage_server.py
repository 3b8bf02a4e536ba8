"""A stdio "MCP server" that answers the handshake properly and then garbage, written by hand (no SDK), for the
tests: its tool list holds a tool whose schema is not JSON Schema, one whose schema is not an object, a name the
provider APIs refuse and a name taken twice (with ``--not-object``, also a tool whose schema is not an object, which
the SDK refuses with the whole list); calling ``ok`` answers a result that is not MCP; calling ``mute``
writes a line that is not JSON and never answers.
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {"name": "ok", "description": "Fine.", "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    {"name": "badschema", "description": "Bad.", "inputSchema": {"type": "object", "properties": {"x": {"type": 12}}}},
    {"name": "two.names", "description": "Sanitized.", "inputSchema": {"type": "object"}},
    {"name": "two_names", "description": "Taken after sanitizing.", "inputSchema": {"type": "object"}},
    {"name": "mute", "description": "Never answers.", "inputSchema": {"type": "object"}},
]


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        method, ident = msg.get("method"), msg.get("id")
        if ident is None:
            continue
        if method == "initialize":
            result = {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "garbage", "version": "0"},
            }
            send({"jsonrpc": "2.0", "id": ident, "result": result})
        elif method == "tools/list" and "--not-object" in sys.argv:  # a list the SDK refuses as a whole
            listed = [*TOOLS, {"name": "notobject", "description": "Not an object.", "inputSchema": {"type": "string"}}]
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": listed}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
        elif method == "tools/call" and msg["params"]["name"] == "mute":
            sys.stdout.write("this is not JSON\n")
            sys.stdout.flush()
        elif method == "tools/call":
            send({"jsonrpc": "2.0", "id": ident, "result": {"content": "not a list", "isError": "maybe"}})
        else:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
