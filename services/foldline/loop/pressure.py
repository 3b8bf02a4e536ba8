"""Context pressure in the loop: batched tool-result trims and compaction with a summarize one-shot.

Between steps, when the deterministic estimate of the derived messages exceeds
:attr:`PressurePolicy.budget_tokens`, the loop relieves pressure in one of two ways, each one logged
batch and therefore one cache miss:

* **Trim** — when trimming old, large tool results (``foldline.core.compaction.plan_trims``) brings the
  estimate under budget, every trim is appended in the same batch: one single-entry surface replace per
  ``tool/result`` (same callId, trimmed content, the hidden event listed in ``sourceEventSeqs``).
* **Compact** — otherwise the range ``0..end`` before the recent window is summarized:
  ``compaction/start {start, end, estimatedTokens}`` is appended, the summarize one-shot is built by pure
  code from the logged region (:func:`~foldline.core.compaction.summarize_request`), serialized with the
  loop's serializer (images resolved and verified through the store) and sent; then, in one batch,
  ``compaction/summary {summary, provider, model, maxTokens, usage, serializer, serializerVersion,
  inputDigest}`` (the sha256 of the exact summarize body), the replacing ``user/message``
  (source ``compaction``, replace ``start..end`` listing every hidden event) and ``compaction/end``.

The summarize request is never marked as a loop request, so the invariant companion and other observers
of :func:`~foldline.replay.registry.is_loop_request` leave it alone. A failure of the one-shot closes the
compaction with ``compaction/end`` (nothing replaced) and propagates; an unreadable image is quarantined
exactly like in a loop step.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..core import codec
from ..core import compaction as cc
from ..core.content import TextBlock
from ..core.events import (
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    EventData,
    ReplaceOp,
    ToolResult,
    UserMessage,
)
from ..core.header import CallConfig
from ..core.limits import check_request_size
from ..core.projection import Message, MessageSequence, Session
from ..core.request import GenerateOptions
from ..errors import AttachmentError, ConfigError
from ..ports.attachments import AttachmentStore
from ..providers.base import Provider
from ..replay.step import quarantine_record

__all__ = ["PressureAction", "PressureContext", "PressurePolicy", "relieve_pressure"]


class PressureContext(Protocol):
    """What relieving pressure uses of a loop instance (its :attr:`~foldline.loop.Agent.context`): the live
    session, the provider and attachment store the loop sends with, the call config it was given, and the
    loop's own append (durable, then folded into the live session)."""

    @property
    def session(self) -> Session: ...

    @property
    def provider(self) -> Provider: ...

    @property
    def attachments(self) -> AttachmentStore | None: ...

    @property
    def config(self) -> CallConfig:
        """The call config the loop instance was given (``AgentOptions.config``)."""
        ...

    async def append(self, *datas: EventData) -> None:
        """Append the events as one batch at the session's head."""
        ...


@dataclass(frozen=True, slots=True)
class PressurePolicy:
    """When and how the loop relieves context pressure.

    ``budget_tokens``: the estimate above which it acts. ``keep_recent_tokens``: the recent window kept
    verbatim (never trimmed or compacted). Tool results estimated above ``trim_over_tokens`` (None: never
    trim) are cut to ``trim_keep_chars`` characters. The summary is asked for with ``summary_max_tokens``
    under ``summarize_config`` (default: the conversation's provider and model).
    """

    budget_tokens: int
    keep_recent_tokens: int = 2_000
    trim_over_tokens: int | None = 400
    trim_keep_chars: int = 200
    summary_max_tokens: int = 512
    summarize_config: CallConfig | None = None

    def __post_init__(self) -> None:
        if self.budget_tokens <= 0 or self.keep_recent_tokens < 0:
            raise ValueError("budget_tokens must be positive and keep_recent_tokens >= 0")
        if self.keep_recent_tokens >= self.budget_tokens:
            raise ValueError(
                f"keep_recent_tokens ({self.keep_recent_tokens}) must be below budget_tokens ({self.budget_tokens}), "
                "or compaction could never bring the context under budget"
            )
        if self.trim_over_tokens is not None and self.trim_over_tokens <= 0:
            raise ValueError("trim_over_tokens must be positive (or None to never trim)")
        if self.trim_keep_chars < 0 or self.summary_max_tokens <= 0:
            raise ValueError("trim_keep_chars must be >= 0 and summary_max_tokens positive")


