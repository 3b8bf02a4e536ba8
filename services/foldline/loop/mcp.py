"""MCP servers as tool sources: their tools become an agent's tools, rendered at every step like its own.

An :class:`MCPServer` is a server started as a command (stdio) or reached at a URL (Streamable HTTP, with headers
for authorization), through the official ``mcp`` SDK (``pip install 'foldline[mcp]'``). Include it in a
:class:`~foldline.loop.tools.Toolset`; the agent's ``async with`` starts it and stops it (a server process never
outlives the block).

**Names.** The model sees each tool as ``<prefix><tool name>``, the prefix being the server's name and two
underscores (``everything__echo``) unless ``prefix=`` says otherwise (``""``: the server's own names). Characters
the provider APIs refuse in a tool name (anything but letters, digits, ``_`` and ``-``) become ``_``; a name longer
than 64 characters keeps its first 55 and ends in ``_`` and 8 hex digits of the SHA-256 of the whole name. A name
that is still taken — by the agent's own tools, an earlier source, or an earlier tool of the same server — is left
out (and logged), so one name is always one tool.

**The list.** A server's tool list is cached. Before each step the cache is refreshed when it is older than
``refresh_s`` or the server said its list changed (``notifications/tools/list_changed``, or a 2026-07-28
``subscriptions/listen`` event): a hint to list sooner, never needed for correctness, because the loop renders the
tools at every step and compares the header by value — a different list is a ``request/header`` snapshot with
reason ``change``, whatever told us. A tool whose input schema is not valid JSON Schema is left out and logged.

**Failures.** A call's arguments are checked against the tool's schema first (a mismatch is an error result, the
server is not called). A server that dies, breaks the connection or stops answering gives the calls in flight an
error result and a warning in the log; at the next step the agent connects again (a new process for a command). If
that fails its tools are withdrawn — a header change — and it is tried again with a growing pause (up to a
minute); when it is back, so are its tools. An answer that is not MCP is an error result too; the session stays
valid either way.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..core import codec
from ..core.content import TextBlock
from ..core.header import ToolSpec
from ..errors import ConfigError, ToolServerError, ToolServerUnavailable
from .tools import TOOL_NAME, ImageData, OutputPart, ToolOutput, ToolSettings

if TYPE_CHECKING:
    from ..adapters.mcp import McpConnection, Transport

__all__ = ["MCPServer", "model_tool_name"]

log = logging.getLogger("foldline.mcp")

_REFUSED = re.compile(r"[^A-Za-z0-9_-]")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
MAX_RETRY_PAUSE_S = 60.0


def model_tool_name(prefix: str, name: str) -> str:
    """The name the model sees for the server's tool ``name`` (the rule in the module docstring)."""
    whole = prefix + name
    clean = _REFUSED.sub("_", whole)
    if len(clean) > 64:
        clean = clean[:55] + "_" + hashlib.sha256(whole.encode("utf-8")).hexdigest()[:8]
    return clean or "_"


