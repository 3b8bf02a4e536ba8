"""The emulator over real HTTP (stdlib ``ThreadingHTTPServer``), speaking both wire formats.

``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/chat/completions`` (OpenAI Chat Completions)
answer from one :class:`~.emulator.Emulator`; ``GET /health`` answers ``{"ok":true}``.
Point an adapter at ``server.url`` with httpx's default transport and the whole HTTP path runs for real.

``serve()`` blocks until interrupted (what ``foldline emulator --port P`` calls);
``EmulatorServer(...).start()`` runs it on a background thread (what tests use; ``port=0`` picks a free one).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from .emulator import Emulator

__all__ = ["EmulatorServer", "serve"]

MAX_BODY_BYTES = 64 * 1024 * 1024


def _handler(emulator: Emulator, quiet: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "foldline-emulator"

        def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = self.headers.get("content-length")
            if length is None or not length.isdigit():
                self._reply(411, b'{"error":{"message":"content-length required","type":"invalid_request_error"}}')
                return
            size = int(length)
            if size > MAX_BODY_BYTES:
                self._reply(413, b'{"error":{"message":"request body too large","type":"invalid_request_error"}}')
                self.close_connection = True
                return
            body = self.rfile.read(size)
            path = self.path.split("?", 1)[0]
            headers = dict(self.headers.items())
            answer = emulator.handle("POST", path, headers, body)
            self._reply(answer.status, answer.body, answer.content_type)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/health":
                self._reply(200, b'{"ok":true}')
                return
            answer = emulator.handle("GET", self.path.split("?", 1)[0], {}, b"")
            self._reply(answer.status, answer.body, answer.content_type)

        def log_message(self, format: str, *args: object) -> None:
            if not quiet:
                sys.stderr.write(f"emulator: {self.address_string()} {format % args}\n")

    return Handler


class EmulatorServer:
    """An HTTP server around an :class:`Emulator`; a context manager that stops it on exit."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, emulator: Emulator | None = None, quiet: bool = True
    ) -> None:
        self.emulator = emulator if emulator is not None else Emulator()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self.emulator, quiet))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._httpd.server_address[0])
        return f"http://{host}:{self.port}"

    def start(self) -> EmulatorServer:
        """Serve on a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="foldline-emulator", daemon=True
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


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
