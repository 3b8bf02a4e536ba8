"""The invariant companion: each loop request must equal its rebuild from the raw log prefix.

The rebuild reads the log through the port and folds it in a fresh :class:`~foldline.core.Session`
— no cache shared with the live session — then builds the request with the same
:func:`~foldline.replay.step.request_at` every path uses, so the live cache cannot vouch for itself.
A mismatch raises :class:`~foldline.errors.InvariantViolation` with a readable diff, before anything is
sent; ``on_violation`` (e.g. a metrics counter) hears of every one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import orjson

from ..core.events import Envelope
from ..core.projection import Session
from ..core.request import GenerateOptions, request_to_json
from ..errors import InvariantViolation
from ..ports.event_log import EventLog
from .registry import is_loop_request
from .step import session_request

__all__ = ["InvariantCompanion", "request_diff"]


def request_diff(expected: GenerateOptions, actual: GenerateOptions) -> str:
    """A unified diff of two requests' provider-neutral JSON (rebuilt first, about-to-send second)."""

    def lines(req: GenerateOptions) -> list[str]:
        return (
            orjson.dumps(request_to_json(req), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().split("\n")
        )

    return "\n".join(
        difflib.unified_diff(lines(expected), lines(actual), "rebuilt-from-log", "about-to-send", lineterm="", n=2)
    )


class InvariantCompanion:
    """Checks loop requests against fresh rebuilds from ``log``; ``checked`` counts the checks that ran."""

    def __init__(self, log: EventLog, *, on_violation: Callable[[], None] | None = None) -> None:
        self.log = log
        self.on_violation = on_violation
        self.checked = 0

    def rebuild(self, session_id: str, upto_seq: int, pending: Sequence[Envelope] = ()) -> GenerateOptions:
        """The request of the prefix ``[0, upto_seq)``: durable events, then ``pending`` ones not yet appended.

        ``pending`` lets the loop check a step before its opening events are written (they are written
        together with ``request/dispatch`` only if the check passes); they are the exact envelopes the log
        will receive, folded here in a fresh session like every other event.
        """
        durable_to = pending[0].seq if pending else upto_seq
        fresh = Session(session_id, [*self.log.read(session_id, 0, durable_to), *pending])
        if fresh.next_seq != upto_seq:
            self._violated()
            raise InvariantViolation(
                f"session {session_id!r}: the rebuild reached seq {fresh.next_seq}, not the boundary {upto_seq}", ""
            )
        return session_request(fresh)

    def check(self, session_id: str, upto_seq: int, request: GenerateOptions, pending: Sequence[Envelope] = ()) -> None:
        """Compare a loop request with the rebuild of the log prefix ``[0, upto_seq)`` (see :meth:`rebuild`)."""
        if not is_loop_request(request):
            return  # one-shots (e.g. compaction's summarize call) are outside the invariant
        rebuilt = self.rebuild(session_id, upto_seq, pending)
        self.checked += 1
        if not rebuilt.same_as(request):
            self._violated()
            raise InvariantViolation(
                f"session {session_id!r}: the request at seq {upto_seq} differs from its rebuild from the log; "
                "it was not sent",
                request_diff(rebuilt, request),
            )

    def _violated(self) -> None:
        if self.on_violation is not None:
            self.on_violation()
