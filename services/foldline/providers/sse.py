"""Server-sent events: an incremental decoder for answers, and the encoder the emulator writes them with.

The decoder follows the event-stream interpretation of the WHATWG HTML standard (§9.2.6): lines end in
CRLF, LF or CR (a CR at the end of a chunk waits for the next chunk, which may start with its LF); a line
starting with ``:`` is a comment; ``field: value`` loses one space after the colon; ``data`` lines join with
LF; an empty line dispatches the event (an event without data is dropped); a leading byte-order mark is
skipped; ``id`` and ``retry`` are read and ignored (model answers are not resumable). Two things the
standard tolerates are errors here, because an answer must be logged exactly or not at all: bytes that are
not UTF-8, and a stream that ends in the middle of an event (:meth:`SSEDecoder.close` reports it).

Feeding the same bytes in any chunking yields the same events (a property test holds it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ProviderStreamError

__all__ = ["SSEDecoder", "ServerSentEvent", "encode_sse"]

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its ``event`` name (None when the stream gives none) and its data text."""

    event: str | None
    data: str


def encode_sse(event: str | None, data: str) -> bytes:
    """One event as stream bytes (``data`` must not hold a line break; canonical JSON never does)."""
    if "\n" in data or "\r" in data:
        raise ValueError("an SSE data field written on one line cannot hold a line break")
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data}\n\n".encode()


class SSEDecoder:
    """Bytes in, events out. One decoder per answer."""

    __slots__ = ("_buffer", "_data", "_event", "_pending", "_started")

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._event: str | None = None
        self._data: list[str] = []
        self._pending = False  # a field line was read since the last dispatch

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events completed by ``chunk``."""
        buffer = self._buffer + chunk if self._buffer else chunk
        if not self._started:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._buffer = buffer
                return []
            self._started = True
            if buffer.startswith(_BOM):
                buffer = buffer[len(_BOM) :]
        events: list[ServerSentEvent] = []
        pos = 0
        end = len(buffer)
        for m in _EOL.finditer(buffer):
            if m.end() == end and m.group() == b"\r":
                break  # a CRLF may be split across chunks: wait for the next byte
            self._line(buffer[pos : m.start()], events)
            pos = m.end()
        self._buffer = buffer[pos:]
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of stream: the last events, or :class:`ProviderStreamError` when it stopped inside an event."""
        events: list[ServerSentEvent] = []
        rest, self._buffer = self._buffer, b""
        pos = 0
        for m in _EOL.finditer(rest):
            self._line(rest[pos : m.start()], events)
            pos = m.end()
        if rest[pos:]:
            self._pending = True  # an unterminated last line
        if self._pending:
            raise ProviderStreamError(
                "the event stream ended in the middle of an event (no blank line after its last field)",
                error_type="truncated-stream",
            )
        return events

    def _line(self, raw: bytes, events: list[ServerSentEvent]) -> None:
        if not raw:
            if self._data:
                events.append(ServerSentEvent(self._event, "\n".join(self._data)))
            self._event = None
            self._data = []
            self._pending = False
            return
        if raw[0] == 0x3A:  # ':' comment
            return
        name, colon, value = raw.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        try:
            text = value.decode("utf-8")
            field = name.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProviderStreamError(
                f"the event stream is not UTF-8 ({exc.reason} at byte {exc.start} of a line)",
                error_type="malformed-stream",
            ) from None
        self._pending = True
        if field == "data":
            self._data.append(text)
        elif field == "event":
            self._event = text
        # "id", "retry" and unknown fields are ignored, as the standard says
