"""Streamed answers: per-API assembly of server-sent events into the answer the API gives unstreamed.

An assembler takes the events of one answer (:mod:`foldline.providers.sse`) and builds, event by event,
the JSON object the same API returns when the request does not stream. The adapter then parses that
object with the very function it parses unstreamed answers with, so a streamed answer and the same answer
unstreamed give equal :class:`~foldline.providers.base.ProviderResponse` s by construction (a property test
over random chunkings of the emulator's streams holds it).

Strict on purpose — the log must hold exactly what the model said, or nothing:

* an event of a type the assembler does not know, a delta of an unknown kind, events out of order (a delta
  for a block that was never started, a second ``message_start``, anything after the final event) or data
  that is not the JSON the API documents raise :class:`~foldline.errors.ProviderStreamError`;
* a stream that ends before its final event (Anthropic ``message_stop``, OpenAI ``[DONE]``) is incomplete
  (:attr:`StreamAssembler.complete` stays false; the adapter raises);
* an ``error`` event raises ProviderStreamError with the provider's error type, marked ``retryable`` only
  for the transient types (overloaded, internal error, rate limit) — see :mod:`foldline.providers.retry`.

:class:`AnswerProgress` is what the caller holds while an answer arrives: bytes received, the provider's
request id, when the first byte and the first token came, and — when the caller cancels — what had arrived
(:meth:`AnswerProgress.partial`: the text so far; an unfinished tool call or reasoning block is left out,
because it can never be completed or sent back).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from ..core.codec import loads
from ..core.content import ContentBlock, TextBlock, Usage
from ..core.deltas import AnswerDelta, ReasoningDelta, TextDelta, ToolArgumentsDelta, ToolCallStarted
from ..errors import ProviderStreamError
from ._answer_parsing import messages_usage
from .sse import ServerSentEvent

__all__ = [
    "AnswerProgress",
    "AnthropicMessagesStream",
    "OpenAIChatStream",
    "OpenAIResponsesStream",
    "PartialAnswer",
    "StreamAssembler",
]

#: Error types (and OpenAI codes) a provider sends for failures that a new attempt may not meet: Anthropic's
#: ``overloaded_error``, ``api_error``, ``rate_limit_error``, ``timeout_error``; OpenAI's ``server_error``,
#: ``rate_limit_exceeded``, ``service_unavailable_error`` / ``server_is_overloaded``.
TRANSIENT_ERROR_TYPES: Final = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "timeout_error",
        "server_error",
        "rate_limit_exceeded",
        "service_unavailable_error",
        "server_is_overloaded",
    }
)


@dataclass(frozen=True, slots=True)
class PartialAnswer:
    """What had arrived of an answer when it was cut: its text, its usage when the stream had reported it."""

    content: tuple[ContentBlock, ...]
    usage: Usage | None
    message_id: str | None


@contextmanager
def _shape(provider: str, what: str) -> Iterator[None]:
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        raise ProviderStreamError(
            f"{provider}: a streamed {what} event is not the documented shape ({type(exc).__name__}: {exc})",
            error_type="malformed-stream",
        ) from None


def _object(data: str, provider: str) -> dict[str, Any]:
    try:
        value = loads(data)
    except ValueError:
        raise ProviderStreamError(
            f"{provider}: a streamed event's data is not JSON: {data[:80]!r}", error_type="malformed-stream"
        ) from None
    if not isinstance(value, dict):
        raise ProviderStreamError(
            f"{provider}: a streamed event's data is not a JSON object", error_type="malformed-stream"
        )
    return value


def _stream_error(provider: str, error: Any) -> ProviderStreamError:
    """The typed error of an ``error`` event: its code when it has one (OpenAI's ``rate_limit_exceeded``, the
    Responses API's ``server_error``), else its type (Anthropic's ``overloaded_error``, OpenAI's
    ``server_error``); retryable when either names a transient failure."""
    kind = "error"
    message = ""
    transient = False
    if isinstance(error, dict):
        names = [n for n in (error.get("code"), error.get("type")) if isinstance(n, str) and n]
        kind = names[0] if names else "error"
        transient = any(n in TRANSIENT_ERROR_TYPES for n in names)
        message = str(error.get("message", ""))[:200]
    return ProviderStreamError(
        f"{provider}: the stream carried an error event ({kind}): {message}", error_type=kind, retryable=transient
    )


class StreamAssembler(abc.ABC):
    """Events of one streamed answer in, the equivalent unstreamed answer object out; each piece of model
    output also goes to :attr:`sink` as a provider-independent delta (:mod:`foldline.core.deltas`) when
    one is set."""

    provider: str
    #: called with each piece of model output as it is taken in (must not block: it runs inside the read)
    sink: Callable[[AnswerDelta], None] | None = None

    def _emit(self, delta: AnswerDelta) -> None:
        if self.sink is not None:
            self.sink(delta)

    @abc.abstractmethod
    def feed(self, event: ServerSentEvent) -> bool:
        """Take one event; True when it carried model output (a token: text, tool input, reasoning)."""

    @property
    @abc.abstractmethod
    def complete(self) -> bool:
        """Whether the final event has arrived."""

    @abc.abstractmethod
    def payload(self) -> dict[str, Any]:
        """The answer as the API returns it unstreamed (only once :attr:`complete`)."""

    @abc.abstractmethod
    def partial(self) -> PartialAnswer:
        """What has arrived so far, for an answer that was cut (text only)."""


# ---------------------------------------------------------------------------- Anthropic Messages

_ANTHROPIC_EVENTS: Final = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)


class AnthropicMessagesStream(StreamAssembler):
    """The Messages API's stream: ``message_start``, per block ``content_block_start`` / ``_delta`` / ``_stop``,
    ``message_delta`` (stop reason, final usage), ``message_stop``; ``ping`` anywhere; ``error`` ends it.

    Deltas: ``text_delta`` (text), ``input_json_delta`` (tool input as JSON text pieces, parsed at the block's
    stop; none means the start's ``input``), ``thinking_delta`` / ``signature_delta`` (reasoning), and
    ``citations_delta`` (appended to the text block's ``citations``)."""

    provider = "anthropic"

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._open: set[int] = set()
        self._json: dict[int, list[str]] = {}
        self._stopped = False

    def feed(self, event: ServerSentEvent) -> bool:
        name = event.event
        if name not in _ANTHROPIC_EVENTS:
            raise ProviderStreamError(
                f"anthropic: the stream carried an event of unknown type {name!r}; foldline logs an answer "
                "only when it understands every event of it",
                error_type="unknown-event",
            )
        data = _object(event.data, self.provider)
        if data.get("type") != name:
            raise ProviderStreamError(
                f"anthropic: a {name!r} event carries data of type {data.get('type')!r}", error_type="malformed-stream"
            )
        if name == "error":
            raise _stream_error(self.provider, data.get("error"))
        if name == "ping":
            return False
        if self._stopped:
            raise ProviderStreamError(f"anthropic: {name} after message_stop", error_type="malformed-stream")
        with _shape(self.provider, name):
            if name == "message_start":
                if self._message is not None:
                    raise ValueError("a second message_start")
                message = dict(data["message"])
                if message["content"] != []:
                    raise ValueError("message_start with content")
                message["content"] = []
                message["usage"] = dict(message["usage"])
                self._message = message
                return False
            message = self._started(name)
            content: list[dict[str, Any]] = message["content"]
            if name == "content_block_start":
                index = data["index"]
                if index != len(content):
                    raise ValueError(f"block {index} started after {len(content)} blocks")
                block = dict(data["content_block"])
                content.append(block)
                self._open.add(index)
                if block.get("type") == "tool_use":
                    self._emit(ToolCallStarted(index, str(block.get("id", "")), str(block.get("name", ""))))
                return False
            if name == "content_block_delta":
                return self._delta(content, data["index"], data["delta"])
            if name == "content_block_stop":
                index = data["index"]
                if index not in self._open:
                    raise ValueError(f"content_block_stop for block {index}, which is not open")
                self._open.discard(index)
                parts = self._json.pop(index, None)
                if parts:
                    content[index]["input"] = loads("".join(parts))
                return False
            if name == "message_delta":
                delta = data["delta"]
                for key in ("stop_reason", "stop_sequence", "stop_details"):
                    if key in delta:
                        message[key] = delta[key]
                for key, value in (data.get("usage") or {}).items():
                    if value is not None:
                        message["usage"][key] = value
                return False
            # message_stop
            if self._open:
                raise ValueError(f"message_stop while block(s) {sorted(self._open)} are open")
            self._stopped = True
            return False

    def _started(self, name: str) -> dict[str, Any]:
        if self._message is None:
            raise ValueError(f"{name} before message_start")
        return self._message

    def _delta(self, content: list[dict[str, Any]], index: int, delta: dict[str, Any]) -> bool:
        if index not in self._open:
            raise ValueError(f"a delta for block {index}, which is not open")
        block = content[index]
        kind = delta["type"]
        if kind == "text_delta":
            block["text"] = block["text"] + delta["text"]
            if delta["text"]:
                self._emit(TextDelta(delta["text"]))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta["partial_json"])
            if delta["partial_json"]:
                self._emit(ToolArgumentsDelta(index, delta["partial_json"]))
        elif kind == "thinking_delta":
            block["thinking"] = block["thinking"] + delta["thinking"]
            if delta["thinking"]:
                self._emit(ReasoningDelta(delta["thinking"]))
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "citations_delta":
            block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        else:
            raise ProviderStreamError(
                f"anthropic: the stream carried a delta of unknown type {kind!r}", error_type="unknown-event"
            )
        return True

    @property
    def complete(self) -> bool:
        return self._stopped

    def payload(self) -> dict[str, Any]:
        if not self._stopped or self._message is None:
            raise ProviderStreamError("anthropic: the stream ended before message_stop", error_type="incomplete-stream")
        return self._message

    def partial(self) -> PartialAnswer:
        message = self._message
        if message is None:
            return PartialAnswer((), None, None)
        texts = tuple(
            TextBlock(str(b.get("text", ""))) for b in message["content"] if b.get("type") == "text" and b.get("text")
        )
        usage = None
        u = message.get("usage")
        if isinstance(u, dict):
            try:
                usage = messages_usage(u)
            except (KeyError, TypeError, ValueError, AttributeError):
                usage = None
        message_id = message.get("id")
        return PartialAnswer(texts, usage, message_id if isinstance(message_id, str) else None)


# ---------------------------------------------------------------------------- OpenAI Chat Completions


class OpenAIChatStream(StreamAssembler):
    """Chat Completions' stream: ``chat.completion.chunk`` objects (no event names), each choice carrying a
    ``delta`` (``content`` and ``refusal`` text pieces, ``tool_calls`` merged by their ``index``, whose
    ``arguments`` pieces concatenate) and finally its ``finish_reason``; with ``stream_options.include_usage``
    a last chunk with no choices carries the usage; ``data: [DONE]`` is the final event. A chunk holding an
    ``error`` (with or without ``event: error``) ends it. OpenAI-compatible reasoning servers (DeepSeek, vLLM,
    SGLang) stream ``reasoning_content`` (vLLM also ``reasoning``) pieces the same way, before the content."""

    def __init__(self, provider: str = "openai") -> None:
        self.provider = provider
        self._head: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._calls: dict[int, dict[int, dict[str, Any]]] = {}
        self._usage: Any = None
        self._done = False

    def feed(self, event: ServerSentEvent) -> bool:
        if self._done:
            raise ProviderStreamError("openai: an event after [DONE]", error_type="malformed-stream")
        if event.data == "[DONE]" and event.event is None:
            self._done = True
            return False
        if event.event not in (None, "error"):
            raise ProviderStreamError(
                f"openai: the stream carried an event of unknown type {event.event!r}", error_type="unknown-event"
            )
        data = _object(event.data, self.provider)
        if event.event == "error" or "error" in data:
            raise _stream_error(self.provider, data.get("error"))
        if data.get("object") != "chat.completion.chunk":
            raise ProviderStreamError(
                f"openai: the stream carried an object of unknown type {data.get('object')!r}",
                error_type="unknown-event",
            )
        token = False
        with _shape(self.provider, "chat.completion.chunk"):
            if self._head is None:
                self._head = {k: data[k] for k in ("id", "created", "model") if k in data}
                for key in ("system_fingerprint", "service_tier"):
                    if data.get(key) is not None:
                        self._head[key] = data[key]
            for choice in data["choices"]:
                index = choice["index"]
                snap = self._choices.setdefault(
                    index, {"index": index, "message": {"role": "assistant"}, "finish_reason": None, "logprobs": None}
                )
                token = self._delta(snap, index, choice.get("delta") or {}) or token
                if choice.get("finish_reason") is not None:
                    snap["finish_reason"] = choice["finish_reason"]
            if data.get("usage") is not None:
                self._usage = data["usage"]
        return token

    def _delta(self, snap: dict[str, Any], index: int, delta: dict[str, Any]) -> bool:
        message = snap["message"]
        token = False
        if delta.get("role") is not None:
            message["role"] = delta["role"]
        for key in ("reasoning_content", "reasoning", "content", "refusal"):
            piece = delta.get(key)
            if piece is not None:
                message[key] = (message.get(key) or "") + str(piece)
                token = token or bool(piece)
                if piece and index == 0:
                    self._emit(ReasoningDelta(str(piece)) if key.startswith("reasoning") else TextDelta(str(piece)))
        for call in delta.get("tool_calls") or ():
            calls = self._calls.setdefault(index, {})
            at = call["index"]
            fn = call.get("function") or {}
            entry = calls.get(at)
            began = entry is None
            if entry is None:
                entry = calls[at] = {"function": {"arguments": "", "name": ""}, "id": "", "type": "function"}
            if call.get("id"):
                entry["id"] += call["id"]
            if call.get("type"):
                entry["type"] = call["type"]
            if fn.get("name"):
                entry["function"]["name"] += fn["name"]
            if began and index == 0:
                self._emit(ToolCallStarted(at, entry["id"], entry["function"]["name"]))
            if fn.get("arguments"):
                entry["function"]["arguments"] += fn["arguments"]
                if index == 0:
                    self._emit(ToolArgumentsDelta(at, fn["arguments"]))
            token = True
        return token

    @property
    def complete(self) -> bool:
        return self._done

    def payload(self) -> dict[str, Any]:
        if not self._done or self._head is None:
            raise ProviderStreamError("openai: the stream ended before [DONE]", error_type="incomplete-stream")
        choices = []
        for index in sorted(self._choices):
            snap = self._choices[index]
            message = dict(snap["message"])
            message["content"] = message.get("content") or None  # unstreamed: null, not "", when there is none
            message["refusal"] = message.get("refusal") or None
            for key in ("reasoning_content", "reasoning"):
                if key in message and not message[key]:
                    del message[key]
            calls = self._calls.get(index)
            if calls:
                message["tool_calls"] = [calls[k] for k in sorted(calls)]
            choices.append({**snap, "message": message})
        return {**self._head, "choices": choices, "object": "chat.completion", "usage": self._usage}

    def partial(self) -> PartialAnswer:
        snap = self._choices.get(0)
        text = snap["message"].get("content") if snap else None
        message_id = self._head.get("id") if self._head else None
        return PartialAnswer(
            (TextBlock(str(text)),) if text else (), None, message_id if isinstance(message_id, str) else None
        )


# ---------------------------------------------------------------------------- OpenAI Responses

_RESPONSES_EVENTS: Final = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    }
)
_FINAL: Final = frozenset({"response.completed", "response.incomplete"})


