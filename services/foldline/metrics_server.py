"""The ``/metrics`` + ``/healthz`` + ``/readyz`` endpoint every foldline process can serve.

``serve(port, registry, ready=..., live=...)`` starts a small threaded HTTP server on a daemon thread:
``/metrics`` is the Prometheus exposition of ``registry`` (:mod:`foldline.metrics`), ``/healthz`` answers
200 while ``live()`` holds and ``/readyz`` while ``ready`` holds — one check, or one per dependency by name
(``{"redis": ..., "s3": ...}``), and then a 503 names each one that is not ready, one per line. A port that
is taken is a typed :class:`~foldline.errors.MetricsServerError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .errors import MetricsServerError

__all__ = ["HealthServer", "Readiness", "ReadyCheck", "serve"]

#: A probe's check: true when ready; an exception counts as not ready and its message is the reason.
ReadyCheck = Callable[[], bool]
#: One check, or one per dependency by name (each is run; the answer names those that are not ready).
Readiness = ReadyCheck | Mapping[str, ReadyCheck]


def _probe(fn: ReadyCheck) -> str | None:
    """``None`` when ``fn`` says ready, else why not (one line)."""
    try:
        ok = fn()
    except Exception as exc:  # a failing probe must answer, not crash the server thread
        return " ".join(f"{type(exc).__name__}: {exc}".split())
    return None if ok else "not ready"


class HealthServer:
    """A running ``/metrics`` + ``/healthz`` + ``/readyz`` server on a daemon thread."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{host!s}:{self.port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HealthServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(
    port: int,
    registry: CollectorRegistry,
    *,
    ready: Readiness | None = None,
    live: ReadyCheck | None = None,
    host: str = "0.0.0.0",
) -> HealthServer:
    """Serve ``registry`` on ``http://host:port/metrics``; ``port=0`` picks a free port.

    ``/healthz`` answers 200 while ``live()`` (default: always) is true — the process is not wedged;
    ``/readyz`` answers 200 while ``ready`` (default: always) holds — e.g. the projector holds its
    partitions and reaches Redis. A check that raises counts as false and its message is returned. With one
    check per dependency (a mapping), every check runs and a 503 lists each failing one as ``name: reason``.
    """

    def check(fn: Readiness | None) -> tuple[int, bytes]:
        if fn is None:
            return 200, b"ok\n"
        if isinstance(fn, Mapping):
            failing = [f"{name}: {why}" for name, c in fn.items() if (why := _probe(c)) is not None]
        else:
            failing = [why] if (why := _probe(fn)) is not None else []
        return (503, "".join(f"{f}\n" for f in failing).encode()) if failing else (200, b"ok\n")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            content_type = "text/plain; charset=utf-8"
            if path == "/metrics":
                status, body, content_type = 200, generate_latest(registry), CONTENT_TYPE_LATEST
            elif path == "/healthz":
                status, body = check(live)
            elif path == "/readyz":
                status, body = check(ready)
            else:
                status, body = 404, b"not found: try /metrics, /healthz or /readyz\n"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes and probes are not worth a log line each

    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise MetricsServerError(
            f"cannot serve metrics on {host}:{port}: {exc}; choose another --metrics-port"
        ) from exc
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name=f"foldline-metrics-{port}", daemon=True)
    thread.start()
    return HealthServer(httpd, thread)
