"""The emulator in process: an httpx transport that answers from an :class:`~.emulator.Emulator`."""

from __future__ import annotations

import httpx

from .emulator import Emulator

__all__ = ["EmulatorTransport"]


class EmulatorTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that answers from an in-process :class:`Emulator` — no socket, same bytes.

    The adapters' real serializers and HTTP code run unchanged; only the network is skipped.
    """

    def __init__(self, emulator: Emulator | None = None) -> None:
        self.emulator = emulator if emulator is not None else Emulator()

    def _respond(self, request: httpx.Request, body: bytes) -> httpx.Response:
        answer = self.emulator.handle(request.method, request.url.path, request.headers, body)
        return httpx.Response(answer.status, headers={"content-type": answer.content_type}, content=answer.body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, await request.aread())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, request.read())
