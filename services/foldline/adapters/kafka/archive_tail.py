"""One reader over a session's archive and its Kafka tail.

:class:`ArchiveAndTail` is where the Kafka log reads every range of events it reads — ``read``, the full
reads that load a session's rules before it is appended to, and anything else from seq 0. Seqs below the
session's archive watermark come from the archive (:class:`~foldline.ports.archive.ArchiveReader`,
every segment digest-checked), the seqs at and above it from the topic, by the offsets the index names.

The watermark it uses is the one the archive reader knows (it keeps manifests it has read): at most the
archive's. Seqs between it and the archive's are read from Kafka while Kafka still has them; when Kafka
has deleted some (:class:`~foldline.errors.EventsExpired`), the manifest is read again and the range is
retried from the archive. Only when neither holds an event does the read fail — with ``EventsExpired``
naming the seq, never a shorter session. The result is checked to be gapless across the seam.

An archive store that does not answer (``StoreUnavailable``) does not stop a read Kafka can serve alone:
the range is read from the topic, and only a seq Kafka no longer has makes the read fail (still
``StoreUnavailable``: the archive is needed and not there).
"""

from __future__ import annotations

from ...core.events import Envelope
from ...errors import ArchiveAhead, EventsExpired, FormatError, StoreUnavailable
from ...ports.archive import ArchiveReader
from .index import SessionState
from .reader import SessionReader

__all__ = ["ArchiveAndTail"]


class ArchiveAndTail:
    """Events of a session from its archive (below the watermark) and the topic (the tail); see the module."""

    def __init__(self, reader: SessionReader, archive: ArchiveReader | None) -> None:
        self.reader = reader
        self.archive = archive

    def events(
        self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float
    ) -> list[Envelope]:
        """Events ``from_seq`` up to ``to_seq`` (exclusive, at most the head ``state`` names)."""
        archive = self.archive
        if archive is None:
            return self.reader.events(session_id, state, from_seq, to_seq, deadline)
        refresh = False
        while True:
            try:
                watermark = archive.watermark(session_id, refresh=refresh)
            except StoreUnavailable:
                if refresh:
                    raise
                return self._tail_only(session_id, state, from_seq, to_seq, deadline)
            if watermark > state.next_seq:
                raise ArchiveAhead(f"the archive of session {session_id!r}", session_id, watermark, state.next_seq)
            out = archive.read(session_id, from_seq, min(watermark, to_seq)) if from_seq < watermark else []
            start = max(from_seq, watermark)
            try:
                if start < to_seq:
                    out += self.reader.events(session_id, state, start, to_seq, deadline)
            except EventsExpired as exc:
                if refresh:
                    raise EventsExpired(
                        session_id,
                        exc.first_seq,
                        f"Kafka deleted it and the archive holds only seqs below {watermark}; the archiver fell behind "
                        "the topic's retention (see docs/RETENTION.md, 'When the archiver falls behind')",
                    ) from exc
                refresh = True  # the archive may have moved past what this process knew: ask again
                continue
            for i, env in enumerate(out):
                if env.seq != from_seq + i:
                    raise FormatError(
                        "seq-gapless",
                        f"session {session_id!r}: the read across the archive (below seq {watermark}) and Kafka "
                        f"holds seq {env.seq} where {from_seq + i} belongs",
                        seq=from_seq + i,
                    )
            return out

    def _tail_only(
        self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float
    ) -> list[Envelope]:
        """The archive does not answer: Kafka alone serves the read while it holds every event of it."""
        try:
            return self.reader.events(session_id, state, from_seq, to_seq, deadline)
        except EventsExpired as exc:
            raise StoreUnavailable(
                f"session {session_id!r}: event seq {exc.first_seq} is only in the archive, which does not answer; "
                "retry when the archive store is reachable"
            ) from exc
