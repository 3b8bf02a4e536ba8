"""The event envelope and the full catalog of session events.

An envelope is ``{type, seq, time, data, ignorable?}``. ``seq`` is the index of the event in its
session (gapless from 0); ``time`` is epoch milliseconds supplied by the caller and never reaches a
model. Events are frozen once built. :data:`EventData` is the union of every event payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias

from .content import ContentBlock, ToolResultPart, Usage
from .frozen import FrozenDict
from .header import EpochHeader, HeaderReason

__all__ = [
    "SESSION_FORMAT_VERSION",
    "SURFACE_TYPES",
    "TURN_END_REASONS",
    "AssistantMessage",
    "AttachmentQuarantine",
    "CompactionEnd",
    "CompactionStart",
    "CompactionSummary",
    "Envelope",
    "EventData",
    "ReplaceOp",
    "RequestDispatch",
    "RequestHeader",
    "SessionEndSeed",
    "StepEnd",
    "StepStart",
    "SurfaceEvent",
    "SurfaceOp",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnEndReason",
    "TurnStart",
    "UnknownEvent",
    "UserMessage",
]

SESSION_FORMAT_VERSION = 0

TurnEndReason = Literal["completed", "aborted", "blocked", "error", "max-tokens", "interrupted"]
TURN_END_REASONS: frozenset[str] = frozenset({"completed", "aborted", "blocked", "error", "max-tokens", "interrupted"})
USER_SOURCES: frozenset[str] = frozenset({"user", "inject", "tool-context", "pre-step", "compaction", "fork"})


@dataclass(frozen=True, slots=True)
class ReplaceOp:
    """Replace the visible surface entries ``start..end`` (inclusive positions) with this event."""

    start: int
    end: int


SurfaceOp: TypeAlias = Literal["append"] | ReplaceOp


@dataclass(frozen=True, slots=True)
class UserMessage:
    TYPE: ClassVar[str] = "user/message"
    id: str
    content: tuple[ContentBlock, ...]
    source: str = "user"
    surface_op: SurfaceOp = "append"
    source_event_seqs: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    TYPE: ClassVar[str] = "assistant/message"
    id: str
    content: tuple[ContentBlock, ...]
    usage: Usage | None = None
    stop_reason: str | None = None
    surface_op: SurfaceOp = "append"
    source_event_seqs: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    TYPE: ClassVar[str] = "tool/result"
    call_id: str
    name: str
    content: tuple[ToolResultPart, ...]
    is_error: bool = False
    surface_op: SurfaceOp = "append"
    source_event_seqs: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class TurnStart:
    TYPE: ClassVar[str] = "turn/start"
    turn: int


@dataclass(frozen=True, slots=True)
class TurnEnd:
    TYPE: ClassVar[str] = "turn/end"
    turn: int
    reason: TurnEndReason


@dataclass(frozen=True, slots=True)
class StepStart:
    TYPE: ClassVar[str] = "step/start"
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class StepEnd:
    TYPE: ClassVar[str] = "step/end"
    turn: int
    step: int


@dataclass(frozen=True, slots=True)
class ToolCall:
    TYPE: ClassVar[str] = "tool/call"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class RequestHeader:
    TYPE: ClassVar[str] = "request/header"
    header: EpochHeader
    reason: HeaderReason


@dataclass(frozen=True, slots=True)
class RequestDispatch:
    """The digest of the exact wire bytes of a loop request, recorded before they are sent."""

    TYPE: ClassVar[str] = "request/dispatch"
    turn: int
    step: int
    serializer: str
    serializer_version: int
    digest: str
    bytes: int


@dataclass(frozen=True, slots=True)
class SessionEndSeed:
    """Closes a forked prefix; the child's own events follow."""

    TYPE: ClassVar[str] = "session/end-seed"
    parent_id: str | None = None
    seed_length: int | None = None


@dataclass(frozen=True, slots=True)
class CompactionStart:
    TYPE: ClassVar[str] = "compaction/start"
    start: int
    end: int
    estimated_tokens: int


@dataclass(frozen=True, slots=True)
class CompactionSummary:
    """The summarize one-shot's answer. ``serializer``/``serializer_version``/``input_digest`` name the exact
    body that was sent (sha256 of its bytes), so ``foldline verify`` proves the rebuilt input byte for byte;
    logs written before these fields existed are rechecked without that proof. ``prompt_version`` names the
    summarize prompt and transcript syntax the input was built with; absent means version 1."""

    TYPE: ClassVar[str] = "compaction/summary"
    summary: str
    provider: str
    model: str
    max_tokens: int
    usage: Usage | None = None
    serializer: str | None = None
    serializer_version: int | None = None
    input_digest: str | None = None
    prompt_version: int | None = None  # the summarize prompt version (docs/COMPACTION.md); absent means 1


@dataclass(frozen=True, slots=True)
class CompactionEnd:
    TYPE: ClassVar[str] = "compaction/end"


@dataclass(frozen=True, slots=True)
class AttachmentQuarantine:
    """An attachment object could not be used; records the failure and the proposed recovery."""

    TYPE: ClassVar[str] = "attachment/quarantine"
    attachment_id: str
    failure: str
    recovery: str


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event type this version does not know; only accepted when the envelope is ignorable."""

    type: str
    data: FrozenDict


SurfaceEvent: TypeAlias = UserMessage | AssistantMessage | ToolResult

EventData: TypeAlias = (
    UserMessage
    | AssistantMessage
    | ToolResult
    | TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | ToolCall
    | RequestHeader
    | RequestDispatch
    | SessionEndSeed
    | CompactionStart
    | CompactionSummary
    | CompactionEnd
    | AttachmentQuarantine
    | UnknownEvent
)

SURFACE_TYPES: frozenset[str] = frozenset({UserMessage.TYPE, AssistantMessage.TYPE, ToolResult.TYPE})


@dataclass(frozen=True, slots=True)
class Envelope:
    seq: int
    time: int
    data: EventData
    ignorable: bool = False

    @property
    def type(self) -> str:
        data = self.data
        if isinstance(data, UnknownEvent):
            return data.type
        return data.TYPE