class MCPServer:
    """An MCP server whose tools an agent offers: ``MCPServer("files", command="npx", args=[...])`` or
    ``MCPServer("search", url="https://…/mcp", headers={"Authorization": "Bearer …"})``.

    ``timeout_s`` bounds connecting and listing; ``tool_timeout_s`` is the time limit of its tools' calls (``None``:
    the agent's ``tool_timeout_s``); ``exclusive`` makes each of its calls run alone; ``refresh_s`` is the age at
    which its cached tool list is listed again; ``roots`` are the ``file://`` URIs the client announces to the
    server (MCP's roots); a command's stderr goes to ``stderr`` (default: discarded).

    ``approval`` holds its tools' calls for an approval decision before they run (docs/LOOP.md, "Approvals"):
    ``True`` for every tool, or a function of the tool's name (as the model sees it) and the call's arguments;
    ``idempotent`` says that running any of its calls twice does no more than once (a call a crash interrupted
    is run again).
    """

    def __init__(
        self,
        name: str,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str | None = None,
        timeout_s: float = 30.0,
        tool_timeout_s: float | None = None,
        exclusive: bool = False,
        approval: bool | Callable[[str, dict[str, Any]], bool] = False,
        idempotent: bool = False,
        refresh_s: float = 30.0,
        roots: Sequence[str] = (),
        stderr: TextIO | None = None,
    ) -> None:
        if not _SERVER_NAME.match(name):
            raise ConfigError(
                f"MCP server name {name!r}: use 1 to 32 letters, digits, '_' or '-' (it prefixes tool names)"
            )
        if (command is None) == (url is None):
            raise ConfigError(f"MCP server {name!r}: give either command= (a stdio server) or url= (Streamable HTTP)")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(f"MCP server {name!r}: url must start with http:// or https://, got {url!r}")
        if not timeout_s > 0 or not refresh_s > 0 or (tool_timeout_s is not None and not tool_timeout_s > 0):
            raise ConfigError(f"MCP server {name!r}: timeout_s, refresh_s and tool_timeout_s must be positive")
        self.name = name
        self.prefix = f"{name}__" if prefix is None else prefix
        self.command, self.args, self.env, self.cwd = command, tuple(args), dict(env or {}), cwd
        self.url, self.headers = url, dict(headers or {})
        self.timeout_s, self.refresh_s, self.stderr = timeout_s, refresh_s, stderr
        self.roots = tuple(roots)
        self._restart = False
        if not (isinstance(approval, bool) or callable(approval)):
            raise ConfigError(
                f"MCP server {name!r}: approval must be True, False or a function of the tool name and arguments"
            )
        self._approval = approval
        self._settings = ToolSettings(tool_timeout_s, exclusive, approval is True, idempotent)
        self._per_tool: dict[str, ToolSettings] = {}
        self._conn: McpConnection | None = None
        self._started = False
        self._specs: tuple[ToolSpec, ...] = ()
        self._version = 0
        self._names: dict[str, str] = {}  # model-visible name -> the server's name
        self._checks: dict[str, Callable[[Any], list[str]]] = {}
        self._listed_at = 0.0
        self._stale = False
        self._retry_at = 0.0
        self._pause = 0.0
        self._reported: set[str] = set()
        #: how many times this server was connected (the first start included)
        self.connections = 0

    def __repr__(self) -> str:
        where = f"command={self.command!r}" if self.command is not None else f"url={self.url!r}"
        return f"MCPServer({self.name!r}, {where})"

    # ------------------------------------------------------------------------------------------------ ToolSource

    @property
    def version(self) -> int:
        return self._version

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.alive

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    def settings(self, name: str) -> ToolSettings:
        policy = self._approval
        if isinstance(policy, bool):
            return self._settings
        found = self._per_tool.get(name)
        if found is None:
            s = self._settings
            found = self._per_tool[name] = ToolSettings(
                s.timeout_s, s.exclusive, lambda args: policy(name, args), s.idempotent
            )
        return found

    async def start(self) -> None:
        """Connect and list the tools; :class:`~foldline.errors.ToolServerUnavailable` (or ToolServerError for an
        answer that is not MCP) when the server cannot be used at all."""
        from ..config.extras import require

        require("mcp", what=f"MCP server {self.name!r}")
        self._started = True
        try:
            await self._connect()
        except BaseException:
            self._started = False
            await self._drop()
            raise

    async def stop(self) -> None:
        self._started = False
        await self._drop()

    def set_roots(self, roots: Sequence[str]) -> None:
        """Announce other roots: the server is connected again (a command: restarted) at the next step, and the
        tools it then lists — which may depend on what the client announces — are the ones offered."""
        self.roots = tuple(roots)
        self._restart = True

    async def refresh(self) -> None:
        """Reconnect a lost server where due, list again where the cache is stale; failures are logged."""
        if not self._started:
            return
        now = time.monotonic()
        restarting = self._restart
        if restarting:
            self._restart = False
            await self._drop()
            self._retry_at = 0.0
        conn = self._conn
        if conn is not None and not conn.alive:
            log.warning("MCP server %r: connection lost (%s); connecting again", self.name, conn.lost or "ended")
            await self._drop()
            conn = None
        if conn is None:
            if now < self._retry_at:
                return
            try:
                await self._connect()
                (log.info if restarting else log.warning)("MCP server %r: connected again", self.name)
            except (ToolServerUnavailable, ToolServerError) as exc:
                await self._drop()
                self._pause = min(MAX_RETRY_PAUSE_S, max(1.0, self._pause * 2))
                self._retry_at = time.monotonic() + self._pause
                if self._specs:
                    log.warning("MCP server %r: %s; its tools are withdrawn until it is back", self.name, _text(exc))
                self._set_tools([])
            return
        if self._stale or now - self._listed_at >= self.refresh_s:
            try:
                await self._list()
            except (ToolServerUnavailable, ToolServerError) as exc:
                log.warning("MCP server %r: %s; connecting again at the next step", self.name, _text(exc))
                await self._drop()

    async def call(self, name: str, arguments: str) -> ToolOutput:
        tool = self._names.get(name)
        conn = self._conn
        if tool is None:
            return ToolOutput(f"unknown tool {name!r}: MCP server {self.name!r} does not offer it now", is_error=True)
        if conn is None or not conn.alive:
            why = conn.lost if conn is not None and conn.lost else "is not connected"
            return ToolOutput(
                f"MCP server {self.name!r} {why}; it is connected again at the next step, and its tools are "
                "offered again once it answers",
                is_error=True,
            )
        try:
            args = codec.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return ToolOutput(
                f"the arguments for {name} are not valid JSON ({exc}); the tool was not called", is_error=True
            )
        if not isinstance(args, dict):
            return ToolOutput(f"the arguments for {name} must be a JSON object; the tool was not called", is_error=True)
        problems = self._checks[name](args)
        if problems:
            return ToolOutput(
                f"invalid arguments for {name}: {'; '.join(problems)}. The tool was not called.", is_error=True
            )
        try:
            result = await conn.call_tool(tool, args)
        except (ToolServerUnavailable, ToolServerError) as exc:
            log.warning("MCP server %r: %s; the call of %s is answered with an error", self.name, _text(exc), tool)
            return ToolOutput(f"{exc}; the call's effects, if any, are unknown", is_error=True)
        parts: tuple[OutputPart, ...] = tuple(
            p if isinstance(p, TextBlock) else ImageData(p.data, p.media_type) for p in result.parts
        )
        return ToolOutput(parts, result.is_error)

    # ------------------------------------------------------------------------------------------------- internals

    def _transport(self) -> Transport:
        from ..adapters.mcp import http_endpoint, stdio_command

        if self.command is not None:
            return stdio_command(self.command, self.args, self.env, self.cwd)
        assert self.url is not None
        return http_endpoint(self.url, self.headers, self.timeout_s)

    def _hint(self) -> None:
        self._stale = True

    async def _connect(self) -> None:
        from ..adapters.mcp import McpConnection

        conn = McpConnection(self.name, self._transport(), self.timeout_s, self._hint, self.stderr, self.roots)
        self._conn = conn
        await conn.open()
        self.connections += 1
        await self._list()
        self._pause = 0.0

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _list(self) -> None:
        from ..adapters.mcp import argument_checker, schema_problem

        assert self._conn is not None
        self._stale = False
        listed = await self._conn.list_tools()
        self._listed_at = time.monotonic()
        specs: list[ToolSpec] = []
        names: dict[str, str] = {}
        checks: dict[str, Callable[[Any], list[str]]] = {}
        for tool in listed:
            visible = model_tool_name(self.prefix, tool.name)
            problem = schema_problem(tool.input_schema)
            if tool.needs_tasks:
                problem = "it runs only as an MCP task (taskSupport 'required'), which this client does not offer"
            if problem is None and visible in names:
                problem = f"its name {visible!r} is taken by the server's tool {names[visible]!r}"
            if problem is None and not TOOL_NAME.match(visible):
                problem = f"{visible!r} is not a name the provider APIs accept"
            spec = None
            if problem is None:
                try:
                    spec = ToolSpec(visible, tool.description, tool.input_schema)
                except (TypeError, ValueError) as exc:
                    problem = f"the input schema is not JSON ({exc})"
            if spec is None:
                self._report(f"tool {tool.name!r} is left out: {problem}")
                continue
            specs.append(spec)
            names[visible] = tool.name
            checks[visible] = argument_checker(tool.input_schema)
        self._names, self._checks = names, checks
        self._set_tools(specs)

    def _set_tools(self, specs: list[ToolSpec]) -> None:
        new = tuple(specs)
        if new != self._specs:
            self._specs = new
            self._version += 1
        if not new:
            self._names, self._checks = {}, {}

    def _report(self, line: str) -> None:
        if line not in self._reported:
            self._reported.add(line)
            log.warning("MCP server %r: %s", self.name, line)


def _text(exc: BaseException) -> str:
    """An error's message without the ``MCP server 'x':`` it starts with (the log line names the server)."""
    text = str(exc)
    return text.split(": ", 1)[1] if text.startswith("MCP server ") and ": " in text else text
