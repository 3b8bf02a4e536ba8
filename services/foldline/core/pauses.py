"""Where a session's last turn stands, from the log alone: open or closed, paused on approvals, left mid-step.

A loop instance that loads a session (and ``foldline approvals``, and a decision made from another process)
reads the same answer from the same function, :func:`open_turn`:

* no open turn — the last ``turn/start`` has its ``turn/end``;
* a **paused** turn — the open step's answer has calls with an ``approval/request`` and no
  ``approval/decision`` yet. No tool of that answer has run (the loop runs them only once every approval of
  the answer is decided), so the turn waits, however long, for decisions;
* an **interrupted** turn — open, not paused: the loop stopped between two appends (a crash, a kill) after
  any tools may have started. A new instance answers it by its recovery policy (``turn/recover``).

Also here: the pending approvals of a session, the inbox entries its log has taken (an entry enters the log
once), and the results a decision implies (a denial's error result, the note of changed arguments).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import codec
from .content import TextBlock, ToolCallBlock
from .events import (
    ApprovalDecision,
    ApprovalRequest,
    AssistantMessage,
    Envelope,
    InboxClaim,
    RequestDispatch,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolResult,
    TurnEnd,
    TurnRecovery,
    TurnStart,
)

__all__ = [
    "OpenStep",
    "OpenTurn",
    "PendingApproval",
    "arguments_digest",
    "changed_arguments_note",
    "denied_result",
    "open_turn",
    "pending_approvals",
    "taken_entries",
]


def arguments_digest(arguments: str) -> str:
    """The digest an ``approval/request`` records: sha256 of the call's raw arguments text as UTF-8."""
    return codec.digest_bytes(arguments.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a decision: what a decider is shown."""

    session_id: str
    call_id: str
    name: str
    arguments: str  # the raw JSON text the model produced
    arguments_digest: str
    turn: int
    step: int
    seq: int  # of the approval/request
    requested_at: int  # its time, epoch ms

    def to_json(self) -> dict[str, object]:
        return {
            "session": self.session_id,
            "callId": self.call_id,
            "tool": self.name,
            "arguments": self.arguments,
            "argumentsDigest": self.arguments_digest,
            "turn": self.turn,
            "step": self.step,
            "seq": self.seq,
            "requestedAt": self.requested_at,
        }


@dataclass(frozen=True, slots=True)
class OpenStep:
    """The open step of an open turn, as logged so far."""

    turn: int
    step: int
    start_seq: int
    header_reason: str | None = None  # the reason of the request/header its opening wrote, if any
    dispatch_seq: int | None = None
    dispatch: RequestDispatch | None = None
    answer: AssistantMessage | None = None  # its answer, once logged
    answer_seq: int | None = None
    answered: frozenset[str] = frozenset()  # calls of the answer with a tool/result
    requested: Mapping[str, tuple[int, int, ApprovalRequest]] = field(default_factory=dict)  # callId → (seq, time, …)
    decided: Mapping[str, ApprovalDecision] = field(default_factory=dict)
    recovery: TurnRecovery | None = None  # the latest turn/recover written after the answer

    @property
    def calls(self) -> tuple[ToolCallBlock, ...]:
        """The tool calls of the step's answer, in order."""
        if self.answer is None:
            return ()
        return tuple(b for b in self.answer.content if isinstance(b, ToolCallBlock))

    @property
    def unanswered(self) -> tuple[ToolCallBlock, ...]:
        """The answer's calls without a ``tool/result``, in order."""
        return tuple(c for c in self.calls if c.id not in self.answered)

    @property
    def pending(self) -> tuple[ToolCallBlock, ...]:
        """The unanswered calls whose approval is requested and not decided."""
        return tuple(c for c in self.unanswered if c.id in self.requested and c.id not in self.decided)


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """A turn with a ``turn/start`` and no ``turn/end``."""

    turn: int
    start_seq: int
    steps: int  # steps the turn opened so far (the next one is numbered this)
    step: OpenStep | None  # the open step, if one is open

    @property
    def paused(self) -> bool:
        """The turn waits for approval decisions (no tool of the open step's answer has run)."""
        return self.step is not None and bool(self.step.pending)


def open_turn(events: Iterable[Envelope]) -> OpenTurn | None:
    """The session's open turn (``None`` when its last turn ended, or it has none), from its events or from the
    events since the open turn's ``turn/start``. One pass, O(events)."""
    turn: int | None = None
    turn_seq = steps = 0
    step: tuple[int, int, int] | None = None  # (turn, step, seq of step/start)
    reason: str | None = None
    dispatch: tuple[int, RequestDispatch] | None = None
    answer: tuple[int, AssistantMessage] | None = None
    answered: set[str] = set()
    requested: dict[str, tuple[int, int, ApprovalRequest]] = {}
    decided: dict[str, ApprovalDecision] = {}
    recovery: TurnRecovery | None = None
    for e in events:
        data = e.data
        if isinstance(data, TurnStart):
            turn, turn_seq, steps, step = data.turn, e.seq, 0, None
        elif turn is None:
            continue
        elif isinstance(data, TurnEnd):
            turn, step = None, None
        elif isinstance(data, StepStart):
            steps = max(steps, data.step + 1)
            step, reason, dispatch, answer, recovery = (data.turn, data.step, e.seq), None, None, None, None
            answered, requested, decided = set(), {}, {}
        elif step is None:
            continue
        elif isinstance(data, StepEnd):
            step = None
        elif isinstance(data, RequestHeader):
            reason = data.reason
        elif isinstance(data, RequestDispatch):
            dispatch = (e.seq, data)
        elif isinstance(data, AssistantMessage) and data.surface_op == "append":
            answer, recovery = (e.seq, data), None
            answered, requested, decided = set(), {}, {}
        elif isinstance(data, ToolResult) and data.surface_op == "append":
            answered.add(data.call_id)
        elif isinstance(data, ApprovalRequest):
            requested[data.call_id] = (e.seq, e.time, data)
        elif isinstance(data, ApprovalDecision):
            decided[data.call_id] = data
        elif isinstance(data, TurnRecovery):
            recovery = data
    if turn is None:
        return None
    if step is None:
        return OpenTurn(turn, turn_seq, steps, None)
    return OpenTurn(
        turn,
        turn_seq,
        steps,
        OpenStep(
            step[0],
            step[1],
            step[2],
            reason,
            dispatch[0] if dispatch else None,
            dispatch[1] if dispatch else None,
            answer[1] if answer else None,
            answer[0] if answer else None,
            frozenset(answered),
            requested,
            decided,
            recovery,
        ),
    )


def pending_approvals(session_id: str, events: Iterable[Envelope]) -> list[PendingApproval]:
    """The approvals the session waits for: the open step's calls with a request and no decision, in call order."""
    state = open_turn(events)
    if state is None or state.step is None:
        return []
    step = state.step
    out = []
    for call in step.pending:
        seq, time, request = step.requested[call.id]
        out.append(
            PendingApproval(
                session_id,
                call.id,
                call.name,
                call.arguments,
                request.arguments_digest,
                request.turn,
                request.step,
                seq,
                time,
            )
        )
    return out


def taken_entries(events: Iterable[Envelope]) -> set[str]:
    """Every inbox entry the log has taken (named by an ``inbox/claim`` or an ``approval/decision``)."""
    taken: set[str] = set()
    for e in events:
        data = e.data
        if isinstance(data, InboxClaim):
            taken.update(data.entries)
        elif isinstance(data, ApprovalDecision):
            taken.add(data.entry)
    return taken


#: The first text of a denied call's result (the approver's reason follows).
DENIED = "denied: an approver did not allow this call, so it did not run"


def denied_result(call_id: str, name: str, reason: str | None) -> ToolResult:
    """The error ``tool/result`` that answers a denied call: the model sees that it was denied, and why."""
    said = f"{DENIED}. Reason: {reason}" if reason else f"{DENIED} (no reason was given)"
    return ToolResult(call_id, name, (TextBlock(said),), is_error=True)


def changed_arguments_note(arguments: str) -> TextBlock:
    """The text that opens the result of a call an approver allowed with other arguments than the model's."""
    return TextBlock(f"[an approver changed this call's arguments; it ran with: {arguments}]")
