"""Cache-read drops, classified from the log alone.

A **step** is a loop request (``request/dispatch``) together with the usage of its response (the next
appended ``assistant/message`` carrying usage). A dispatch that never got a response is not a step;
what happened before it still counts towards the next step's causes.

A step **drops** when

* it is not the session's first step and it read fewer tokens from the provider's prompt cache than the
  previous step of the same session left there: ``cache_read < previous.cache_read +
  previous.cache_write`` (the *baseline*). An append-only conversation under a live cache reads at least
  the prefix its previous request read or wrote, so anything less means cached work was thrown away; or
* it is the session's first step and it read nothing from the cache while sending a prompt (a cold
  start).

Every drop gets the causes the log shows between the previous step's dispatch (exclusive) and this
step's dispatch (inclusive), in this order of precedence — ``cause`` is the first, ``causes`` all:

``first-request``  no earlier step in the session;
``header-change``  a ``request/header`` with reason ``change`` (system prompt, tools or config changed);
``resume``         a ``request/header`` with reason ``resume`` or a ``session/end-seed`` (fork seed):
                   a new loop instance rendered its header afresh;
``compaction``     ``compaction/*`` events or a replacing ``user/message`` (source ``compaction``), or
                   any surface replace of more than one entry;
``trim``           a single-entry surface replace of a tool result;
``thinking-context`` a new user message after an assistant message that carries reasoning blocks: providers
                   that keep only the current tool loop's reasoning in context (Anthropic models before
                   Opus 4.5, OpenAI ``reasoning.context: current_turn``) drop the earlier turn's reasoning
                   from the prompt there, so the cached prefix that held it no longer matches;
``cache-ttl``      the time between the two dispatches' envelope timestamps is at least the cache TTL the
                   previous request wrote with: the logged ``config.cacheTtl`` of its header (``5m`` 300 s,
                   ``1h`` 3600 s, ``24h`` 86400 s), else the provider's default (entries expire ``ttl``
                   seconds after their last use);
``unexplained``    none of the above: the log does not account for the drop.

A drop whose causes include ``header-change`` names the header fields that changed (``header_fields``:
``config.<key>`` for each call-config key, ``system``, ``tools``), compared with the snapshot in force before.

Each step carries the provider's names for its answer (the ``assistant/message``'s ``provider_request_id`` and
``provider_message_id``), so a drop — an unexplained one above all — can be taken to the provider: the request
id for a support ticket, this and the previous step's message ids for its cache diagnostics.

Pure: no I/O and no clock — times come from envelope timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import assert_never

from .content import REASONING_KINDS, Usage
from .diff import diff_headers
from .events import (
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    ControlEvent,
    Envelope,
    LlmRetry,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    SessionErased,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from .header import CACHE_TTLS, EpochHeader

__all__ = [
    "DEFAULT_CACHE_TTL_SECONDS",
    "DROP_CAUSES",
    "EXPLAINED_CAUSES",
    "Drop",
    "DropTracker",
    "Step",
    "StepVerdict",
    "classify_session",
    "session_drops",
]

EXPLAINED_CAUSES: tuple[str, ...] = (
    "first-request",
    "header-change",
    "resume",
    "compaction",
    "trim",
    "thinking-context",
    "cache-ttl",
)
DROP_CAUSES: tuple[str, ...] = (*EXPLAINED_CAUSES, "unexplained")

#: Shortest prompt-cache lifetime per provider, in seconds since the entry's last use (both providers
#: default to five minutes; the emulator's AnthropicCachePolicy / OpenAICachePolicy use the same).
DEFAULT_CACHE_TTL_SECONDS: Mapping[str, float] = {"anthropic": 300.0, "openai": 300.0}
FALLBACK_TTL_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Step:
    """One loop request and the usage its response reported."""

    dispatch_seq: int
    response_seq: int
    turn: int
    step: int
    time_ms: int  # the dispatch envelope's timestamp
    provider: str
    model: str
    usage: Usage
    cache_ttl_seconds: float | None = None  # the logged config.cacheTtl of the request's header, if any
    request_id: str | None = None  # the provider's request id of the answer
    message_id: str | None = None  # the provider's id of the answer


@dataclass(frozen=True, slots=True)
class Drop:
    """A step that read fewer cache tokens than its baseline, and why."""

    session_id: str
    step: Step
    previous: Step | None
    cause: str
    causes: tuple[str, ...]
    gap_seconds: float | None  # between the two dispatches; None for a first request
    header_fields: tuple[str, ...] = ()  # the header fields a header-change changed (sorted)

    @property
    def explained(self) -> bool:
        return self.cause != "unexplained"

    @property
    def baseline_tokens(self) -> int:
        """What the step was expected to read at least: the previous step's cache read + write (0 when first)."""
        return _baseline(self.previous)

    @property
    def lost_tokens(self) -> int:
        """Cache-read tokens missing against the baseline (a cold first request: its whole prompt)."""
        if self.previous is None:
            return self.step.usage.prompt_tokens
        return self.baseline_tokens - self.step.usage.cache_read

    def to_json(self) -> dict[str, object]:
        s = self.step
        return {
            "session": self.session_id,
            "seq": s.dispatch_seq,
            "turn": s.turn,
            "step": s.step,
            "provider": s.provider,
            "model": s.model,
            "cause": self.cause,
            "causes": list(self.causes),
            "header_fields": list(self.header_fields),
            "explained": self.explained,
            "cache_read_tokens": s.usage.cache_read,
            "baseline_tokens": self.baseline_tokens,
            "previous_seq": self.previous.dispatch_seq if self.previous else None,
            "lost_tokens": self.lost_tokens,
            "prompt_tokens": s.usage.prompt_tokens,
            "gap_seconds": self.gap_seconds,
            "request_id": s.request_id,
            "message_id": s.message_id,
            "previous_message_id": self.previous.message_id if self.previous else None,
        }


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """Every step gets one: the step, the one before it, and its drop (``None`` when it did not drop)."""

    session_id: str
    step: Step
    previous: Step | None
    drop: Drop | None

    @property
    def provider(self) -> str:
        return self.step.provider

    @property
    def model(self) -> str:
        return self.step.model


