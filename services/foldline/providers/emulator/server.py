"""The emulator over real HTTP/1.1 (an asyncio server on one thread), speaking every wire format it emulates.

``POST /v1/messages`` (Anthropic Messages), ``POST /v1/chat/completions`` (OpenAI Chat Completions), ``POST
/v1/responses`` (OpenAI Responses) and ``POST /chat/completions`` (DeepSeek) answer from one
:class:`~.emulator.Emulator`; ``GET /health`` answers ``{"ok":true}``; ``GET /stats`` answers ``{"disconnects",
"faults", "requests"}`` (counts since start: client disconnects mid-answer, faults injected, requests that
reached a model route). Point an adapter at ``server.url`` with httpx's default transport and the whole HTTP
path runs for real.

HTTP framing is h11's (the parser httpcore uses): request lines, headers, ``Content-Length`` and chunked
bodies are read by it, and whatever it refuses is answered with the status it names and the connection
closed — two different ``Content-Length`` values are a 400, a request head larger than ``max_head_bytes`` a
431. :class:`ServerLimits` bounds the rest: a request's head must arrive within ``head_timeout_s`` of its first
byte (else 408 and the connection is closed, so half-sent requests cannot hold sockets open), every read of its
body within ``body_timeout_s``, a body may be at most ``max_body_bytes`` (413), and a kept-alive connection
that sends nothing for ``idle_timeout_s`` is closed (longer than the clients' keep-alive expiry, 30 s in
:class:`~foldline.providers.settings.TransportSettings`, so a client never sends on a connection the server is
closing).

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
import http
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import h11

from ...core.codec import canonical_json
from .emulator import Emulator, EmulatorResponse

__all__ = ["EmulatorServer", "ServerLimits", "serve"]

LISTEN_BACKLOG = 2048  # a fleet opens ~1,000 connections at once
_READ_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one connection may cost the server (see the module docstring)."""

    head_timeout_s: float = 10.0  # from the first byte of a request to the end of its head
    body_timeout_s: float = 30.0  # between two reads of a request body
    idle_timeout_s: float = 75.0  # a kept-alive connection waiting for its next request
    max_head_bytes: int = 64 * 1024  # request line and headers
    max_body_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if min(self.head_timeout_s, self.body_timeout_s, self.idle_timeout_s) <= 0:
            raise ValueError("the emulator server's timeouts must be > 0 seconds")
        if self.max_head_bytes < 1024 or self.max_body_bytes < 1:
            raise ValueError("the emulator server's size limits are too small (head >= 1024 bytes, body >= 1)")


class _Reset(Exception):
    """The answer ends the connection with an RST."""


