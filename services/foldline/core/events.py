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
    "MAX_INT",
    "MAX_TIME_MS",
    "SESSION_FORMAT_VERSION",
    "SURFACE_TYPES",
    "TURN_END_REASONS",
    "ALWAYS_IGNORABLE",
    "AssistantChunk",
    "AssistantMessage",
    "AttachmentQuarantine",
    "CompactionEnd",
    "CompactionStart",
    "CompactionSummary",
    "Envelope",
    "EventData",
    "LlmRetry",
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

#: The largest integer any field may hold: an Avro ``long`` (signed 64 bits), what the Kafka records carry.
MAX_INT = (1 << 63) - 1
#: The latest event ``time``: 9999-12-31T23:59:59.999Z, the last instant a calendar date can name.
MAX_TIME_MS = 253_402_300_799_999

TurnEndReason = Literal[
    "completed", "aborted", "blocked", "error", "max-tokens", "interrupted", "refusal", "context-overflow"
]
TURN_END_REASONS: frozenset[str] = frozenset(
    {"completed", "aborted", "blocked", "error", "max-tokens", "interrupted", "refusal", "context-overflow"}
)
USER_SOURCES: frozenset[str] = frozenset(
    {"user", "inject", "tool-context", "pre-step", "compaction", "fork", "refusal-reset"}
)


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
    """A model answer. ``provider_request_id`` / ``provider_message_id`` name it at the provider (the HTTP
    request id header and the answer's own id), for support tickets and cache diagnostics; not model-visible."""

    TYPE: ClassVar[str] = "assistant/message"
    id: str
    content: tuple[ContentBlock, ...]
    usage: Usage | None = None
    stop_reason: str | None = None
    surface_op: SurfaceOp = "append"
    source_event_seqs: tuple[int, ...] | None = None
    provider_request_id: str | None = None
    provider_message_id: str | None = None


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
class LlmRetry:
    """One failed attempt of a step's provider request, appended before the wait that follows it.

    ``attempt`` counts from 1; ``status`` is the HTTP status (absent for a transport failure); ``error_type``
    the provider's error type or the transport failure's name; ``wait_ms`` the wait before the next attempt
    (absent: the request was given up on after this attempt); ``received_bytes`` the answer bytes that had
    arrived when it failed (0: before the first byte). Every attempt sends the bytes of the step's
    ``request/dispatch`` digest. Always written ignorable, so a reader that predates it skips it.
    """

    TYPE: ClassVar[str] = "llm/retry"
    turn: int
    step: int
    attempt: int
    error_type: str
    status: int | None = None
    wait_ms: int | None = None
    provider_request_id: str | None = None
    received_bytes: int = 0


@dataclass(frozen=True, slots=True)
class AssistantChunk:
    """One server-sent event of a streamed answer, as it arrived (optional logging, off by default).

    ``attempt`` is the attempt of the step's request it belongs to, ``index`` its position in that attempt's
    stream, ``event`` the SSE event name (absent when the stream names none) and ``data`` its data text.
    Never model-visible; always written ignorable."""

    TYPE: ClassVar[str] = "assistant/chunk"
    turn: int
    step: int
    attempt: int
    index: int
    data: str
    event: str | None = None


#: Known event types that are always written ``ignorable``: readers that predate them skip them.
ALWAYS_IGNORABLE: frozenset[str] = frozenset({LlmRetry.TYPE, AssistantChunk.TYPE})


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
    | LlmRetry
    | AssistantChunk
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
