"""The rebuild layer: one step's request and records, the invariant companion, and ``foldline verify``.

Replay is the production path (what Temporal's Replayer does for workflows): the loop, the dispatcher,
the invariant companion and ``verify`` all build a step's request with :func:`request_at` and write or
expect the same records, so an audit cannot disagree with what was sent.

* :mod:`.step` — the request at a boundary (one typed error when there is none), and the dispatch,
  answer and quarantine records;
* :mod:`.registry` — process-local identity of loop requests (one-shots are not loop requests);
* :mod:`.invariant` — each loop request against a fresh rebuild from the durable log;
* :mod:`.verify` — every logged request rebuilt and proved against its recorded digest.
"""

from .invariant import InvariantCompanion, request_diff
from .registry import is_loop_request, mark_loop_request
from .step import (
    QUARANTINE_RECOVERY,
    answer_records,
    dispatch_record,
    quarantine_record,
    request_at,
    session_request,
)
from .verify import Mismatch, Unreconstructable, VerifyReport, rebuild_requests, verify_events

__all__ = [
    "QUARANTINE_RECOVERY",
    "InvariantCompanion",
    "Mismatch",
    "Unreconstructable",
    "VerifyReport",
    "answer_records",
    "dispatch_record",
    "is_loop_request",
    "mark_loop_request",
    "quarantine_record",
    "rebuild_requests",
    "request_at",
    "request_diff",
    "session_request",
    "verify_events",
]
