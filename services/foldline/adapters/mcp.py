"""One connection to an MCP server through the official ``mcp`` SDK; its errors are translated here.

:class:`McpConnection` opens a server — a command spoken to over its stdin and stdout, or a Streamable HTTP
endpoint — lists its tools and calls them. The SDK's client lives inside ``async with`` blocks that must be left
by the task that entered them, so each connection is kept by a task of its own: opening starts that task and waits
until the server answered the handshake, closing tells it to leave (which stops a server process: the SDK closes
its stdin, then terminates and kills its process tree) and waits until it has. Any task may list and call.

What the SDK raises never leaves this module as it is: a connection that closed, broke or did not answer in time is
:class:`~foldline.errors.ToolServerUnavailable` (and the connection is dead from then on); an answer that is not
MCP is :class:`~foldline.errors.ToolServerError`; a JSON-RPC error answer to a call is a result with ``is_error``.
A server's ``notifications/tools/list_changed`` (and, on 2026-07-28 connections, a ``subscriptions/listen``
tools event) calls ``on_list_changed``: a hint to list again, nothing more.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
import mcp_types as types
import pydantic
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp import Client, StdioServerParameters

from ..core import codec
from ..core.content import TextBlock
from ..errors import ToolServerError, ToolServerUnavailable

__all__ = ["McpConnection", "McpImage", "McpResult", "McpTool", "http_endpoint", "stdio_command"]

log = logging.getLogger("foldline.mcp")

#: pages of a tools/list walked at most (a server whose cursor never ends cannot hang a step)
MAX_LIST_PAGES = 100

_LOST = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
    OSError,
    httpx2.TransportError,
)


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool as the server lists it (its own name, not the one the model sees)."""

    name: str
    description: str
    input_schema: Any
    needs_tasks: bool = False  # execution.taskSupport "required": callable only as a task, which this client is not


@dataclass(frozen=True, slots=True)
class McpImage:
    data: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class McpResult:
    """A ``tools/call`` result: its content as text and images, in order, and whether it is an error."""

    parts: tuple[TextBlock | McpImage, ...]
    is_error: bool = False


Transport = Callable[[TextIO], AbstractAsyncContextManager[Any]]


def stdio_command(
    command: str, args: Sequence[str], env: Mapping[str, str] | None, cwd: str | Path | None
) -> Transport:
    """A server started as ``command args`` (its stderr goes to the file the connection is given)."""
    params = StdioServerParameters(command=command, args=list(args), env=dict(env) if env else None, cwd=cwd)

    def open_transport(errlog: TextIO) -> AbstractAsyncContextManager[Any]:
        return stdio_client(params, errlog=errlog)

    return open_transport


def http_endpoint(url: str, headers: Mapping[str, str] | None, timeout_s: float) -> Transport:
    """A Streamable HTTP server at ``url``; ``headers`` go with every request (authorization, say)."""

    @contextlib.asynccontextmanager
    async def open_transport(errlog: TextIO) -> AsyncIterator[Any]:
        # the SDK leaves a client it was given open: it is closed here, with its pooled sockets
        client = create_mcp_http_client(
            headers=dict(headers or {}), timeout=httpx2.Timeout(timeout_s, read=max(timeout_s, 300.0))
        )
        async with client, streamable_http_client(url, http_client=client) as streams:
            yield streams

    return open_transport


