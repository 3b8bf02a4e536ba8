"""The event envelope and the full catalog of session events.

An envelope is ``{type, seq, time, data, ignorable?, sealed?}``. ``seq`` is the index of the event in its
session (gapless from 0); ``time`` is epoch milliseconds supplied by the caller and never reaches a
model; ``sealed`` says that the content fields of ``data`` hold sealed tokens (``core/sealing.py``) and
under which data key. Events are frozen once built. :data:`EventData` is the union of every event payload.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, TypeAlias, get_args

import msgspec

from .content import ContentBlock, ToolResultPart, Usage
from .frozen import FrozenDict
from .header import EpochHeader, HeaderReason
from .records import MAX_INT, Content, Digest, Id, Nat, Pos, Record, SessionId

__all__ = [
    "MAX_INT",
    "MAX_TIME_MS",
    "SESSION_FORMAT_VERSION",
    "SURFACE_TYPES",
    "TURN_END_REASONS",
    "ALWAYS_IGNORABLE",
    "EVENT_TYPES",
    "Event",
    "AssistantChunk",
    "AssistantMessage",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalVerdict",
    "AttachmentQuarantine",
    "ControlEvent",
    "CONTROL_TYPES",
    "InboxClaim",
    "RecoveryPolicy",
    "SessionParent",
    "TurnRecovery",
    "CompactionEnd",
    "CompactionStart",
    "CompactionSummary",
    "Envelope",
    "EventData",
    "LlmRetry",
    "ReplaceOp",
    "RequestDispatch",
    "RequestHeader",
    "Seal",
    "SessionEndSeed",
    "SessionErased",
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
    "logged",
]

SESSION_FORMAT_VERSION = 0

#: The latest event ``time``: 9999-12-31T23:59:59.999Z, the last instant a calendar date can name.
MAX_TIME_MS = 253_402_300_799_999

TurnEndReason = Literal[
    "completed", "aborted", "blocked", "error", "max-tokens", "interrupted", "refusal", "context-overflow"
]
TURN_END_REASONS: frozenset[str] = frozenset(get_args(TurnEndReason))
USER_SOURCES: frozenset[str] = frozenset(
    {"user", "inject", "tool-context", "pre-step", "compaction", "fork", "refusal-reset"}
)


class ReplaceOp(Record, tag_field="op", tag="replace", frozen=True):
    """Replace the visible surface entries ``start..end`` (inclusive positions) with this event."""

    TAG_RULE: ClassVar[str] = "surface-op"
    start: Nat
    end: Nat


SurfaceOp: TypeAlias = (
    Annotated[
        Literal["append"],
        msgspec.Meta(extra={"rule": "surface-op", "avro": {"enum": "AppendOp", "default": "append"}}),
    ]
    | ReplaceOp
)
#: Seqs of earlier events an event derives from, in the order written.
SourceSeqs: TypeAlias = Annotated[tuple[Nat, ...], msgspec.Meta(extra={"rule": "surface-op"})]


class Event(Record, frozen=True):
    """The payload of one event type; ``TYPE`` is its logged ``type``."""

    TYPE: ClassVar[str]


class UserMessage(Event, frozen=True):
    TYPE: ClassVar[str] = "user/message"
    JSON_CONSTANTS: ClassVar[dict[str, str]] = {"role": "user"}
    id: Id
    content: tuple[ContentBlock, ...]
    source: str = "user"
    surface_op: SurfaceOp = "append"
    source_event_seqs: SourceSeqs | None = None


class AssistantMessage(Event, frozen=True):
    """A model answer. ``provider_request_id`` / ``provider_message_id`` name it at the provider (the HTTP
    request id header and the answer's own id), for support tickets and cache diagnostics; not model-visible."""

    TYPE: ClassVar[str] = "assistant/message"
    JSON_CONSTANTS: ClassVar[dict[str, str]] = {"role": "assistant"}
    id: Id
    content: tuple[ContentBlock, ...]
    usage: Usage | None = None
    stop_reason: str | None = None
    surface_op: SurfaceOp = "append"
    source_event_seqs: SourceSeqs | None = None
    provider_request_id: str | None = None
    provider_message_id: str | None = None


class ToolResult(Event, frozen=True):
    """A tool call's result. ``child_session_id`` names the session of the sub-agent the call ran (its first
    event, ``session/parent``, names this session and call back); not model-visible."""

    TYPE: ClassVar[str] = "tool/result"
    call_id: Id
    name: Id
    content: tuple[ToolResultPart, ...]
    is_error: bool = False
    surface_op: SurfaceOp = "append"
    source_event_seqs: SourceSeqs | None = None
    child_session_id: SessionId | None = None


class TurnStart(Event, frozen=True):
    TYPE: ClassVar[str] = "turn/start"
    turn: Nat


class TurnEnd(Event, frozen=True):
    TYPE: ClassVar[str] = "turn/end"
    turn: Nat
    reason: Annotated[TurnEndReason, msgspec.Meta(extra={"rule": "turn-end-reason"})]


class StepStart(Event, frozen=True):
    TYPE: ClassVar[str] = "step/start"
    turn: Nat
    step: Nat


class StepEnd(Event, frozen=True):
    TYPE: ClassVar[str] = "step/end"
    turn: Nat
    step: Nat


class ToolCall(Event, frozen=True):
    TYPE: ClassVar[str] = "tool/call"
    turn: Nat
    step: Nat
    call_id: Id
    name: Id
    arguments: Annotated[Content, msgspec.Meta(description="The raw JSON text the model produced.")]


class RequestHeader(Event, frozen=True):
    TYPE: ClassVar[str] = "request/header"
    header: EpochHeader
    reason: Annotated[HeaderReason, msgspec.Meta(extra={"rule": "header-reason"})]


class RequestDispatch(Event, frozen=True):
    """The digest of the exact wire bytes of a loop request, recorded before they are sent."""

    TYPE: ClassVar[str] = "request/dispatch"
    turn: Nat
    step: Nat
    serializer: str
    serializer_version: Nat
    digest: Digest
    bytes: Nat


class SessionEndSeed(Event, frozen=True):
    """Closes a forked prefix; the child's own events follow."""

    TYPE: ClassVar[str] = "session/end-seed"
    parent_id: SessionId | None = None
    seed_length: Nat | None = None


class CompactionStart(Event, frozen=True):
    TYPE: ClassVar[str] = "compaction/start"
    start: Nat
    end: Nat
    estimated_tokens: Nat


class CompactionSummary(Event, frozen=True):
    """The summarize one-shot's answer. ``serializer``/``serializer_version``/``input_digest`` name the exact
    body that was sent (sha256 of its bytes), so ``foldline verify`` proves the rebuilt input byte for byte;
    logs written before these fields existed are rechecked without that proof. ``prompt_version`` names the
    summarize prompt and transcript syntax the input was built with; absent means version 1."""

    TYPE: ClassVar[str] = "compaction/summary"
    summary: Content
    provider: str
    model: str
    max_tokens: Pos
    usage: Usage | None = None
    serializer: str | None = None
    serializer_version: Pos | None = None
    input_digest: Digest | None = None
    # the summarize prompt version (docs/COMPACTION.md); absent means 1
    prompt_version: (
        Annotated[int, msgspec.Meta(ge=1, le=MAX_INT, description="The summarize prompt version (absent: 1).")] | None
    ) = None


class CompactionEnd(Event, frozen=True):
    TYPE: ClassVar[str] = "compaction/end"


class AttachmentQuarantine(Event, frozen=True):
    """An attachment object could not be used; records the failure and the proposed recovery."""

    TYPE: ClassVar[str] = "attachment/quarantine"
    attachment_id: str
    failure: str
    recovery: str


class LlmRetry(Event, frozen=True):
    """One failed attempt of a step's provider request, appended before the wait that follows it.

    ``attempt`` counts from 1; ``status`` is the HTTP status (absent for a transport failure); ``error_type``
    the provider's error type or the transport failure's name; ``wait_ms`` the wait before the next attempt
    (absent: the request was given up on after this attempt); ``received_bytes`` the answer bytes that had
    arrived when it failed (0: before the first byte). Every attempt sends the bytes of the step's
    ``request/dispatch`` digest. Always written ignorable, so a reader that predates it skips it.
    """

    TYPE: ClassVar[str] = "llm/retry"
    turn: Nat
    step: Nat
    attempt: Pos
    error_type: str
    status: Annotated[int, msgspec.Meta(ge=100, le=MAX_INT)] | None = None
    wait_ms: Nat | None = None
    provider_request_id: str | None = None
    received_bytes: Nat = 0


class AssistantChunk(Event, frozen=True):
    """One server-sent event of a streamed answer, as it arrived (optional logging, off by default).

    ``attempt`` is the attempt of the step's request it belongs to, ``index`` its position in that attempt's
    stream, ``event`` the SSE event name (absent when the stream names none) and ``data`` its data text.
    Never model-visible; always written ignorable."""

    TYPE: ClassVar[str] = "assistant/chunk"
    turn: Nat
    step: Nat
    attempt: Pos
    index: Nat
    data: Content
    event: str | None = None


class SessionErased(Event, frozen=True):
    """The session's content is being erased: ``foldline erase`` appends it before it destroys the data key.

    ``erasure`` names the erasure record (the key store's audit log: who, when, why, what), ``scope`` says
    whether the session was named (``session``) or a subject it belongs to (``subject``), ``by`` who asked,
    ``reason`` why (as given; absent when none was), ``kid`` the data key destroyed. The envelope's ``time`` is
    when. It holds no content. Always written ignorable, so a reader that predates it skips it."""

    TYPE: ClassVar[str] = "session/erased"
    erasure: Id
    scope: Literal["session", "subject"]
    by: str
    kid: str
    reason: str | None = None


class ControlEvent(Event, frozen=True):
    """An event of the loop's control flow — pauses, the durable inbox, crash recovery, lineage. Never
    model-visible and always written ignorable (a reader that predates it skips it, and Avro carries it as
    ``UnknownEvent``, docs/SCHEMAS.md rule 4); no fold of messages or headers reads it."""


ApprovalVerdict = Literal["allow", "deny"]
RecoveryPolicy = Literal["continue", "end"]


class ApprovalRequest(ControlEvent, frozen=True):
    """The tool call ``call_id`` of the step's answer waits for a decision before it runs; the turn pauses.

    Appended with the answer (``assistant/message`` and its ``tool/call`` s). ``arguments_digest`` is the
    sha256 of the call's raw arguments text (UTF-8): the decision is about exactly those arguments."""

    TYPE: ClassVar[str] = "approval/request"
    turn: Nat
    step: Nat
    call_id: Id
    name: Id
    arguments_digest: Digest


class ApprovalDecision(ControlEvent, frozen=True):
    """The decision on an approval request, moved into the log by the session's writer from its inbox.

    ``entry`` is the inbox entry it came from (exactly once: a later claim skips an entry a decision names).
    ``verdict`` ``deny`` answers the call with an error result carrying ``reason``; ``allow`` runs it — with
    ``arguments`` (raw JSON text) in place of the model's when the approver changed them. ``decided_by`` and
    ``decided_at`` (epoch ms) say who decided and when, as the decider stated it."""

    TYPE: ClassVar[str] = "approval/decision"
    call_id: Id
    verdict: ApprovalVerdict
    entry: Id
    reason: str | None = None
    arguments: str | None = None
    decided_by: str | None = None
    decided_at: Nat | None = None


class InboxClaim(ControlEvent, frozen=True):
    """The inbox entries a step's opening takes, in order: the ``user/message`` s that follow it in the same
    append are their messages, one each, in this order. An entry a claim names is never entered again."""

    TYPE: ClassVar[str] = "inbox/claim"
    entries: tuple[Id, ...]


class TurnRecovery(ControlEvent, frozen=True):
    """What a new loop instance did with a turn the previous one left open mid-step (a crash, a kill).

    ``policy`` ``end`` closes it (every unanswered call answered as interrupted, the turn ended ``error``);
    ``continue`` answers the calls in ``interrupted`` as interrupted, runs the calls in ``rerun`` again (tools
    marked idempotent) and goes on with the turn's next step."""

    TYPE: ClassVar[str] = "turn/recover"
    turn: Nat
    policy: RecoveryPolicy
    interrupted: tuple[Id, ...] = ()
    rerun: tuple[Id, ...] = ()


class SessionParent(ControlEvent, frozen=True):
    """The first event of a sub-agent's session: the session and tool call of the parent that runs it.

    (A fork child names its parent in ``session/end-seed`` instead, after the parent's prefix.)"""

    TYPE: ClassVar[str] = "session/parent"
    parent_id: SessionId
    call_id: Id
    tool: Id


#: The control event types (:class:`ControlEvent`), always written ignorable.
CONTROL_TYPES: frozenset[str] = frozenset(
    {ApprovalRequest.TYPE, ApprovalDecision.TYPE, InboxClaim.TYPE, TurnRecovery.TYPE, SessionParent.TYPE}
)
#: Known event types that are always written ``ignorable``: readers that predate them skip them.
ALWAYS_IGNORABLE: frozenset[str] = frozenset({LlmRetry.TYPE, AssistantChunk.TYPE, SessionErased.TYPE}) | CONTROL_TYPES


class UnknownEvent(Record, frozen=True):
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
    | SessionErased
    | ApprovalRequest
    | ApprovalDecision
    | InboxClaim
    | TurnRecovery
    | SessionParent
    | UnknownEvent
)

