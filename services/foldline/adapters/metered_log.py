"""An event-log decorator that reports every successful append to an observer (e.g. the loop metrics).

:class:`MeteredEventLog` wraps any :class:`~foldline.ports.event_log.EventLog`. Reads, leases and errors
pass through unchanged; a failed append reports nothing (a fenced one is reported as fenced), so an
observer only ever hears of what the log holds. If the observer fails after a successful append (say it
could not read the log for a gap), the append still succeeds: the failure goes to
:meth:`AppendObserver.observation_failed`. It runs the EventLog contract suite like every other log.

:class:`foldline.metrics.LoopMetrics` is the observer foldline ships: ``MeteredEventLog(log, LoopMetrics(registry))``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..core.events import Envelope
from ..errors import FencedError
from ..ports.event_log import EventLog, WriterLease
from ..ports.inbox import InboxStore

__all__ = ["AppendObserver", "MeteredEventLog"]


class AppendObserver(Protocol):
    """Hears of every event a log durably appended, in seq order per session."""

    def observe_events(
        self,
        session_id: str,
        envelopes: Sequence[Envelope],
        *,
        history: Callable[[int, int], Sequence[Envelope]] | None = None,
    ) -> None:
        """``envelopes`` were appended; ``history(from_seq, to_seq)`` reads events the observer missed."""
        ...

    def observation_failed(self, session_id: str, exc: BaseException) -> None:
        """``observe_events`` raised for an append that succeeded."""
        ...

    def append_fenced(self, session_id: str) -> None:
        """An append was refused with :class:`~foldline.errors.FencedError` (a newer writer holds it)."""
        ...


class MeteredEventLog(EventLog):
    """An :class:`EventLog` that feeds every successful append to ``observer`` (see the module docstring)."""

    def __init__(self, inner: EventLog, observer: AppendObserver) -> None:
        self.inner = inner
        self.observer = observer
        self.sealer = inner.sealer
        self.seals_in_place = inner.seals_in_place

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        try:
            head = self.inner.append(session_id, expected_seq, events, lease=lease)
        except FencedError:
            self.observer.append_fenced(session_id)
            raise
        self._observe(session_id, events)
        return head

    async def append_async(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        try:
            head = await self.inner.append_async(session_id, expected_seq, events, lease=lease)
        except FencedError:
            self.observer.append_fenced(session_id)
            raise
        self._observe(session_id, events)
        return head

    def _observe(self, session_id: str, events: Sequence[Envelope]) -> None:
        try:
            self.observer.observe_events(session_id, events, history=lambda a, b: self.inner.read(session_id, a, b))
        except Exception as exc:  # the events are durable: an observer failure must not look like a failed append
            self.observer.observation_failed(session_id, exc)

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        return self.inner.read(session_id, from_seq, to_seq)

    async def read_async(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        return await self.inner.read_async(session_id, from_seq, to_seq)

    async def acquire_and_read_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        return await self.inner.acquire_and_read_async(session_id)

    def read_stored(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        return self.inner.read_stored(session_id, from_seq, to_seq)

    def erased(self, session_id: str) -> bool:
        return self.inner.erased(session_id)

    def seal_in_place(self, session_id: str) -> int:
        return self.inner.seal_in_place(session_id)

    def scrub(self) -> None:
        self.inner.scrub()

    def head(self, session_id: str) -> int:
        return self.inner.head(session_id)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def heads(self) -> dict[str, int]:
        return self.inner.heads()

    def acquire(self, session_id: str) -> WriterLease:
        return self.inner.acquire(session_id)

    def acquire_and_read(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        return self.inner.acquire_and_read(session_id)

    def inbox(self) -> InboxStore:
        return self.inner.inbox()

    def close(self) -> None:
        self.inner.close()