class _Refused(Exception):
    """The request cannot be served: answer ``status`` (if nothing was sent yet) and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Closed(Exception):
    """The client closed the connection (or it timed out while idle): close quietly."""


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
        limits: ServerLimits | None = None,
    ) -> None:
        self.emulator = emulator if emulator is not None else Emulator()
        self.quiet = quiet
        self.record_bodies = record_bodies
        self.limits = limits if limits is not None else ServerLimits()
        self._lock = threading.Lock()
        self._disconnects = 0
        self._bodies: list[tuple[str, bytes]] = []
        self._sock = socket.create_server((host, port), backlog=LISTEN_BACKLOG, reuse_port=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        # the connections being served and their handlers (touched on the loop's thread only)
        self._open: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

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
        server = await asyncio.start_server(self._connection, sock=self._sock)
        self._ready.set()
        async with server:
            await self._stopped.wait()
            handlers = list(self._open.values())
            for writer in list(self._open):  # every connection ends now: its handler returns on its next read
                writer.transport.abort()
            if handlers:
                await asyncio.wait(handlers, timeout=2.0)

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
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        task = asyncio.current_task()
        assert task is not None
        self._open[writer] = task
        try:
            await self._serve(conn, reader, writer, sock)
        except asyncio.CancelledError:  # the server stops: end the connection, let the handler finish normally
            writer.transport.abort()
        finally:
            self._open.pop(writer, None)

    async def _serve(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sock: Any
    ) -> None:
        try:
            while await self._request(conn, reader, writer):
                conn.start_next_cycle()
        except _Reset:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        except _Refused as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                error = {"error": {"message": exc.message, "type": "invalid_request_error"}, "type": "error"}
                with contextlib.suppress(ConnectionError, OSError, h11.LocalProtocolError):
                    await self._send_whole(conn, writer, exc.status, canonical_json(error), close=True)
        except (_Closed, ConnectionError, OSError, h11.LocalProtocolError):
            pass
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()
            await writer.wait_closed()

    async def _event(self, conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Event:
        """The next event of the request: its head within ``head_timeout_s`` of its first byte (a kept-alive
        connection may wait ``idle_timeout_s`` for that byte), each read of its body within ``body_timeout_s``."""
        limits = self.limits
        deadline: float | None = None
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _Refused(exc.error_status_hint, f"malformed HTTP request: {exc}") from None
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)  # h11.PAUSED is never returned while a request is read
                return event
            if conn.their_state is h11.IDLE:
                if deadline is None and conn.trailing_data[0]:
                    deadline = time.monotonic() + limits.head_timeout_s
                if deadline is None:
                    wait, refuse = limits.idle_timeout_s, None
                else:
                    wait, refuse = max(0.0, deadline - time.monotonic()), "the request head did not arrive in time"
            else:
                wait, refuse = limits.body_timeout_s, "the request body stopped arriving"
            try:
                data = await asyncio.wait_for(reader.read(_READ_SIZE), wait)
            except TimeoutError:
                if refuse is None:
                    raise _Closed from None
                raise _Refused(408, refuse) from None
            if conn.their_state is h11.IDLE and deadline is None and data:
                deadline = time.monotonic() + limits.head_timeout_s
            conn.receive_data(data)

    async def _request(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection is done."""
        event = await self._event(conn, reader)
        if isinstance(event, h11.ConnectionClosed):
            raise _Closed
        if not isinstance(event, h11.Request):
            raise _Refused(400, f"expected a request, got {type(event).__name__}")
        head_size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
        if head_size > self.limits.max_head_bytes:  # h11 bounds only a head still incomplete after a read
            raise _Refused(431, f"request head too large (at most {self.limits.max_head_bytes} bytes)")
        method = event.method.decode("ascii", "replace")
        target = event.target.decode("latin-1")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        path = target.split("?", 1)[0]
        length = headers.get("content-length")
        if length is not None and int(length) > self.limits.max_body_bytes:
            raise _Refused(413, f"request body too large (at most {self.limits.max_body_bytes} bytes)")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if method not in ("GET", "HEAD") and length is None and not chunked:
            raise _Refused(411, "a request body needs a content-length")
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = await self._body(conn, reader)
        if method == "GET" and path == "/health":
            await self._send_whole(conn, writer, 200, b'{"ok":true}')
        elif method == "GET" and path == "/stats":
            stats = {
                "disconnects": self.disconnects,
                "faults": self.emulator.faulted,
                "requests": self.emulator.received,
            }
            await self._send_whole(conn, writer, 200, canonical_json(stats))
        else:
            if self.record_bodies and method == "POST":
                with self._lock:
                    self._bodies.append((path, body))
            answer = self.emulator.handle(method, path, headers, body)
            if not self.quiet:
                sys.stderr.write(f"emulator: {method} {path} {answer.status}\n")
            await self._deliver(conn, writer, answer)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self._event(conn, reader)
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            if not isinstance(event, h11.Data):
                raise _Closed  # the client closed the connection before the end of its body
            size += len(event.data)
            if size > self.limits.max_body_bytes:
                raise _Refused(413, f"request body too large (at most {self.limits.max_body_bytes} bytes)")
            parts.append(bytes(event.data))

    async def _send_whole(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        close: bool = False,
    ) -> None:
        fields = [("content-type", content_type), ("content-length", str(len(body)))]
        if close:
            fields.append(("connection", "close"))
        writer.write(self._head(conn, status, fields) + (conn.send(h11.Data(data=body)) or b""))
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    @staticmethod
    def _head(conn: h11.Connection, status: int, fields: list[tuple[str, str]]) -> bytes:
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Status"
        response = h11.Response(
            status_code=status, headers=[("server", "foldline-emulator"), *fields], reason=reason.encode("ascii")
        )
        return conn.send(response) or b""

    async def _deliver(self, conn: h11.Connection, writer: asyncio.StreamWriter, answer: EmulatorResponse) -> None:
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.reset_after == 0:
            raise _Reset
        fields = [("content-type", answer.content_type), *answer.headers]
        try:
            if answer.chunks is None:
                head = self._head(conn, answer.status, [*fields, ("content-length", str(len(answer.body)))])
                if answer.reset_after is not None:  # the head and part of the body, then the RST
                    writer.write(head + answer.body[: answer.reset_after])
                    await writer.drain()
                    raise _Reset
                writer.write(head + (conn.send(h11.Data(data=answer.body)) or b""))
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                return
            writer.write(
                self._head(
                    conn, answer.status, [*fields, ("transfer-encoding", "chunked"), ("cache-control", "no-cache")]
                )
            )
            chunks = answer.chunks if answer.reset_after is None else answer.chunks[: answer.reset_after]
            delay = self.emulator.event_delay_s
            for i, chunk in enumerate(chunks):
                if i and delay:
                    await asyncio.sleep(delay)
                writer.write(conn.send(h11.Data(data=chunk)) or b"")
                await writer.drain()
                if writer.transport.is_closing():
                    raise ConnectionResetError("the client went away")
            if answer.reset_after is not None:
                raise _Reset
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        except ConnectionError:
            with self._lock:
                self._disconnects += 1
            raise


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    emulator: Emulator | None = None,
    on_ready: Callable[[str], None] | None = None,
    quiet: bool = False,
    limits: ServerLimits | None = None,
) -> None:
    """Serve every wire format on ``host:port`` until interrupted. ``on_ready`` gets the base URL."""
    server = EmulatorServer(host, port, emulator=emulator, quiet=quiet, limits=limits)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
