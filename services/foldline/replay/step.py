"""One step of a session, as every path that builds or checks it sees it.

The loop, the dispatcher, the invariant companion and ``foldline verify`` all build a step's request
with :func:`request_at` and write its records with the builders below, so no two of them can disagree
on what the request at a boundary is or on what the log holds around it:

* :func:`request_at` — the request of the log prefix ``[0, boundary)``: the folded header plus the derived
  messages, frozen. A boundary with no ``request/header`` before it raises
  :class:`~foldline.errors.MissingHeader`, whichever path asks.
* :func:`dispatch_record` — ``request/dispatch``: the serializer and the digest of the exact wire body,
  written before the body is sent.
* :func:`answer_records` — the ``assistant/message`` of a provider answer (with the provider's request and
  message ids) and one ``tool/call`` per tool-call block, written together. An answer that was cut
  (:data:`CUT_STOP_REASONS`: ``max_tokens``, a full context window, a refusal) keeps its text but not its
  tool calls: a call cut short may be incomplete, and no tool ever runs from one.
* :func:`retry_record` — ``llm/retry``: one failed attempt of the step's request, written before the wait.
* :func:`quarantine_record` — ``attachment/quarantine`` in place of the dispatch when an attachment the
  request references cannot be used (nothing is sent).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.content import ToolCallBlock
from ..core.events import AssistantMessage, AttachmentQuarantine, EventData, LlmRetry, RequestDispatch, ToolCall
from ..core.header import EpochHeader
from ..core.projection import Message, Session
from ..core.request import GenerateOptions, build_request
from ..errors import AttachmentError, MissingHeader
from ..providers.base import ProviderResponse, Serializer
from ..providers.retry import FailedAttempt

__all__ = [
    "CUT_STOP_REASONS",
    "QUARANTINE_RECOVERY",
    "answer_records",
    "dispatch_record",
    "quarantine_record",
    "request_at",
    "retry_record",
    "session_request",
]

#: Stop reasons of an answer that ended before the model finished it; its tool calls are not kept or run.
CUT_STOP_REASONS: frozenset[str] = frozenset({"max_tokens", "model_context_window_exceeded", "refusal"})

#: The recovery an ``attachment/quarantine`` proposes: the log stays as it is; the object comes back.
QUARANTINE_RECOVERY = (
    "restore the object from a replica or re-upload the original bytes under the same digest, "
    "then resume the session; the log is unchanged"
)


def request_at(
    session_id: str, boundary: int, header: EpochHeader | None, messages: Sequence[Message]
) -> GenerateOptions:
    """The request at ``boundary``: ``header`` (the folded header of ``[0, boundary)``) and its messages."""
    if header is None:
        raise MissingHeader(session_id, boundary)
    return build_request(messages, header)


def session_request(session: Session) -> GenerateOptions:
    """The request at the session's current end (its next seq is the boundary)."""
    return request_at(session.id, session.next_seq, session.header(), session.derive_messages())


def dispatch_record(turn: int, step: int, serializer: Serializer, body: bytes, digest: str) -> RequestDispatch:
    """``request/dispatch`` for the exact ``body`` a serializer produced (``digest`` is its sha256)."""
    return RequestDispatch(turn, step, serializer.name, serializer.version, digest, len(body))


def answer_records(turn: int, step: int, seq: int, response: ProviderResponse) -> list[EventData]:
    """The ``assistant/message`` (appended at ``seq``) and its ``tool/call`` events, in that order."""
    content = response.content
    if response.stop_reason in CUT_STOP_REASONS:
        content = tuple(b for b in content if not isinstance(b, ToolCallBlock))
    message = AssistantMessage(
        f"a{seq}",
        content,
        response.usage,
        response.stop_reason,
        "append",
        None,
        response.request_id,
        response.message_id,
    )
    records: list[EventData] = [message]
    records += [ToolCall(turn, step, b.id, b.name, b.arguments) for b in content if isinstance(b, ToolCallBlock)]
    return records


def retry_record(turn: int, step: int, failed: FailedAttempt) -> LlmRetry:
    """``llm/retry`` for one failed attempt of the step's request (append it ignorable, before the wait)."""
    return LlmRetry(
        turn,
        step,
        failed.attempt,
        failed.error_type,
        failed.status,
        failed.wait_ms,
        failed.request_id,
        failed.received_bytes,
    )


def quarantine_record(exc: AttachmentError) -> AttachmentQuarantine:
    """``attachment/quarantine`` naming the object, the typed failure and the proposed recovery."""
    return AttachmentQuarantine(exc.attachment_id, f"{type(exc).__name__}: {exc}", QUARANTINE_RECOVERY)
