"""The emulator in process: an httpx transport that answers from an :class:`~.emulator.Emulator`.

Faults happen as they would on a socket: a reset before the first byte raises httpx's ``ReadError`` from
the request; a reset in the middle delivers the status, the headers and the first part of the answer, then
raises ``ReadError`` from the body; a slow first byte holds the answer back (``asyncio.sleep`` on the async
path). A streamed answer arrives event by event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx

from .emulator import Emulator, EmulatorResponse

__all__ = ["EmulatorTransport"]


def _pieces(answer: EmulatorResponse) -> Sequence[bytes]:
    """The answer's body in the pieces it is sent in (a stream: one per event), cut where a reset falls."""
    if answer.chunks is not None:
        pieces: Sequence[bytes] = answer.chunks
        return pieces if answer.reset_after is None else pieces[: answer.reset_after]
    if answer.reset_after is None:
        return (answer.body,)
    return (answer.body[: answer.reset_after],)


def _reset() -> httpx.ReadError:
    return httpx.ReadError("the emulator reset the connection")


class _AsyncBody(httpx.AsyncByteStream):
    def __init__(self, answer: EmulatorResponse, gap_s: float) -> None:
        self._answer = answer
        self._gap_s = gap_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, piece in enumerate(_pieces(self._answer)):
            if i and self._gap_s:
                await asyncio.sleep(self._gap_s)
            yield piece
        if self._answer.reset_after is not None:
            raise _reset()


class _SyncBody(httpx.SyncByteStream):
    def __init__(self, answer: EmulatorResponse, gap_s: float) -> None:
        self._answer = answer
        self._gap_s = gap_s

    def __iter__(self) -> Iterator[bytes]:
        for i, piece in enumerate(_pieces(self._answer)):
            if i and self._gap_s:
                time.sleep(self._gap_s)
            yield piece
        if self._answer.reset_after is not None:
            raise _reset()


class EmulatorTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that answers from an in-process :class:`Emulator` — no socket, same bytes.

    The adapters' real serializers and HTTP code run unchanged; only the network is skipped.
    """

    def __init__(self, emulator: Emulator | None = None) -> None:
        self.emulator = emulator if emulator is not None else Emulator()

    def _answer(self, request: httpx.Request, body: bytes) -> EmulatorResponse:
        return self.emulator.handle(request.method, request.url.path, request.headers, body)

    @staticmethod
    def _headers(answer: EmulatorResponse) -> list[tuple[str, str]]:
        return [("content-type", answer.content_type), *answer.headers]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._answer(request, await request.aread())
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.reset_after == 0:
            raise _reset()
        if answer.chunks is None and answer.reset_after is None:
            return httpx.Response(answer.status, headers=self._headers(answer), content=answer.body)
        return httpx.Response(
            answer.status, headers=self._headers(answer), stream=_AsyncBody(answer, self.emulator.event_delay_s)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._answer(request, request.read())
        if answer.delay_s:
            time.sleep(answer.delay_s)
        if answer.reset_after == 0:
            raise _reset()
        if answer.chunks is None and answer.reset_after is None:
            return httpx.Response(answer.status, headers=self._headers(answer), content=answer.body)
        return httpx.Response(
            answer.status, headers=self._headers(answer), stream=_SyncBody(answer, self.emulator.event_delay_s)
        )
