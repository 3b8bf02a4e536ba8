"""Approvals: a tool call that waits for a decision, decided from any process, taken into the log by the writer.

A tool registered with ``approval`` (``True``, or a function of the call's arguments) does not run when the model
calls it. The step's answer is appended with one ``approval/request`` per such call, and no tool of that answer
runs until every one is decided: the turn *pauses* (``run_turn`` returns ``paused``; the process may exit).

A decision — allow, deny with a reason, allow with changed arguments — is made by any process through
:func:`decide` (``foldline approve``): it checks the call is pending in the log, then puts a decision entry into
the session's durable inbox (:mod:`foldline.ports.inbox`, keyed by the call id, so one decision per call counts)
and returns. It never writes the log: the session's writer — a loop waiting for the decision, or the next one
that continues the turn (``continue_turn``, ``foldline resume``) — appends it as ``approval/decision`` naming the
entry, then runs the calls (a denied one is answered with an error result carrying the reason; a changed one
runs with the approver's arguments, and its result says so) and the turn goes on. docs/LOOP.md, "Approvals", has
the event order and the crash cases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..core import codec
from ..core.content import ToolCallBlock
from ..core.events import ApprovalDecision, ApprovalRequest, Envelope, TurnStart
from ..core.inbox import InboxDecision, InboxEntry
from ..core.pauses import PendingApproval, arguments_digest, open_turn, pending_approvals
from ..core.validation import check_session_id
from ..errors import AlreadyDecided, ApprovalNotPending, InputError, SessionNotFound, WriteNotAllowed
from ..ports.event_log import EventLog
from .inbox import new_entry_id
from .options import wall_clock_ms
from .tools import Toolset

__all__ = [
    "CallPlan",
    "PendingApproval",
    "Waiting",
    "approval_requests",
    "decide",
    "parse_arguments",
    "pending",
    "plan_calls",
    "session_pending",
]


def approval_requests(tools: Toolset, turn: int, step: int, calls: Sequence[ToolCallBlock]) -> list[ApprovalRequest]:
    """The ``approval/request`` of each call the toolset's policies hold back, in call order."""
    return [
        ApprovalRequest(turn, step, c.id, c.name, arguments_digest(c.arguments))
        for c in calls
        if tools.needs_approval(c.name, c.arguments)
    ]


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What the loop does with one call of an answer instead of simply running it."""

    action: Literal["run", "deny", "interrupted", "skip"]
    arguments: str | None = None  # run with these (an approver changed them)
    reason: str | None = None  # a denial's reason


def plan_calls(
    calls: Iterable[ToolCallBlock],
    decided: Mapping[str, ApprovalDecision],
    *,
    answered: Iterable[str] = (),
    interrupted: Iterable[str] = (),
) -> dict[str, CallPlan]:
    """The plan of an answer's calls: a call already answered is skipped, a denied one answered with its denial,
    one a crash interrupted (and not to run again) answered as interrupted, an allowed one run — with the
    approver's arguments when they changed them."""
    done, cut = set(answered), set(interrupted)
    plan: dict[str, CallPlan] = {}
    for call in calls:
        decision = decided.get(call.id)
        if call.id in done:
            plan[call.id] = CallPlan("skip")
        elif decision is not None and decision.verdict == "deny":
            plan[call.id] = CallPlan("deny", reason=decision.reason)
        elif call.id in cut:
            plan[call.id] = CallPlan("interrupted")
        else:
            plan[call.id] = CallPlan("run", decision.arguments if decision is not None else None)
    return plan


class Waiting(Exception):
    """Raised inside the loop when a step's approvals are not all decided in time: the turn pauses (not an error;
    the loop catches it and returns a ``paused`` result)."""


# ------------------------------------------------------------------ deciding, from any process


