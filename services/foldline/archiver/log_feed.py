"""An archiver's source on a log that keeps every event (the embedded SQLite log): new events by polling.

:class:`LogFeed` asks the log for its sessions and heads and reads what is new since the last poll (a
session met for the first time: since its archive watermark). Events are read as stored — sealed content
stays sealed (docs/ERASURE.md) — and turned into Avro bodies under the current event schema, so a backup
of the embedded log is the same archive as the Kafka one — it can be restored into either. Every event a
log returns is the log's: there are no foreign records to tell apart (:meth:`LogFeed.offsets` answers
``None``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..adapters.archive import SegmentEncoder, SessionArchive
from ..core.events import Envelope
from ..ports.archive import RawEvent
from ..ports.event_log import EventLog
from .engine import ArchivePolicy

__all__ = ["LogFeed"]


class LogFeed:
    """New events of the sessions of ``log`` that ``policy`` archives; see the module docstring."""

    def __init__(self, log: EventLog, archive: SessionArchive, policy: ArchivePolicy) -> None:
        self.log = log
        self.archive = archive
        self.policy = policy
        self._encoder = SegmentEncoder()
        self._seen: dict[str, int] = {}

    def poll(self) -> list[RawEvent]:
        out: list[RawEvent] = []
        for sid in self.log.sessions():
            if not self.policy.archives(sid):
                continue
            head = self.log.head(sid)
            seen = self._seen.get(sid)
            if seen is None:
                seen = min(self.archive.watermark(sid), head)
            if head > seen:
                out += [self._raw(sid, e) for e in self.log.read_stored(sid, seen, head)]
            self._seen[sid] = head
        return out

    def _raw(self, session_id: str, env: Envelope) -> RawEvent:
        return RawEvent(session_id, env.seq, env.type, env.time, self._encoder.body(env), self._encoder.fingerprint)

    def offsets(self, session_ids: Sequence[str]) -> Mapping[str, Sequence[int]] | None:
        return None

    def fetch(self, session_id: str, from_seq: int, to_seq: int) -> list[RawEvent]:
        return [self._raw(session_id, e) for e in self.log.read_stored(session_id, from_seq, to_seq)]

    def close(self) -> None:
        self.log.close()
