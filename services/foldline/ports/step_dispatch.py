"""The StepDispatcher port: how a loop has one step's model call served by a dispatcher.

The loop stays the session's only writer. The step's opening (``step/start``, the entered ``user/message``
batch, an owed ``request/header`` — after the previous step's tool results and ``step/end``) is not written
yet: the hand-over carries it, with the other events since the session's last ``request/dispatch``, as a fold
delta (:attr:`StepHandoff.pending`, the events' derived message bytes and header exactly as a projector would
fold them), then:

1. :meth:`StepDispatcher.prepare` — the dispatcher builds the request of the log prefix ``[0, boundary)``
   from the projected **fold** up to the pending events, plus the pending delta (never from the loop's
   other memory), serializes it to the exact wire body and answers a :class:`PreparedStep`: the serializer
   and the body's digest and length. Nothing is sent.
2. The loop's invariant companion checks that digest against its own rebuild from the durable log and the
   pending events, and the loop appends the pending events and ``request/dispatch`` in one write — durable
   before the bytes leave. (When the pending events hold a surface replace, which a delta cannot carry, the
   loop writes them first and hands over with no pending delta: the fold then holds the whole prefix.)
3. :meth:`StepDispatcher.send` — the dispatcher sends exactly those bytes, once (rebuilt from the fold if
   it no longer holds them; a different digest is refused), and answers the provider's
   :class:`StepAnswer`, which the loop appends as the ``assistant/message`` and its ``tool/call`` events.
   A failed attempt raises the provider's error as it was (status, retry-after, request id, bytes
   received: :func:`error_to_json` carries it between processes); the loop's retry policy appends it as
   ``llm/retry`` and calls ``send`` again — so every attempt is logged before the next one leaves.

So a hand-over moves no write ownership anywhere: the dispatcher writes nothing to the log.

Adapters: :class:`foldline.dispatcher.Dispatcher` (in-process) and
:class:`foldline.adapters.redis_steps.RedisStepClient` (``foldline dispatcher`` processes, over Redis: the
other end serves each call with a StepDispatcher, :func:`~foldline.adapters.redis_steps.serve_steps`). Both
run the one contract suite, ``tests/contracts/step_dispatch.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.content import ContentBlock, Usage
from ..core.deltas import AnswerDelta
from ..core.fold import FoldDelta
from ..core.wire import block_to_json, content_from_json, usage_from_plain, usage_to_json
from ..errors import (
    AnswerTooLarge,
    AttachmentCorrupt,
    AttachmentError,
    AttachmentNotFound,
    AttachmentReadFailed,
    ContextOverflow,
    DispatchFailed,
    DispatchLost,
    FencedError,
    FoldlineError,
    FoldTimeout,
    FormatError,
    ProviderStatusError,
    ProviderStreamError,
    ProviderTransportError,
)
from .event_log import WriterLease

__all__ = ["PreparedStep", "StepAnswer", "StepDispatcher", "StepHandoff", "error_from_json", "error_to_json"]


def _fail(what: str, value: Any, exc: BaseException) -> FormatError:
    return FormatError(what, f"malformed {what.replace('-', ' ')} {str(value)[:200]!r}: {exc}")


@dataclass(frozen=True, slots=True)
class StepHandoff:
    """One step boundary a loop has served by a dispatcher."""

    session_id: str
    boundary: int  # the request is built from the log prefix [0, boundary); request/dispatch gets this seq
    turn: int
    step: int
    epoch: int  # the loop instance's writer-lease epoch (names the instance in errors and metrics)
    archive: bool = False  # keep the exact wire body in the attachment store, keyed by its digest
    # the trace the loop's step belongs to (W3C trace context: traceparent, tracestate), when it is traced
    trace: Mapping[str, str] | None = None
    # the events [pending.first_seq, boundary) as a fold delta: from the session's last request/dispatch (written)
    # to the held opening (not written yet); the request is the fold plus what it lacks of them (a send's
    # rebuild, after the loop wrote them, reads them folded)
    pending: FoldDelta | None = None

    def __post_init__(self) -> None:
        if self.pending is not None and self.pending.last_seq != self.boundary - 1:
            raise FormatError(
                "step-handoff",
                f"the pending events of a hand-over end right before its boundary {self.boundary}, "
                f"not at seq {self.pending.last_seq}",
            )

    @property
    def lease(self) -> WriterLease:
        return WriterLease(self.session_id, self.epoch)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session": self.session_id,
            "boundary": self.boundary,
            "turn": self.turn,
            "step": self.step,
            "epoch": self.epoch,
            "archive": self.archive,
        }
        if self.trace:
            out["trace"] = dict(self.trace)
        if self.pending is not None:
            d = self.pending
            out["pending"] = {
                "first": d.first_seq,
                "epoch": d.epoch,
                "messages": [[seq, raw.decode()] for seq, raw in d.messages],
                "header": None if d.header is None else [d.header[0], d.header[1].decode()],
            }
        return out

    @staticmethod
    def from_json(value: Any) -> StepHandoff:
        try:
            handoff = StepHandoff(
                str(value["session"]),
                int(value["boundary"]),
                int(value["turn"]),
                int(value["step"]),
                int(value["epoch"]),
                bool(value.get("archive", False)),
                {str(k): str(v) for k, v in value["trace"].items()} if value.get("trace") else None,
                _pending_from_json(value.get("pending"), int(value["boundary"])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _fail("step-handoff", value, exc) from exc
        if handoff.boundary < 1:
            raise FormatError("step-handoff", f"a step boundary is at least 1 (after step/start), got {value!r}")
        return handoff


def _pending_from_json(value: Any, boundary: int) -> FoldDelta | None:
    if value is None:
        return None
    header = value["header"]
    return FoldDelta(
        int(value["first"]),
        boundary - 1,
        int(value["epoch"]),
        tuple((int(seq), str(raw).encode()) for seq, raw in value["messages"]),
        None if header is None else (int(header[0]), str(header[1]).encode()),
    )


@dataclass(frozen=True, slots=True)
class PreparedStep:
    """The body a dispatcher built for a step: its serializer, digest and length (the bytes stay there).

    ``timings`` are the dispatcher's own seconds (``fold_wait``, ``build``) for the loop's breakdown."""

    session_id: str
    boundary: int
    serializer: str
    serializer_version: int
    digest: str
    bytes: int
    timings: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "boundary": self.boundary,
            "serializer": self.serializer,
            "serializerVersion": self.serializer_version,
            "digest": self.digest,
            "bytes": self.bytes,
            "timings": dict(self.timings),
        }

    @staticmethod
    def from_json(value: Any) -> PreparedStep:
        try:
            return PreparedStep(
                str(value["session"]),
                int(value["boundary"]),
                str(value["serializer"]),
                int(value["serializerVersion"]),
                str(value["digest"]),
                int(value["bytes"]),
                {str(k): float(v) for k, v in (value.get("timings") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _fail("prepared-step", value, exc) from exc


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """A provider's answer to a step's request, as the loop logs it (content, usage, stop reason).

    ``timings`` are the dispatcher's own seconds (``send``: the provider call) for the loop's breakdown."""

    content: tuple[ContentBlock, ...]
    usage: Usage
    stop_reason: str
    timings: Mapping[str, float] = field(default_factory=dict)
    request_id: str | None = None  # the provider's request id (response header)
    message_id: str | None = None  # the provider's message id

    def to_json(self) -> dict[str, Any]:
        return {
            "content": [block_to_json(b) for b in self.content],
            "usage": usage_to_json(self.usage),
            "stopReason": self.stop_reason,
            "timings": dict(self.timings),
            "requestId": self.request_id,
            "messageId": self.message_id,
        }

    @staticmethod
    def from_json(value: Any) -> StepAnswer:
        try:
            return StepAnswer(
                content_from_json(value["content"]),
                usage_from_plain(value["usage"]),
                str(value["stopReason"]),
                {str(k): float(v) for k, v in (value.get("timings") or {}).items()},
                _opt_str(value.get("requestId")),
                _opt_str(value.get("messageId")),
            )
        except FoldlineError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _fail("step-answer", value, exc) from exc


class StepDispatcher(Protocol):
    async def prepare(self, handoff: StepHandoff) -> PreparedStep:
        """Build and serialize the step's request from the fold; send nothing. FoldlineError on failure
        (an unusable attachment: its AttachmentError, for the loop to quarantine)."""
        ...

    async def send(
        self, handoff: StepHandoff, prepared: PreparedStep, *, on_delta: Callable[[AnswerDelta], None] | None = None
    ) -> StepAnswer:
        """Send exactly the prepared body once (its digest is logged by now) and answer the provider's reply;
        a failed attempt raises the provider's error (:class:`~foldline.errors.ProviderError`), a send that
        may or may not have left (its dispatcher died holding it) :class:`~foldline.errors.DispatchLost`.

        ``on_delta``: given each piece of a streamed answer as it arrives, best effort — a relay that loses
        pieces costs the caller's display, never the answer (which is the reply)."""
        ...

    async def aclose(self) -> None:
        """Release connections and provider clients."""
        ...


