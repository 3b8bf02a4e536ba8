"""The invariant companion: each loop request must equal its rebuild from the raw log prefix.

The rebuild reads the log through the port and folds it in a fresh :class:`~foldline.core.Session`
— no cache shared with the live session — so the live cache cannot vouch for itself. A mismatch
raises :class:`~foldline.errors.InvariantViolation` with a readable diff, before anything is sent.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from ..core import codec
from ..core.events import Envelope
from ..core.projection import Session
from ..core.request import GenerateOptions, build_request, request_to_json
from ..errors import InvariantViolation
from ..ports.event_log import EventLog
from .registry import is_loop_request

__all__ = ["InvariantCompanion", "request_diff"]


def request_diff(expected: GenerateOptions, actual: GenerateOptions) -> str:
    def lines(req: GenerateOptions) -> list[str]:
        import orjson

        return (
            orjson.dumps(request_to_json(req), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().split("\n")
        )

    return "\n".join(
        difflib.unified_diff(lines(expected), lines(actual), "rebuilt-from-log", "about-to-send", lineterm="", n=2)
    )


class InvariantCompanion:
    def __init__(self, log: EventLog) -> None:
        self.log = log
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
            raise InvariantViolation(
                f"session {session_id!r}: the rebuild reached seq {fresh.next_seq}, not the boundary {upto_seq}", ""
            )
        header = fresh.header()
        if header is None:
            raise InvariantViolation(f"session {session_id!r}: no request/header before seq {upto_seq}", "")
        return build_request(fresh.derive_messages(), header)

    def check(self, session_id: str, upto_seq: int, request: GenerateOptions, pending: Sequence[Envelope] = ()) -> None:
        """Compare a loop request with the rebuild of the log prefix ``[0, upto_seq)`` (see :meth:`rebuild`)."""
        if not is_loop_request(request):
            return  # one-shots (e.g. compaction's summarize call) are outside the invariant
        rebuilt = self.rebuild(session_id, upto_seq, pending)
        self.checked += 1
        if not rebuilt.same_as(request):
            raise InvariantViolation(
                f"session {session_id!r}: the request at seq {upto_seq} differs from its rebuild from the log; "
                "it was not sent",
                request_diff(rebuilt, request),
            )


def body_digest(body: bytes) -> str:
    return codec.digest_bytes(body)