@dataclass
class McpConnection:
    """One live connection (see the module docstring). ``server`` names it in every error."""

    server: str
    transport: Transport
    timeout_s: float = 30.0
    on_list_changed: Callable[[], None] = lambda: None
    errlog: TextIO | None = None
    roots: tuple[str, ...] = ()  # file:// URIs the client announces (the roots capability) when not empty
    _client: Client | None = field(default=None, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _failure: BaseException | None = field(default=None, init=False)
    lost: str | None = field(default=None, init=False)  # why the connection is dead, once it is

    @property
    def alive(self) -> bool:
        return self._client is not None and self.lost is None

    async def open(self) -> None:
        """Start the server (or reach it) and complete the handshake, within ``timeout_s``."""
        self._task = asyncio.create_task(self._keep(), name=f"mcp:{self.server}")
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.close()
            raise ToolServerUnavailable(
                self.server, f"did not complete the handshake within {self.timeout_s:g} s"
            ) from None
        if self._client is None:
            await self.close()
            raise ToolServerUnavailable(self.server, f"could not be started or reached: {_describe(self._failure)}")

    async def close(self) -> None:
        """Leave the connection; a server process is stopped (waited for, within a bound) before this returns."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        try:
            async with asyncio.timeout(self.timeout_s + 10):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except BaseException:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            raise
        finally:
            self._client = None

    async def _keep(self) -> None:
        errlog = self.errlog
        owned = None
        if errlog is None:
            owned = errlog = open("/dev/null", "w")  # noqa: SIM115 - closed below, after the server stopped
        try:
            async with Client(
                self.transport(errlog),
                cache=None,
                message_handler=self._on_message,
                read_timeout_seconds=None,
                list_roots_callback=self._list_roots if self.roots else None,
            ) as client:
                self._client = client
                self._ready.set()
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    await self._listen(client)
                await self._stop.wait()
        except BaseException as exc:
            self._failure = exc
            if self.lost is None and self._client is not None:
                self.lost = f"the connection ended: {_describe(exc)}"
        finally:
            self._client = None
            self._ready.set()
            if owned is not None:
                owned.close()

    async def _listen(self, client: Client) -> None:
        """On a 2026-07-28 connection, list changes arrive on a ``subscriptions/listen`` stream: follow it until
        the connection is left (a server without the method gets none: the periodic refresh still finds changes)."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                waiter = asyncio.ensure_future(self._stop.wait())
                try:
                    async for _event in _until(subscription, waiter):
                        self.on_list_changed()
                finally:
                    waiter.cancel()
        except Exception as exc:
            log.debug("MCP server %r: no tools list-changed stream (%s)", self.server, _describe(exc))

    async def _list_roots(self, context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in self.roots])  # type: ignore[arg-type]

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.on_list_changed()
        elif isinstance(message, Exception):
            log.warning("MCP server %r sent something that is not an MCP message: %s", self.server, _describe(message))

    def _live(self) -> Client:
        if self._client is None or self.lost is not None:
            raise ToolServerUnavailable(self.server, self.lost or "is not connected")
        return self._client

    def _lose(self, why: str) -> ToolServerUnavailable:
        self.lost = self.lost or why
        return ToolServerUnavailable(self.server, why)

    async def list_tools(self) -> list[McpTool]:
        """Every tool the server lists now, page after page, within ``timeout_s``."""
        client = self._live()
        tools: list[McpTool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools += [
                        McpTool(
                            t.name,
                            t.description or "",
                            t.input_schema,
                            t.execution is not None and t.execution.task_support == "required",
                        )
                        for t in page.tools
                    ]
                    cursor = page.next_cursor
                    if cursor is None:
                        return tools
        except TimeoutError:
            raise self._lose(f"did not answer tools/list within {self.timeout_s:g} s") from None
        except MCPError as exc:
            raise self._mcp_error("tools/list", exc) from exc
        except pydantic.ValidationError as exc:
            raise ToolServerError(
                self.server, f"answered tools/list with something that is not MCP: {_brief(exc)}"
            ) from exc
        except _LOST as exc:
            raise self._lose(f"the connection broke during tools/list: {_describe(exc)}") from exc
        raise ToolServerError(self.server, f"listed its tools in more than {MAX_LIST_PAGES} pages")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> McpResult:
        """Call ``name``; the caller bounds the time (a cancelled call is cancelled at the server too)."""
        client = self._live()
        try:
            result = await client.call_tool(name, arguments)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                raise self._lose(f"closed the connection while {name} ran (whether it finished is unknown)") from exc
            return McpResult(
                (TextBlock(f"the MCP server refused the call: {exc.error.message} (code {exc.code})"),), True
            )
        except pydantic.ValidationError as exc:
            raise ToolServerError(
                self.server, f"answered the call of {name} with something that is not MCP: {_brief(exc)}"
            ) from exc
        except _LOST as exc:
            raise self._lose(f"the connection broke while {name} ran: {_describe(exc)}") from exc
        return McpResult(_content(result), bool(result.is_error))

    def _mcp_error(self, method: str, exc: MCPError) -> Exception:
        if exc.code == types.CONNECTION_CLOSED:
            return self._lose(f"closed the connection during {method}")
        return ToolServerError(self.server, f"answered {method} with error {exc.code}: {exc.error.message}")


async def _until(subscription: Any, stop: asyncio.Future[Any]) -> Any:
    """The events of ``subscription`` until ``stop`` is done."""
    events = subscription.__aiter__()
    while not stop.done():
        nxt = asyncio.ensure_future(events.__anext__())
        done, _ = await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
        if nxt not in done:
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            return
        try:
            yield nxt.result()
        except StopAsyncIteration:
            return


def _content(result: types.CallToolResult) -> tuple[TextBlock | McpImage, ...]:
    """A result's content as text and images; other kinds (audio, resources, links) as text saying what they are;
    structured content as its JSON text unless a text block already carries that value."""
    parts: list[TextBlock | McpImage] = []
    texts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(TextBlock(block.text))
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            try:
                parts.append(McpImage(base64.b64decode(block.data, validate=True), block.mime_type))
            except (binascii.Error, ValueError):
                parts.append(TextBlock(f"[an image ({block.mime_type}) whose data is not base64: not shown]"))
        elif isinstance(block, types.AudioContent):
            parts.append(TextBlock(f"[audio ({block.mime_type}), not shown: audio is not passed to the model]"))
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(TextBlock(f"[resource {res.uri}]\n{res.text}"))
            else:
                parts.append(TextBlock(f"[resource {res.uri} ({res.mime_type or 'binary'}), not shown: not text]"))
        elif isinstance(block, types.ResourceLink):
            parts.append(TextBlock(f"[resource link: {block.uri} ({block.name})]"))
        else:
            parts.append(TextBlock(f"[a {getattr(block, 'type', type(block).__name__)} block, not shown]"))
    structured = result.structured_content
    if structured is not None:
        text = codec.canonical_json(structured).decode()
        if not any(_same_json(t, structured) for t in texts):
            parts.append(TextBlock(text))
    return tuple(parts)


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(codec.loads(text) == value)
    except ValueError:
        return False


def _brief(exc: pydantic.ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "the result"
    return f"{where}: {first['msg']} ({exc.error_count()} problem(s))"


def _describe(exc: BaseException | None) -> str:
    """The root cause of ``exc`` in one line (exception groups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "no reason given"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be a tool's input schema (``None``: it can): it must be a JSON object, of type
    ``object``, and valid JSON Schema of the dialect it names (2020-12 when it names none, as MCP says)."""
    import jsonschema

    if not isinstance(schema, dict):
        return f"the input schema is a {type(schema).__name__}, not a JSON object"
    if schema.get("type") != "object":
        return f"the input schema's type is {schema.get('type')!r}, not 'object'"
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top"
        return f"the input schema is not valid JSON Schema (at {where}: {exc.message})"
    except Exception as exc:
        return f"the input schema cannot be checked ({_describe(exc)})"
    return None


def argument_checker(schema: dict[str, Any]) -> Callable[[Any], list[str]]:
    """A function that lists what is wrong with arguments against ``schema`` (empty: nothing), each as
    ``where: why``, in a stable order."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema)

    def check(arguments: Any) -> list[str]:
        problems = []
        for err in validator.iter_errors(arguments):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path).lstrip(".")
            problems.append(f"argument `{where}`: {err.message}" if where else err.message)
        return sorted(problems)

    return check
