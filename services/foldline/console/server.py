"""``foldline console``'s server: the stores opened read-only, the app on uvicorn, the address checked first.

The console binds to loopback by default. Binding to any other address needs ``FOLDLINE_CONSOLE_TOKEN``
(:attr:`foldline.config.ConsoleConfig.token`): without one it refuses to start (:class:`~foldline.errors.ConfigError`,
one line), and with one every request must carry it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config, open_stores
from ..config.extras import require
from ..config.prices import load_price_table
from ..errors import ConfigError

__all__ = ["DECISIONS_REFUSED", "ConsoleServer", "check_bind", "is_loopback", "start"]

DECISIONS_REFUSED = (
    "--allow-decisions: approve and deny act on durable pauses (approval requests in the log), which this build "
    "does not log yet, so there is nothing the console could decide; start it without --allow-decisions"
)


def is_loopback(bind: str) -> bool:
    """Whether ``bind`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be loopback


def check_bind(bind: str, token: str | None) -> None:
    """Refuse an address beyond loopback without a token."""
    if not is_loopback(bind) and not token:
        raise ConfigError(
            f"the console would listen on {bind}, beyond loopback, without a token: set FOLDLINE_CONSOLE_TOKEN (every "
            "request must then carry it), or bind to 127.0.0.1"
        )


@dataclass
class ConsoleServer:
    """A console listening on a bound socket; :meth:`serve` runs it until stopped (:meth:`stop`)."""

    url: str
    host: str
    port: int
    server: object  # uvicorn.Server
    sock: socket.socket
    close_data: Callable[[], None]
    sessions: int

    def serve(self) -> None:
        import uvicorn

        assert isinstance(self.server, uvicorn.Server)
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.close_data()

    def stop(self) -> None:
        import uvicorn

        assert isinstance(self.server, uvicorn.Server)
        self.server.should_exit = True


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ConfigError(f"the console cannot listen on {host!r}: {exc.strerror or exc}") from exc
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        taken = "the port is already in use" if exc.errno == 98 else str(exc.strerror or exc)
        raise ConfigError(
            f"the console cannot listen on {host}:{port}: {taken}; pass another --port (0 picks a free one)"
        ) from exc
    sock.listen(128)
    sock.setblocking(False)
    return sock


def start(config: Config, *, poll_s: float = 0.5, warm: bool = True) -> ConsoleServer:
    """Open the stores read-only, bind the socket and build the app; :meth:`ConsoleServer.serve` then serves.

    ``warm``: build the session index in the background at once, so the first list does not wait for it.
    """
    require("console", what="foldline console")
    import uvicorn

    from .app import ConsoleOptions, create_app
    from .data import ConsoleData

    settings = config.console
    check_bind(settings.bind, settings.token)
    table = load_price_table(config.prices)
    stores = open_stores(config, read_only=True)
    try:
        sock = _listen(settings.bind, settings.port)
    except BaseException:
        stores.close()
        raise
    data = ConsoleData(stores, table)
    app = create_app(data, ConsoleOptions(token=settings.token, poll_s=poll_s))
    port = sock.getsockname()[1]
    shown_host = f"[{settings.bind.strip('[]')}]" if ":" in settings.bind else settings.bind
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    )
    sessions = len(stores.log.heads())
    if warm:
        threading.Thread(target=_warm, args=(data,), name="console-index", daemon=True).start()
    return ConsoleServer(f"http://{shown_host}:{port}/", settings.bind, port, server, sock, data.close, sessions)


def _warm(data: object) -> None:
    from ..errors import FoldlineError
    from .data import ConsoleData

    assert isinstance(data, ConsoleData)
    with contextlib.suppress(FoldlineError):  # the first page that needs the index reports it
        data.index.refresh(force=True)