#: Every known event type, in the order of :data:`EventData`.
EVENT_TYPES: tuple[type[Event], ...] = tuple(t for t in get_args(EventData) if issubclass(t, Event))
SURFACE_TYPES: frozenset[str] = frozenset({UserMessage.TYPE, AssistantMessage.TYPE, ToolResult.TYPE})


class Seal(Record, frozen=True):
    """How the content fields of an event's data are sealed: the version of the sealing format (docs/FORMAT.md,
    "Sealed content") and the id of the data key (one per session) they are sealed under."""

    kid: Annotated[
        str, msgspec.Meta(pattern=r"^[0-9a-f]{32}\Z", extra={"expect": "32 lowercase hex digits (a data key id)"})
    ]
    v: Pos


def logged(seq: int, time: int, data: EventData) -> Envelope:
    """The envelope the loop appends ``data`` in: ignorable exactly when its type is always written so."""
    return Envelope(seq, time, data, not isinstance(data, UnknownEvent) and data.TYPE in ALWAYS_IGNORABLE)


class Envelope(msgspec.Struct, frozen=True, gc=False):
    seq: int
    time: int
    data: EventData
    ignorable: bool = False
    sealed: Seal | None = None  # the content fields of data hold sealed tokens (None: they hold the content)

    @property
    def type(self) -> str:
        data = self.data
        if isinstance(data, UnknownEvent):
            return data.type
        return data.TYPE
