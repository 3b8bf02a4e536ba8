"""The emulator over real HTTP/1.1 (an asyncio server on one thread), speaking both wire formats.

``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/chat/completions`` (OpenAI Chat Completions)
answer from one :class:`~.emulator.Emulator`; ``GET /health`` answers ``{"ok":true}``; ``GET /stats`` answers
``{"disconnects", "faults", "requests"}`` (counts since start: client disconnects mid-answer, faults
injected, requests that reached a model route).
Point an adapter at ``server.url`` with httpx's default transport and the whole HTTP path runs for real.

One event loop serves every connection (keep-alive, one request at a time per connection), so a fleet's
thousand connections cost a thousand sockets, not a thousand threads contending for the interpreter. A
streamed answer goes out with chunked transfer encoding, one chunk per event (``event_delay_s`` apart).
Faults are carried out on the socket: a reset closes it with an RST (``SO_LINGER`` 0) before the status line
or after part of the answer; a slow first byte waits before the status line. ``disconnects`` counts answers
whose client went away before their last byte (a cancelled stream); ``bodies`` (when ``record_bodies``)
keeps every request body received, in order.

``serve()`` blocks until interrupted (what ``foldline emulator --port P`` calls);
``EmulatorServer(...).start()`` runs it on a background thread (what tests use; ``port=0`` picks a free one).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
from collections.abc import Callable
from types import TracebackType

from ...core.codec import canonical_json
from .emulator import Emulator, EmulatorResponse

__all__ = ["EmulatorServer", "serve"]

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
LISTEN_BACKLOG = 2048  # a fleet opens ~1,000 connections at once
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 411: "Length Required", 413: "Payload Too Large"}


class _Reset(Exception):
    """The answer ends the connection with an RST."""


class EmulatorServer:
    """An HTTP server around an :class:`Emulator`; a context manager that stops it on exit."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        emulator: Emulator | None = None,
        quiet: bool = True,
        record_bodies: bool = False,
    ) -> None:
        self.emulator = emulator if emulator is not None else Emulator()
        self.quiet = quiet
        self.record_bodies = record_bodies
        self._lock = threading.Lock()
        self._disconnects = 0
        self._bodies: list[tuple[str, bytes]] = []
        self._sock = socket.create_server((host, port), backlog=LISTEN_BACKLOG, reuse_port=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = str(self._sock.getsockname()[0])
        return f"http://{host}:{self.port}"

    @property
    def disconnects(self) -> int:
        """Answers whose client closed the connection before their last byte."""
        with self._lock:
            return self._disconnects

    @property
    def bodies(self) -> list[tuple[str, bytes]]:
        """(path, body) of every request received, in order (only with ``record_bodies``)."""
        with self._lock:
            return list(self._bodies)

    # ------------------------------------------------------------------ running

    def start(self) -> EmulatorServer:
        """Serve on a daemon thread; returns self once it accepts connections."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, name="foldline-emulator", daemon=True)
            self._thread.start()
            self._ready.wait(10)
        return self

    def serve_forever(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self._sock, limit=MAX_HEAD_BYTES)
        self._ready.set()
        async with server:
            await self._stopped.wait()

    def close(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ one connection

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a stream is many small writes
        try:
            while await self._request(reader, writer):
                pass
        except _Reset:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()
            await writer.wait_closed()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await self._reply(writer, 400, b'{"error":{"message":"bad request line","type":"invalid_request_error"}}')
            return False
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        path = target.split("?", 1)[0]
        if method == "GET":
            if path == "/health":
                await self._reply(writer, 200, b'{"ok":true}')
            elif path == "/stats":
                stats = {
                    "disconnects": self.disconnects,
                    "faults": self.emulator.faulted,
                    "requests": self.emulator.received,
                }
                await self._reply(writer, 200, canonical_json(stats))
            else:
                answer = self.emulator.handle("GET", path, {}, b"")
                await self._reply(writer, answer.status, answer.body, answer.content_type)
            return headers.get("connection", "").lower() != "close"
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            await self._reply(
                writer, 411, b'{"error":{"message":"content-length required","type":"invalid_request_error"}}'
            )
            return False
        size = int(length)
        if size > MAX_BODY_BYTES:
            await self._reply(
                writer, 413, b'{"error":{"message":"request body too large","type":"invalid_request_error"}}'
            )
            return False
        body = await reader.readexactly(size)
        if self.record_bodies:
            with self._lock:
                self._bodies.append((path, body))
        answer = self.emulator.handle(method, path, headers, body)
        if not self.quiet:
            sys.stderr.write(f"emulator: {method} {path} {answer.status}\n")
        await self._deliver(writer, answer)
        return headers.get("connection", "").lower() != "close"

    async def _reply(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json"
    ) -> None:
        writer.write(_head(status, (("content-type", content_type), ("content-length", str(len(body))))) + body)
        await writer.drain()

    async def _deliver(self, writer: asyncio.StreamWriter, answer: EmulatorResponse) -> None:
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.reset_after == 0:
            raise _Reset
        fields = [("content-type", answer.content_type), *answer.headers]
        try:
            if answer.chunks is None:
                body = answer.body if answer.reset_after is None else answer.body[: answer.reset_after]
                writer.write(_head(answer.status, (*fields, ("content-length", str(len(answer.body))))) + body)
                await writer.drain()
            else:
                writer.write(
                    _head(answer.status, (*fields, ("transfer-encoding", "chunked"), ("cache-control", "no-cache")))
                )
                chunks = answer.chunks if answer.reset_after is None else answer.chunks[: answer.reset_after]
                delay = self.emulator.event_delay_s
                for i, chunk in enumerate(chunks):
                    if i and delay:
                        await asyncio.sleep(delay)
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                    if writer.transport.is_closing():
                        raise ConnectionResetError("the client went away")
                if answer.reset_after is None:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
        except ConnectionError:
            with self._lock:
                self._disconnects += 1
            raise
        if answer.reset_after is not None:
            raise _Reset


def _head(status: int, fields: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> bytes:
    reason = _REASONS.get(status, "Status")
    lines = [f"HTTP/1.1 {status} {reason}", "server: foldline-emulator", *(f"{k}: {v}" for k, v in fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    emulator: Emulator | None = None,
    on_ready: Callable[[str], None] | None = None,
    quiet: bool = False,
) -> None:
    """Serve both wire formats on ``host:port`` until interrupted. ``on_ready`` gets the base URL."""
    server = EmulatorServer(host, port, emulator=emulator, quiet=quiet)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