@dataclass(frozen=True, slots=True)
class PressureAction:
    kind: Literal["trim", "compaction"]
    estimated_tokens: int
    first_seq: int  # seq of the first event the action appended
    trimmed: int = 0
    compacted: tuple[int, int] | None = None
    summarize_request: GenerateOptions | None = None


class _RunningEstimate:
    """``estimate_tokens`` of a session's messages, kept up to date in O(new messages) per step.

    A message list is only appended to while its surface generation lives (a replace builds a new list),
    so the running total is valid while the backing list is the same object and has not shrunk.
    """

    __slots__ = ("count", "items", "total")

    def __init__(self) -> None:
        self.items: object = None
        self.count = 0
        self.total = 0

    def of(self, messages: Sequence[Message]) -> int:
        items = messages.backing_list() if isinstance(messages, MessageSequence) else None
        if items is None or items is not self.items or len(messages) < self.count:
            self.items, self.count, self.total = items, 0, 0
        for i in range(self.count, len(messages)):
            self.total += cc.message_tokens(messages[i])
        self.count = len(messages)
        return self.total


_ESTIMATES: weakref.WeakKeyDictionary[PressureContext, _RunningEstimate] = weakref.WeakKeyDictionary()


async def relieve_pressure(loop: PressureContext, policy: PressurePolicy) -> PressureAction | None:
    """Trim or compact when the context is over budget; None when nothing was (or could be) done."""
    session = loop.session
    messages = session.derive_messages()
    running = _ESTIMATES.get(loop)
    if running is None:
        running = _ESTIMATES[loop] = _RunningEstimate()
    estimate = running.of(messages)
    if estimate <= policy.budget_tokens:
        return None
    trims: list[cc.Trim] = []
    if policy.trim_over_tokens is not None:
        trims = cc.plan_trims(
            messages,
            session.rules.surface,
            keep_recent_tokens=policy.keep_recent_tokens,
            trim_over_tokens=policy.trim_over_tokens,
            keep_chars=policy.trim_keep_chars,
        )
    saved = sum(t.saved_tokens for t in trims)
    span = cc.plan_compaction(
        messages, keep_recent_tokens=policy.keep_recent_tokens, min_region_tokens=policy.summary_max_tokens
    )
    if trims and (estimate - saved <= policy.budget_tokens or span is None):
        first = session.next_seq
        await loop.append(
            *(
                ToolResult(t.call_id, t.name, t.parts, t.is_error, ReplaceOp(t.position, t.position), (t.seq,))
                for t in trims
            )
        )
        return PressureAction("trim", estimate, first, trimmed=len(trims))
    if span is None:
        return None
    return await _compact(loop, policy, estimate, span)


async def _compact(
    loop: PressureContext, policy: PressurePolicy, estimate: int, span: tuple[int, int]
) -> PressureAction:
    session = loop.session
    start, end = span
    region = session.derive_messages()[start : end + 1]
    hidden = tuple(node.seq for node in session.rules.surface[start : end + 1])
    folded = session.header()
    base = policy.summarize_config or (folded.config if folded is not None else loop.config)
    config = CallConfig(base.provider, base.model, max_tokens=policy.summary_max_tokens)
    if config.provider != loop.provider.name:
        raise ConfigError(
            f"the summarize call goes through the loop's {loop.provider.name!r} adapter, but its config names "
            f"provider {config.provider!r}; set PressurePolicy.summarize_config to a {loop.provider.name} model"
        )
    request = cc.summarize_request(region, config)  # not marked: a one-shot, outside the invariant
    first = session.next_seq
    await loop.append(CompactionStart(start, end, estimate))
    try:
        serializer = loop.provider.serializer
        body = serializer.serialize(request, loop.attachments)
        check_request_size(len(body))
        response = await loop.provider.send(body)
    except AttachmentError as exc:
        await loop.append(quarantine_record(exc), CompactionEnd())
        raise
    except BaseException:
        await loop.append(CompactionEnd())
        raise
    summary = "".join(b.text for b in response.content if isinstance(b, TextBlock)).strip()
    events: list[EventData] = [
        CompactionSummary(
            summary,
            config.provider,
            config.model,
            policy.summary_max_tokens,
            response.usage,
            serializer.name,
            serializer.version,
            codec.digest_bytes(body),
            cc.SUMMARIZE_PROMPT_VERSION,
        ),
        UserMessage(
            f"u{loop.session.next_seq + 1}", cc.summary_content(summary), "compaction", ReplaceOp(start, end), hidden
        ),
        CompactionEnd(),
    ]
    await loop.append(*events)
    return PressureAction("compaction", estimate, first, compacted=span, summarize_request=request)
