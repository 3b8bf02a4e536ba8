"""Putting archived sessions back into a log (``foldline restore``): a lost cluster rebuilt from the archive.

:func:`restore_session` appends a session's archived events to a log under the log's fencing rules:

* it acquires the session's writer lease first (a new epoch: any other writer of the session is fenced
  from then on) and appends with that lease and ``expected_seq``, in batches, so an append racing it
  fails (``ConflictError`` / ``FencedError``) instead of interleaving;
* a log that already holds a prefix of the session (a restore stopped half way, or a log that kept part
  of it) must hold exactly the archive's events there — compared event by event — and only the rest is
  appended; a log that holds more than the archive is left alone once its prefix matched.

The log must be read without the archive (``kafka_log(config, archive=False)``): comparing the archive
with itself would prove nothing. Restoring twice is a no-op the second time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArchiveCorrupt
from ..ports.archive import ArchiveReader
from ..ports.event_log import EventLog

__all__ = ["RestoreResult", "restore_session"]

_BATCH = 2000


@dataclass(frozen=True, slots=True)
class RestoreResult:
    session_id: str
    archived: int  # events in the archive
    present: int  # events the log held before
    appended: int

    @property
    def head(self) -> int:
        return self.present + self.appended


def restore_session(archive: ArchiveReader, log: EventLog, session_id: str, *, batch: int = _BATCH) -> RestoreResult:
    """Append the archived events of ``session_id`` that ``log`` lacks; see the module docstring."""
    archived = archive.watermark(session_id, refresh=True)
    present = log.head(session_id)
    compare = min(present, archived)
    if compare:
        held = log.read_stored(session_id, 0, compare)  # as stored: sealed content stays sealed, as archived
        expected = archive.read(session_id, 0, compare)
        for a, b in zip(held, expected, strict=True):
            if a != b:
                raise ArchiveCorrupt(
                    f"the archive of session {session_id!r}",
                    f"event seq {a.seq} differs between the log and the archive; the log holds another history of "
                    "this session — nothing was restored",
                )
    if present >= archived:
        return RestoreResult(session_id, archived, present, 0)
    lease = log.acquire(session_id)
    head = present
    while head < archived:
        events = archive.read(session_id, head, min(archived, head + batch))
        head = log.append(session_id, head, events, lease=lease)
    return RestoreResult(session_id, archived, present, head - present)
