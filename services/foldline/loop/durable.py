"""A loop's append that waits out a log that does not answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ..core.events import Envelope
from ..errors import ConflictError, StoreUnavailable
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
    deadline = time.monotonic() + outage_s
    pause = 0.05
    while True:
        try:
            await log.append_async(session_id, start, events, lease=lease)
            return
        except StoreUnavailable:
            if time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 2.0)
        try:
            landed = await log.read_async(session_id, start, start + len(events))
        except StoreUnavailable:
            continue
        if landed == list(events):
            return  # the append that "failed" had committed
        if landed:
            raise ConflictError(session_id, start, start + len(landed))
