"""A loop's append that waits out a log that does not answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..backoff import OUTAGE
from ..core.events import Envelope
from ..errors import ConflictError, TransientError
from ..ports.event_log import EventLog, WriterLease

__all__ = ["append_durably"]


async def append_durably(
    log: EventLog, session_id: str, lease: WriterLease, start: int, events: Sequence[Envelope], outage_s: float
) -> None:
    """Append ``events`` at ``start``, waiting out a log that does not answer for up to ``outage_s``.

    A failure whose outcome is unknown is settled by reading the log back: the batch either is there
    whole (done) or not at all (append again). Refusals (a stale writer, a broken rule, another
    writer's events at ``start``) are raised at once.
    """
    waits = OUTAGE.until(outage_s)
    while True:
        try:
            await log.append_async(session_id, start, events, lease=lease)
            return
        except TransientError:  # an outage: waited out; a refusal is permanent and raised at once
            pause = waits.next()
            if pause is None:
                raise
        await asyncio.sleep(pause)
        try:
            landed = await log.read_async(session_id, start, start + len(events))
        except TransientError:
            continue
        if landed == list(events):
            return  # the append that "failed" had committed
        if landed:
            raise ConflictError(session_id, start, start + len(landed))