@dataclass(slots=True)
class _Pending:
    seq: int
    turn: int
    step: int
    time_ms: int
    provider: str
    model: str
    causes: set[str] = field(default_factory=set)
    ttl: float | None = None
    header_fields: set[str] = field(default_factory=set)


def _baseline(previous: Step | None) -> int:
    return previous.usage.cache_read + previous.usage.cache_write if previous is not None else 0


class DropTracker:
    """Incremental classifier of one session: feed its envelopes in seq order, get one verdict per step.

    ``classify_session`` folds a whole log; the metrics decorator keeps one tracker per live session.
    """

    def __init__(self, session_id: str, ttl_seconds: Mapping[str, float] | None = None) -> None:
        self.session_id = session_id
        self.ttl_seconds = dict(DEFAULT_CACHE_TTL_SECONDS if ttl_seconds is None else ttl_seconds)
        self.next_seq = 0
        self.previous: Step | None = None
        self._provider = ""
        self._model = ""
        self._ttl: float | None = None
        self._reasoned = False  # the last appended assistant message carries reasoning blocks
        self._causes: set[str] = set()  # seen since the last dispatch
        self._header: EpochHeader | None = None  # the snapshot in force
        self._fields: set[str] = set()  # header fields changed since the last dispatch
        self._pending: _Pending | None = None

    def ttl_for(self, provider: str) -> float:
        return self.ttl_seconds.get(provider, FALLBACK_TTL_SECONDS)

    def feed(self, envelopes: Iterable[Envelope]) -> Iterator[StepVerdict]:
        """Consume ``envelopes`` (next in seq order); yields a verdict for each step they complete."""
        for env in envelopes:
            if env.seq != self.next_seq:
                raise ValueError(
                    f"session {self.session_id!r}: drop classifier expected seq {self.next_seq}, got {env.seq}; "
                    "feed the session's events in order from seq 0"
                )
            self.next_seq += 1
            verdict = self._one(env)
            if verdict is not None:
                yield verdict

    def _one(self, env: Envelope) -> StepVerdict | None:
        data = env.data
        match data:
            case RequestHeader():
                config = data.header.config
                self._provider, self._model = config.provider, config.model
                self._ttl = CACHE_TTLS[config.cache_ttl] if config.cache_ttl is not None else None
                if data.reason == "change":
                    self._causes.add("header-change")
                    self._fields |= _changed_fields(self._header, data.header)
                elif data.reason == "resume":
                    self._causes.add("resume")
                self._header = data.header
            case SessionEndSeed():
                self._causes.add("resume")
            case CompactionStart() | CompactionSummary() | CompactionEnd():
                self._causes.add("compaction")
            case UserMessage():
                if data.source == "compaction" or isinstance(data.surface_op, ReplaceOp):
                    self._causes.add("compaction")
                elif self._reasoned:
                    self._causes.add("thinking-context")
            case ToolResult():
                op = data.surface_op
                if isinstance(op, ReplaceOp):
                    self._causes.add("trim" if op.start == op.end else "compaction")
            case RequestDispatch():
                carried = self._pending  # an unanswered dispatch: what happened before it still counts
                self._pending = _Pending(
                    env.seq,
                    data.turn,
                    data.step,
                    env.time,
                    self._provider,
                    self._model,
                    (carried.causes if carried is not None else set()) | self._causes,
                    self._ttl,
                    (carried.header_fields if carried is not None else set()) | self._fields,
                )
                self._causes, self._fields = set(), set()
            case AssistantMessage():
                if data.surface_op == "append":
                    self._reasoned = any(b.kind in REASONING_KINDS for b in data.content)
                if isinstance(data.surface_op, ReplaceOp):
                    self._causes.add("compaction")
                elif self._pending is not None and data.usage is not None:
                    pending, self._pending = self._pending, None
                    step = Step(
                        pending.seq,
                        env.seq,
                        pending.turn,
                        pending.step,
                        pending.time_ms,
                        pending.provider,
                        pending.model,
                        data.usage,
                        pending.ttl,
                        data.provider_request_id,
                        data.provider_message_id,
                    )
                    return self._judge(step, pending.causes, pending.header_fields)
            case (
                TurnStart()
                | TurnEnd()
                | StepStart()
                | StepEnd()
                | ToolCall()
                | AttachmentQuarantine()
                | LlmRetry()
                | AssistantChunk()
                | SessionErased()
                | ControlEvent()
                | UnknownEvent()
            ):
                pass
            case _:
                assert_never(data)
        return None

    def _judge(self, step: Step, seen: set[str], fields: set[str]) -> StepVerdict:
        previous, self.previous = self.previous, step
        if previous is None:
            cold = step.usage.cache_read == 0 and step.usage.prompt_tokens > 0
            drop = Drop(self.session_id, step, None, "first-request", ("first-request",), None) if cold else None
            return StepVerdict(self.session_id, step, None, drop)
        if step.usage.cache_read >= _baseline(previous):
            return StepVerdict(self.session_id, step, previous, None)
        gap = (step.time_ms - previous.time_ms) / 1000.0
        causes = set(seen)
        ttl = previous.cache_ttl_seconds if previous.cache_ttl_seconds is not None else self.ttl_for(previous.provider)
        if gap >= ttl:
            causes.add("cache-ttl")
        ordered = tuple(c for c in EXPLAINED_CAUSES if c in causes) or ("unexplained",)
        changed = tuple(sorted(fields)) if "header-change" in ordered else ()
        drop = Drop(self.session_id, step, previous, ordered[0], ordered, gap, changed)
        return StepVerdict(self.session_id, step, previous, drop)


def _changed_fields(old: EpochHeader | None, new: EpochHeader) -> set[str]:
    """The header fields that differ: ``config.<key>``, ``system``, ``tools``."""
    d = diff_headers(old, new)
    fields = {f"config.{key}" for key, _, _ in d.config}
    if d.system:
        fields.add("system")
    if d.tools_added or d.tools_removed or d.tools_changed:
        fields.add("tools")
    return fields


def classify_session(
    session_id: str, events: Iterable[Envelope], ttl_seconds: Mapping[str, float] | None = None
) -> list[StepVerdict]:
    """One verdict per step of a whole session log (events from seq 0, in order)."""
    return list(DropTracker(session_id, ttl_seconds).feed(events))


def session_drops(
    session_id: str, events: Iterable[Envelope], ttl_seconds: Mapping[str, float] | None = None
) -> list[Drop]:
    """Every drop of a session log, with its cause."""
    return [v.drop for v in classify_session(session_id, events, ttl_seconds) if v.drop is not None]