def parse_arguments(text: str, where: str = "--arguments") -> str:
    """Changed arguments as the canonical JSON text the call runs with; :class:`InputError` unless it is a JSON
    object."""
    try:
        value: Any = codec.loads(text)
    except ValueError as exc:
        raise InputError(f"{where} is not valid JSON ({exc}); give the tool's arguments as a JSON object") from exc
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a JSON object (the tool's arguments), got {type(value).__name__}")
    return codec.canonical_json(value).decode()


def decide(
    log: EventLog,
    session_id: str,
    call_id: str,
    *,
    allow: bool,
    reason: str | None = None,
    arguments: str | Mapping[str, Any] | None = None,
    by: str | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    new_id: Callable[[], str] = new_entry_id,
) -> InboxEntry:
    """Decide the pending approval of ``call_id`` in ``session_id``, from any process; returns the inbox entry.

    The decision is durable in the session's inbox when this returns; the session's writer moves it into the log
    (``approval/decision``) and goes on with the turn. Typed errors, nothing recorded: :class:`SessionNotFound`;
    :class:`ApprovalNotPending` (no approval of that call is waiting); :class:`AlreadyDecided` (decided in the log,
    or a decision waits in the inbox — also when another process decided it a moment before);
    :class:`WriteNotAllowed` (this process's log or inbox is read-only); :class:`InputError` (arguments that are
    not a JSON object, arguments with a denial).
    """
    check_session_id(session_id)
    events = log.read(session_id)
    if not events:
        raise SessionNotFound(session_id)
    changed: str | None = None
    if arguments is not None:
        if not allow:
            raise InputError("a denial carries no arguments: give --arguments only with --allow")
        changed = (
            parse_arguments(arguments) if isinstance(arguments, str) else codec.canonical_json(dict(arguments)).decode()
        )
    _check_pending(session_id, call_id, events)
    store = log.inbox()
    if not store.writable:
        raise WriteNotAllowed(
            f"this process opened the log of session {session_id!r} read-only, so it cannot record a decision; "
            "decide from a process that can write the data directory (or the Kafka cluster)"
        )
    for e in store.entries(session_id):
        if isinstance(e.item, InboxDecision) and e.item.call_id == call_id:
            raise AlreadyDecided(
                session_id,
                call_id,
                f"call {call_id!r} of session {session_id!r} is decided already ({e.item.verdict}, waiting in the "
                "inbox for the session's loop); `foldline resume` continues the turn with it",
            )
    entry = InboxEntry(new_id(), clock(), InboxDecision(call_id, "allow" if allow else "deny", reason, changed, by))
    if not store.put(session_id, entry, unique=call_id):
        raise AlreadyDecided(
            session_id, call_id, f"call {call_id!r} of session {session_id!r} was decided by another process just now"
        )
    later = log.read(session_id, len(events))
    first = next(
        (e.data for e in later if isinstance(e.data, ApprovalDecision) and e.data.call_id == call_id),
        None,
    )
    if first is not None and first.entry != entry.id:  # the writer took another decision meanwhile
        store.remove(session_id, [entry.id])
        raise AlreadyDecided(
            session_id,
            call_id,
            f"call {call_id!r} of session {session_id!r} was decided by another process just now ({first.verdict})",
        )
    return entry


def _check_pending(session_id: str, call_id: str, events: Sequence[Envelope]) -> None:
    decided = next(
        (e for e in events if isinstance(e.data, ApprovalDecision) and e.data.call_id == call_id),
        None,
    )
    if decided is not None:
        assert isinstance(decided.data, ApprovalDecision)
        raise AlreadyDecided(
            session_id,
            call_id,
            f"call {call_id!r} of session {session_id!r} was decided already ({decided.data.verdict}, seq "
            f"{decided.seq}); a call is decided once",
        )
    waiting = pending_approvals(session_id, events)
    if not any(p.call_id == call_id for p in waiting):
        listed = ", ".join(repr(p.call_id) for p in waiting) or "none"
        raise ApprovalNotPending(
            session_id,
            call_id,
            f"session {session_id!r} has no approval of call {call_id!r} waiting (pending: {listed}); "
            "`foldline approvals` lists the pending ones",
        )


# ------------------------------------------------------------------ listing


def session_pending(log: EventLog, session_id: str, page: int = 256) -> list[PendingApproval]:
    """The session's pending approvals, reading back from its end only as far as its last ``turn/start``."""
    head = log.head(session_id)
    start = max(0, head - page)
    while True:
        events = log.read(session_id, start, head)
        if start == 0 or any(isinstance(e.data, TurnStart) for e in events):
            if open_turn(events) is None:
                return []
            return pending_approvals(session_id, events)
        start = max(0, start - 4 * page)


def pending(log: EventLog, session_ids: Iterable[str] | None = None) -> list[tuple[PendingApproval, InboxEntry | None]]:
    """Every pending approval of the sessions (default: all), each with the decision waiting in the inbox for the
    session's loop to take it (``None``: not decided yet)."""
    store = log.inbox()
    out: list[tuple[PendingApproval, InboxEntry | None]] = []
    for sid in session_ids if session_ids is not None else log.sessions():
        waiting = session_pending(log, sid)
        if not waiting:
            continue
        decisions = {
            e.item.call_id: e for e in reversed(store.entries(sid)) if isinstance(e.item, InboxDecision)
        }  # reversed: the first entry of a call wins
        out += [(p, decisions.get(p.call_id)) for p in waiting]
    return out