# ---------------------------------------------------------------------------- errors between processes


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


_ATTACHMENT_ERRORS: dict[str, type[AttachmentError]] = {
    c.__name__: c for c in (AttachmentNotFound, AttachmentCorrupt, AttachmentReadFailed, AttachmentError)
}


def error_to_json(exc: FoldlineError) -> dict[str, Any]:
    """A dispatcher's error as JSON, with what the loop needs to act on it exactly as in-process: a
    provider's status, retry-after, retry hints and request id; the bytes of the answer received; the
    attachment an :class:`~foldline.errors.AttachmentError` names; the epochs a
    :class:`~foldline.errors.FencedError` names."""
    out: dict[str, Any] = {"kind": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, DispatchFailed):  # the receiver names the session and seq again
        out["message"] = exc.detail
    elif isinstance(exc, AttachmentError):
        out["attachmentId"] = exc.attachment_id
        out["message"] = str(exc).removeprefix(f"attachment {exc.attachment_id}: ")
    elif isinstance(exc, ProviderStatusError):
        out.update(
            provider=exc.provider,
            status=exc.status,
            excerpt=exc.excerpt,
            errorType=exc.error_type,
            requestId=exc.request_id,
            retryAfter=exc.retry_after,
            shouldRetry=exc.should_retry,
            final=exc.final,
        )
    elif isinstance(exc, ProviderTransportError):
        out.update(receivedBytes=exc.received_bytes, errorType=exc.error_type)
    elif isinstance(exc, ProviderStreamError):
        out.update(
            receivedBytes=exc.received_bytes,
            errorType=exc.error_type,
            retryable=exc.retryable,
            requestId=exc.request_id,
        )
    elif isinstance(exc, AnswerTooLarge):
        out.update(receivedBytes=exc.received_bytes)
    elif isinstance(exc, FencedError):
        out.update(epoch=exc.epoch, currentEpoch=exc.current_epoch)
    return out


