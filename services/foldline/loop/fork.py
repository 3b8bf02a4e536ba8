"""Forking a session: write a child whose log begins with the parent's prefix (see ``core/fork.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.events import Envelope, RequestHeader
from ..core.fork import fork_seed
from ..errors import ConflictError, SessionExists, SessionNotFound
from ..ports.event_log import EventLog
from .options import wall_clock_ms

__all__ = ["ForkResult", "fork_session"]


@dataclass(frozen=True, slots=True)
class ForkResult:
    child_id: str
    parent_id: str
    seed_length: int
    events: tuple[Envelope, ...]

    @property
    def override_seq(self) -> int | None:
        """The seq of the override snapshot (model / system prompt), when the fork has one."""
        own = self.events[self.seed_length :]
        return next((e.seq for e in own if isinstance(e.data, RequestHeader)), None)


def fork_session(
    log: EventLog,
    parent_id: str,
    at_seq: int,
    child_id: str | None = None,
    *,
    model: str | None = None,
    system: str | None = None,
    clock: Callable[[], int] = wall_clock_ms,
) -> ForkResult:
    """Create ``child_id`` (default ``<parent>-fork-<at_seq>``) from ``parent_id``'s events ``0..at_seq``.

    One all-or-nothing append; a child id that already has events raises SessionExists.
    """
    parent = log.read(parent_id)
    if not parent:
        raise SessionNotFound(parent_id)
    child = child_id or f"{parent_id}-fork-{at_seq}"
    if child == parent_id:
        raise SessionExists(child)
    if log.head(child) != 0:
        raise SessionExists(child)
    events = fork_seed(parent, parent_id, at_seq, clock(), model=model, system=system)
    if log.sealer is not None:  # the child holds a copy of the parent's content: erasing its subject erases both
        log.sealer.inherit(child, parent_id)
    lease = log.acquire(child)
    try:
        log.append(child, 0, events, lease=lease)
    except ConflictError:
        raise SessionExists(child) from None
    return ForkResult(child, parent_id, at_seq + 1, tuple(events))
