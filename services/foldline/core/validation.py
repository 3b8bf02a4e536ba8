"""The rules every session log obeys, checked event by event on append and on load.

:class:`LogRules` holds the little state the rules need (next seq, the visible surface, tool calls,
header presence, a pending compaction) and checks one event in O(1) amortized time — a surface
replace costs the size of the replaced range. :meth:`LogRules.check_batch` is all-or-nothing: on a
failure, every change made by the batch is undone and the typed error names the seq and rule.

:func:`check_values` is the one check that every value of an event is one every backend and command can
hold — integers within an Avro ``long``, a ``time`` a calendar can show, ids of printable text and bounded
length — shared by every append (through :class:`LogRules`), the importer and the Avro codec.
:func:`check_session_id` holds session ids to the same id rules, wherever one enters.

An event read back with its content still sealed (its key was erased: ``core/sealing.py``) is held to every
rule but one: a ``tool/call``'s arguments are not compared with its tool-call block's, which are tokens then
(the rule held when the events were appended, on their content).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import assert_never

from ..errors import ValidationError
from .content import ToolCallBlock
from .events import (
    MAX_TIME_MS,
    ApprovalDecision,
    ApprovalRequest,
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    ControlEvent,
    Envelope,
    InboxClaim,
    LlmRetry,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionErased,
    SessionParent,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .records import ID_MAX_BYTES, MAX_INT, SESSION_ID_MAX_BYTES, check_record, id_problem
from .wire import LEGACY_TYPES

__all__ = [
    "ID_MAX_BYTES",
    "SESSION_ID_MAX_BYTES",
    "LogRules",
    "SurfaceNode",
    "check_log",
    "check_session_id",
    "check_values",
    "id_problem",
]


def check_session_id(session_id: object, what: str = "session id") -> str:
    """``session_id`` if it is a valid session id, else :class:`ValidationError` (rule ``session-id``)."""
    if not isinstance(session_id, str):
        raise ValidationError("session-id", f"a {what} must be a string, got {type(session_id).__name__}")
    problem = id_problem(session_id, SESSION_ID_MAX_BYTES)
    if problem is not None:
        shown = session_id[:40] + ("…" if len(session_id) > 40 else "")
        raise ValidationError("session-id", f"{what} {shown!r} is not valid: {problem}")
    return session_id


def check_values(e: Envelope) -> None:
    """Every value of ``e`` fits every backend and command: else :class:`ValidationError` naming the seq.

    Integers lie within ``0..MAX_INT`` (``>= 1`` where the format says so): an Avro ``long`` holds them and
    the decoder reads them back. ``time`` lies within ``0..MAX_TIME_MS`` (a date any display can show).
    Message ids, call ids and tool names are ids (:func:`id_problem`, at most :data:`ID_MAX_BYTES`), and a
    ``parentId`` is a session id.
    """
    seq = e.seq
    if not 0 <= seq <= MAX_INT:
        raise ValidationError(
            "value-range", f"seq must be within 0..{MAX_INT} (a signed 64-bit integer), got {seq}", seq=seq
        )
    if not 0 <= e.time <= MAX_TIME_MS:
        raise ValidationError(
            "time",
            f"time must be epoch milliseconds within 0..{MAX_TIME_MS} (up to 9999-12-31T23:59:59.999Z), got {e.time}",
            seq=seq,
        )
    if type(e.data) is not UnknownEvent:
        check_record(e.data, seq)  # the bounds and ids of the event's definition


@dataclass(frozen=True, slots=True)
class SurfaceNode:
    """One visible entry of the surface: which event it is and, for tool results, its call id."""

    seq: int
    type: str
    call_id: str | None = None
    name: str | None = None
    is_error: bool = False


class LogRules:
    """Incremental validator for one session's log."""

    __slots__ = (
        "_approvals",
        "_calls_of_answer",
        "_compaction_pending",
        "_decided",
        "_entries",
        "_results",
        "_undo",
        "call_ids",
        "has_header",
        "next_seq",
        "surface",
        "surface_generation",
    )

    def __init__(self) -> None:
        self.next_seq = 0
        self.surface: list[SurfaceNode] = []
        self.surface_generation = 0
        self.call_ids: set[str] = set()
        self._results: set[str] = set()
        # the tool-call blocks of the latest assistant/message, by id: what its tool/call events must repeat
        self._calls_of_answer: dict[str, tuple[str, str | None]] = {}
        self.has_header = False
        self._compaction_pending = False
        self._approvals: set[str] = set()  # callIds with an approval/request
        self._decided: set[str] = set()  # callIds with an approval/decision
        self._entries: set[str] = set()  # inbox entries an inbox/claim or approval/decision named
        self._undo: list[Callable[[], None]] | None = None

    # -------------------------------------------------------------- public

    def check_batch(self, events: Sequence[Envelope], *, values_checked: bool = False) -> list[tuple[int, int] | None]:
        """Check and apply ``events``; all-or-nothing. Returns each event's surface change.

        For each event: ``None`` when it does not touch the surface, ``(pos, pos)`` for an append at
        position ``pos``, ``(start, end)`` for a replace of that inclusive range.

        ``values_checked=True`` skips :func:`check_values` — a function of the event alone — for a caller
        holding these very (immutable) envelopes after another check passed them: the loop's session
        taking the events its log just accepted. Every rule that depends on the session still runs.
        """
        self._undo = []
        first = self.next_seq  # restored directly on a refusal: each event only moves it on by one
        try:
            values = not values_checked
            changes = [self._check(e, values) for e in events]
        except BaseException:
            for undo in reversed(self._undo):
                undo()
            self.next_seq = first
            raise
        finally:
            self._undo = None
        return changes

    def check(self, event: Envelope) -> tuple[int, int] | None:
        return self.check_batch((event,))[0]

    def advance(self, event: Envelope) -> tuple[int, int] | None:
        """Check and apply one event, keeping nothing to undo it with: faster than :meth:`check`, for a
        caller that discards this state when an event fails (a failed check leaves it unusable)."""
        self._undo = None
        return self._check(event)

    def at_batch_boundary(self) -> bool:
        """False while a compaction summary still awaits its replacing user/message."""
        return not self._compaction_pending

    # -------------------------------------------------------------- internals

    def _set(self, name: str, value: object) -> None:
        if self._undo is not None:
            old = getattr(self, name)
            self._undo.append(lambda: setattr(self, name, old))
        setattr(self, name, value)

    def _add(self, target: set[str], value: str) -> None:
        if value not in target:
            target.add(value)
            if self._undo is not None:
                self._undo.append(lambda: target.discard(value))

    def _check(self, e: Envelope, values: bool = True) -> tuple[int, int] | None:
        seq = e.seq
        if seq != self.next_seq:
            raise ValidationError(
                "seq-gapless", f"expected seq {self.next_seq} (seqs are gapless from 0), got {seq}", seq=seq
            )
        if values:
            check_values(e)
        data = e.data
        if self._compaction_pending and not (isinstance(data, UserMessage) and data.source == "compaction"):
            raise ValidationError(
                "compaction-replacement",
                "compaction/summary must be followed immediately by the replacing user/message (source 'compaction')",
                seq=seq,
            )
        change: tuple[int, int] | None = None
        match data:  # the most frequent events first
            case (
                TurnStart()
                | TurnEnd()
                | StepStart()
                | StepEnd()
                | RequestDispatch()
                | SessionEndSeed()
                | CompactionStart()
                | CompactionEnd()
                | AttachmentQuarantine()
            ):
                pass
            case UserMessage():
                if data.source == "compaction":
                    if not self._compaction_pending:
                        raise ValidationError(
                            "compaction-replacement",
                            "a user/message with source 'compaction' must follow a compaction/summary",
                            seq=seq,
                        )
                    if not isinstance(data.surface_op, ReplaceOp):
                        raise ValidationError(
                            "compaction-replacement", "the compaction user/message must be a surface replace", seq=seq
                        )
                    self._set("_compaction_pending", False)
                change = self._surface(seq, data.surface_op, data.source_event_seqs, SurfaceNode(seq, data.TYPE), None)
            case AssistantMessage():
                # a sealed block's arguments are a token (None: not compared; they were when it was appended)
                opened = e.sealed is None
                calls = {
                    b.id: (b.name, b.arguments if opened else None)
                    for b in data.content
                    if isinstance(b, ToolCallBlock)
                }
                if calls or self._calls_of_answer:
                    self._set("_calls_of_answer", calls)
                change = self._surface(seq, data.surface_op, data.source_event_seqs, SurfaceNode(seq, data.TYPE), None)
            case ToolResult():
                if data.call_id not in self.call_ids:
                    raise ValidationError(
                        "tool-result-call",
                        f"tool/result for callId {data.call_id!r} has no earlier tool/call",
                        seq=seq,
                    )
                node = SurfaceNode(seq, data.TYPE, data.call_id, data.name, data.is_error)
                if data.surface_op == "append":
                    if data.call_id in self._results:
                        raise ValidationError(
                            "tool-result-call",
                            f"callId {data.call_id!r} already has a tool/result; change it with a replace",
                            seq=seq,
                        )
                    self._add(self._results, data.call_id)
                change = self._surface(seq, data.surface_op, data.source_event_seqs, node, data)
            case ToolCall():
                if data.call_id in self.call_ids:
                    raise ValidationError("tool-call-id", f"callId {data.call_id!r} is used twice", seq=seq)
                block = self._calls_of_answer.get(data.call_id)
                if block is None:
                    raise ValidationError(
                        "tool-call-block",
                        f"tool/call {data.call_id!r} has no tool-call block of that id in the assistant/message "
                        "before it",
                        seq=seq,
                    )
                if block[0] != data.name or (block[1] is not None and e.sealed is None and block[1] != data.arguments):
                    what = "name" if block[0] != data.name else "arguments"
                    raise ValidationError(
                        "tool-call-block",
                        f"tool/call {data.call_id!r} differs in its {what} from the tool-call block of the "
                        "assistant/message it came from",
                        seq=seq,
                    )
                self._add(self.call_ids, data.call_id)
            case RequestHeader():
                if data.reason == "initial" and self.has_header:
                    raise ValidationError(
                        "header-reason",
                        "reason 'initial' is only for a session's first header; a new loop instance writes 'resume'",
                        seq=seq,
                    )
                if data.reason == "change" and not self.has_header:
                    raise ValidationError(
                        "header-reason", "reason 'change' needs an earlier header snapshot to change", seq=seq
                    )
                if not self.has_header:
                    self._set("has_header", True)
            case CompactionSummary():
                self._set("_compaction_pending", True)
            case LlmRetry() | AssistantChunk() | SessionErased() | ControlEvent():
                if not e.ignorable:
                    raise ValidationError(
                        "ignorable-required",
                        f"{data.TYPE} must be written with ignorable true, so readers that predate it skip it",
                        seq=seq,
                    )
                if isinstance(data, ControlEvent):
                    self._control(seq, data)
            case UnknownEvent():
                if not e.ignorable:
                    raise ValidationError("unknown-type", f"unknown event type {data.type!r}", seq=seq)
                if data.type in LEGACY_TYPES:
                    raise ValidationError("legacy-header-delta", f"{data.type!r} is a removed legacy event", seq=seq)
            case _:
                assert_never(data)
        self.next_seq = seq + 1  # check_batch restores it on a refusal
        return change

    def _control(self, seq: int, data: ControlEvent) -> None:
        """The rules of the control events: an approval is requested once for a logged call that has no result
        yet and decided once; an inbox entry is taken once; ``session/parent`` is a session's first event."""
        if isinstance(data, ApprovalRequest):
            if data.call_id not in self.call_ids:
                raise ValidationError(
                    "approval-request",
                    f"approval/request for callId {data.call_id!r} has no tool/call before it",
                    seq=seq,
                )
            if data.call_id in self._approvals or data.call_id in self._results:
                what = "an approval/request" if data.call_id in self._approvals else "a tool/result"
                raise ValidationError(
                    "approval-request",
                    f"callId {data.call_id!r} already has {what}; approval comes first, once",
                    seq=seq,
                )
            self._add(self._approvals, data.call_id)
        elif isinstance(data, ApprovalDecision):
            if data.call_id not in self._approvals:
                raise ValidationError(
                    "approval-decision",
                    f"approval/decision for callId {data.call_id!r} answers no approval/request",
                    seq=seq,
                )
            if data.call_id in self._decided:
                raise ValidationError(
                    "approval-decision", f"callId {data.call_id!r} is decided already; a call is decided once", seq=seq
                )
            if data.verdict == "deny" and data.arguments is not None:
                raise ValidationError(
                    "approval-decision", "a denial carries no arguments (only an allow may change them)", seq=seq
                )
            self._add(self._decided, data.call_id)
            self._take(seq, (data.entry,))
        elif isinstance(data, InboxClaim):
            self._take(seq, data.entries)
        elif isinstance(data, SessionParent) and seq != 0:
            raise ValidationError(
                "session-parent", "session/parent names a sub-agent's parent and must be its first event", seq=seq
            )

    def _take(self, seq: int, entries: tuple[str, ...]) -> None:
        if len(set(entries)) != len(entries) or any(x in self._entries for x in entries):
            again = sorted({x for x in entries if x in self._entries or entries.count(x) > 1})
            raise ValidationError(
                "inbox-entry", f"inbox entr(ies) {again} were taken already; an entry enters the log once", seq=seq
            )
        for x in entries:
            self._add(self._entries, x)

    def _surface(
        self,
        seq: int,
        op: object,
        sources: tuple[int, ...] | None,
        node: SurfaceNode,
        result: ToolResult | None,
    ) -> tuple[int, int]:
        if sources is not None:
            bad = [s for s in sources if s >= seq]
            if bad:
                raise ValidationError(
                    "source-seqs", f"sourceEventSeqs may only name earlier events, got {bad}", seq=seq
                )
        surface = self.surface
        if op == "append":
            surface.append(node)
            if self._undo is not None:
                self._undo.append(lambda: surface.__delitem__(-1))
            return (len(surface) - 1, len(surface) - 1)
        assert isinstance(op, ReplaceOp)
        start, end = op.start, op.end
        if not (0 <= start <= end < len(surface)):
            raise ValidationError(
                "replace-range",
                f"replace {start}..{end} is outside the visible surface (0..{len(surface) - 1})",
                seq=seq,
            )
        hidden = surface[start : end + 1]
        listed = set(sources or ())
        missing = [n.seq for n in hidden if n.seq not in listed]
        if missing:
            raise ValidationError(
                "replace-lists-hidden",
                f"replace {start}..{end} hides event seq(s) {missing} without listing them in sourceEventSeqs",
                seq=seq,
            )
        if result is not None:
            target = hidden[0]
            if start != end:
                raise ValidationError(
                    "tool-result-trim", "a tool/result replace must replace exactly one entry (start == end)", seq=seq
                )
            if target.type != ToolResult.TYPE or target.call_id != result.call_id:
                raise ValidationError(
                    "tool-result-trim",
                    f"a tool/result replace must replace the tool/result of the same callId {result.call_id!r}",
                    seq=seq,
                )
            if target.name != result.name or target.is_error != result.is_error:
                raise ValidationError(
                    "tool-result-trim",
                    "a tool/result trim may change only its content (name and isError stay)",
                    seq=seq,
                )
        # Copy-on-write: a replace produces a new surface list, so earlier snapshots stay valid.
        new_surface = [*surface[:start], node, *surface[end + 1 :]]
        old_surface, old_gen = self.surface, self.surface_generation
        self.surface = new_surface
        self.surface_generation = old_gen + 1

        def undo() -> None:
            self.surface = old_surface
            self.surface_generation = old_gen

        if self._undo is not None:
            self._undo.append(undo)
        return (start, end)


def check_log(events: Iterable[Envelope]) -> LogRules:
    """Validate a whole log from seq 0; returns the rules state at its end."""
    rules = LogRules()
    rules.check_batch(list(events))
    return rules