class OpenAIResponsesStream(StreamAssembler):
    """The Responses API's stream: ``response.created``, per output item ``response.output_item.added`` /
    ``.done`` with its parts' and arguments' deltas between them, and the final ``response.completed`` (or
    ``.incomplete``) carrying the whole response. The items are built from the events; the final event's
    response must list the same items (type and id, in order; else the stream is malformed) and is the answer
    (the items the stream built, when it lists none).
    ``response.failed`` and ``error`` end it with the provider's error code."""

    provider = "openai"

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._done: set[int] = set()
        self._final: dict[str, Any] | None = None
        self._started = False

    def feed(self, event: ServerSentEvent) -> bool:
        name = event.event
        data = _object(event.data, self.provider)
        kind = data.get("type")
        if name is not None and name != kind:
            raise ProviderStreamError(
                f"openai: a {name!r} event carries data of type {kind!r}", error_type="malformed-stream"
            )
        if kind not in _RESPONSES_EVENTS:
            raise ProviderStreamError(
                f"openai: the stream carried an event of unknown type {kind!r}; foldline logs an answer only when "
                "it understands every event of it",
                error_type="unknown-event",
            )
        if kind == "error":  # the event's own ``type`` is "error": its code names the failure
            raise _stream_error(self.provider, {"code": data.get("code"), "message": data.get("message")})
        if kind == "response.failed":
            raise _stream_error(self.provider, (data.get("response") or {}).get("error"))
        if self._final is not None:
            raise ProviderStreamError(f"openai: {kind} after the final event", error_type="malformed-stream")
        with _shape(self.provider, str(kind)):
            if kind in ("response.created", "response.in_progress", "response.queued"):
                self._started = True
                return False
            if not self._started:
                raise ValueError(f"{kind} before response.created")
            if kind in _FINAL:
                final = dict(data["response"])
                built = [self._items[i] for i in sorted(self._items)]
                output = final.get("output")
                if output is None:
                    final["output"] = built
                elif [(o.get("type"), o.get("id")) for o in output] != [(b.get("type"), b.get("id")) for b in built]:
                    raise ValueError("the final response's output is not the items the stream built")
                self._final = final
                return False
            index = data["output_index"]
            if kind == "response.output_item.added":
                if index in self._items:
                    raise ValueError(f"output item {index} added twice")
                item = self._items[index] = dict(data["item"])
                if item.get("type") == "function_call":
                    self._emit(ToolCallStarted(index, str(item.get("call_id", "")), str(item.get("name", ""))))
                return False
            item = self._items[index]
            if index in self._done:
                raise ValueError(f"{kind} for output item {index}, which is done")
            if kind == "response.output_item.done":
                self._items[index] = dict(data["item"])
                self._done.add(index)
                return False
            return self._delta(str(kind), item, data, index)

    def _delta(self, kind: str, item: dict[str, Any], data: dict[str, Any], index: int) -> bool:
        if kind == "response.content_part.added":
            item.setdefault("content", []).append(dict(data["part"]))
        elif kind == "response.output_text.delta":
            part = item["content"][data["content_index"]]
            part["text"] = part.get("text", "") + data["delta"]
            self._emit(TextDelta(data["delta"]))
            return True
        elif kind == "response.refusal.delta":
            part = item["content"][data["content_index"]]
            part["refusal"] = part.get("refusal", "") + data["delta"]
            self._emit(TextDelta(data["delta"]))
            return True
        elif kind == "response.function_call_arguments.delta":
            item["arguments"] = item.get("arguments", "") + data["delta"]
            self._emit(ToolArgumentsDelta(index, data["delta"]))
            return True
        elif kind == "response.reasoning_summary_part.added":
            item.setdefault("summary", []).append(dict(data["part"]))
        elif kind == "response.reasoning_summary_text.delta":
            part = item["summary"][data["summary_index"]]
            part["text"] = part.get("text", "") + data["delta"]
            self._emit(ReasoningDelta(data["delta"]))
            return True
        elif kind == "response.reasoning_text.delta":
            self._emit(ReasoningDelta(str(data["delta"])))
            return True
        return False  # the rest repeat what the deltas built

    @property
    def complete(self) -> bool:
        return self._final is not None

    def payload(self) -> dict[str, Any]:
        if self._final is None:
            raise ProviderStreamError(
                "openai: the stream ended before response.completed", error_type="incomplete-stream"
            )
        return self._final

    def partial(self) -> PartialAnswer:
        texts: list[ContentBlock] = []
        for index in sorted(self._items):
            item = self._items[index]
            if item.get("type") == "message":
                for part in item.get("content") or ():
                    text = part.get("text") if part.get("type") == "output_text" else None
                    if text:
                        texts.append(TextBlock(str(text)))
        return PartialAnswer(tuple(texts), None, None)