def error_from_json(value: Any, session_id: str, boundary: int) -> FoldlineError:
    """The error :func:`error_to_json` described; a kind it does not carry is a
    :class:`~foldline.errors.DispatchFailed` naming it."""
    try:
        kind, message = str(value.get("kind", "DispatchFailed")), str(value.get("message", ""))
        if kind in _ATTACHMENT_ERRORS and value.get("attachmentId"):
            return _ATTACHMENT_ERRORS[kind](str(value["attachmentId"]), message)
        if kind in ("ProviderStatusError", "ContextOverflow"):
            cls = ContextOverflow if kind == "ContextOverflow" else ProviderStatusError
            return cls(
                str(value["provider"]),
                int(value["status"]),
                str(value["excerpt"]),
                error_type=_opt_str(value.get("errorType")),
                request_id=_opt_str(value.get("requestId")),
                retry_after=_opt_float(value.get("retryAfter")),
                should_retry=_opt_bool(value.get("shouldRetry")),
                final=bool(value.get("final", False)),
            )
        if kind == "ProviderTransportError":
            return ProviderTransportError(
                message, received_bytes=int(value["receivedBytes"]), error_type=str(value["errorType"])
            )
        if kind == "ProviderStreamError":
            return ProviderStreamError(
                message,
                error_type=str(value["errorType"]),
                received_bytes=int(value["receivedBytes"]),
                retryable=bool(value["retryable"]),
                request_id=_opt_str(value.get("requestId")),
            )
        if kind == "AnswerTooLarge":
            return AnswerTooLarge(message, received_bytes=int(value["receivedBytes"]))
        if kind == "FencedError":
            return FencedError(session_id, int(value["epoch"]), int(value["currentEpoch"]))
        if kind == "FoldTimeout":
            return FoldTimeout(message)
        if kind == "DispatchLost":
            return DispatchLost(session_id, boundary, kind, message)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return DispatchFailed(session_id, boundary, "FormatError", f"malformed error reply {value!r:.200}: {exc}")
    return DispatchFailed(session_id, boundary, kind, message)