# ---------------------------------------------------------------------------- progress


class AnswerProgress:
    """What has arrived of the current attempt's answer. The caller creates one per request and reads it
    when it cancels; the retry layer starts it afresh for each attempt.

    ``on_events``: called with the events of each network read of a streamed answer (per-chunk logging).
    ``on_delta``: called with each piece of model output as it arrives (:mod:`foldline.core.deltas`),
    inside the read — it must not block; :attr:`deltas` counts those of the current attempt.
    """

    __slots__ = (
        "_assembler",
        "attempt",
        "deltas",
        "first_byte_at",
        "first_token_at",
        "on_delta",
        "on_events",
        "received_bytes",
        "request_id",
        "started_at",
    )

    def __init__(
        self,
        on_events: Callable[[int, Sequence[ServerSentEvent]], Awaitable[None] | None] | None = None,
        *,
        attempt: int = 1,
        on_delta: Callable[[AnswerDelta], None] | None = None,
    ) -> None:
        self.on_events = on_events
        self.on_delta = on_delta
        self.deltas = 0
        self.attempt = attempt
        self.received_bytes = 0
        self.request_id: str | None = None
        self.started_at = time.monotonic()
        self.first_byte_at: float | None = None
        self.first_token_at: float | None = None
        self._assembler: StreamAssembler | None = None

    def begin(self, attempt: int) -> None:
        """A new attempt: nothing of its answer has arrived."""
        self.attempt = attempt
        self.deltas = 0
        self.received_bytes = 0
        self.request_id = None
        self.started_at = time.monotonic()
        self.first_byte_at = None
        self.first_token_at = None
        self._assembler = None

    def stream(self, assembler: StreamAssembler) -> None:
        self._assembler = assembler
        if self.on_delta is not None:
            assembler.sink = self.delta

    def delta(self, delta: AnswerDelta) -> None:
        """A piece of the current attempt's answer (from its assembler, or relayed by a dispatcher)."""
        self.deltas += 1
        if self.on_delta is not None:
            self.on_delta(delta)

    def received(self, size: int) -> None:
        if self.first_byte_at is None:
            self.first_byte_at = time.monotonic()
        self.received_bytes += size

    def token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()

    def partial(self) -> PartialAnswer | None:
        """The streamed text so far (None when no stream had begun)."""
        return self._assembler.partial() if self._assembler is not None else None
