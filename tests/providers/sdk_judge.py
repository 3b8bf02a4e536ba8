"""The official SDKs as the judge of the emulator: record what it sends, validate every answer, event and error.

:class:`Recorder` is an ``httpx2`` transport (the HTTP client the ``anthropic`` and ``openai`` SDKs are built on)
that keeps the raw bytes of every exchange while the SDK reads them, so a test drives the SDK's high-level
helpers and then judges exactly what came over the wire:

* every answer, stream event and error body is validated with the SDK's own type (``model_validate`` through a
  ``TypeAdapter``, in pydantic's strict mode: no coercion) and then walked: the SDK models accept unknown
  fields, so any field the type does not declare fails the judgement here — the SDK is strict through this;
* where the SDKs' repositories hold answers recorded from the live APIs, the field sets of those recordings are
  written down below (:data:`LIVE`) and the emulator's objects must carry every field they carry (and only
  fields the SDK type declares): "required" as the live API shows it, not only as the type says.

The counts of what was judged are kept per API in :data:`JUDGED`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx2
import pydantic
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.shared import ErrorObject

from foldline.providers.sse import ServerSentEvent, SSEDecoder

__all__ = ["JUDGED", "LIVE", "Exchange", "Recorder", "judge", "judge_exchange", "strict"]

#: what was judged: (api, "answers" | "events" | "errors") → count
JUDGED: Counter[tuple[str, str]] = Counter()


@dataclass(slots=True)
class Exchange:
    """One request and what the emulator answered, byte for byte (``body`` grows while the SDK reads it)."""

    path: str
    request: bytes
    status: int
    content_type: str
    body: bytearray = field(default_factory=bytearray)

    def json(self) -> Any:
        return json.loads(bytes(self.body))

    def events(self) -> list[ServerSentEvent]:
        decoder = SSEDecoder()
        return [*decoder.feed(bytes(self.body)), *decoder.close()]


class _Tee(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, record: Exchange) -> None:
        self._inner = inner
        self._record = record

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._record.body.extend(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class Recorder(httpx2.HTTPTransport):
    """An ``httpx2`` transport that records every exchange (give it to the SDK as ``http_client``)."""

    def __init__(self) -> None:
        super().__init__(trust_env=False)
        self.exchanges: list[Exchange] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        record = Exchange(
            request.url.path, request.read(), response.status_code, response.headers.get("content-type", "")
        )
        self.exchanges.append(record)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, record),
            extensions=response.extensions,
        )

    def take(self) -> list[Exchange]:
        """The exchanges since the last call."""
        taken, self.exchanges = self.exchanges, []
        return taken


# ---------------------------------------------------------------------------- strict validation


class Misjudged(AssertionError):
    pass


def _extras(value: Any, where: str, allowed: Mapping[str, frozenset[str]]) -> Iterator[str]:
    """Every field an SDK model received that its type does not declare (``allowed``: model class name → extra
    field names a provider documents beyond the OpenAI type, e.g. DeepSeek's ``reasoning_content``)."""
    if isinstance(value, pydantic.BaseModel):
        extra = set(value.__pydantic_extra__ or {}) - allowed.get(type(value).__name__, frozenset())
        for name in sorted(extra):
            yield f"{where}.{name} ({type(value).__name__} declares no such field)"
        for name in type(value).model_fields:
            yield from _extras(getattr(value, name), f"{where}.{name}", allowed)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _extras(item, f"{where}[{i}]", allowed)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _extras(item, f"{where}.{key}", allowed)


_ADAPTERS: dict[Any, pydantic.TypeAdapter[Any]] = {}


def strict(kind: Any, data: Any, *, allowed: Mapping[str, frozenset[str]] | None = None) -> Any:
    """``data`` validated as the SDK type ``kind`` (strict mode, every field declared); the validated value."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = pydantic.TypeAdapter(kind)
    try:
        value = adapter.validate_python(data, strict=True)
    except pydantic.ValidationError as exc:
        raise Misjudged(f"not a valid {getattr(kind, '__name__', kind)}: {exc}\n{json.dumps(data)[:2000]}") from None
    extras = list(_extras(value, "$", allowed or {}))
    if extras:
        raise Misjudged(f"fields the SDK type does not declare: {extras}\n{json.dumps(data)[:2000]}")
    return value


# ---------------------------------------------------------------------------- the live recordings' field sets

#: Field sets of answers recorded from the live APIs, written down from the SDK repositories' test recordings:
#: anthropic-sdk-python ``tests/lib/_parse/__inline_snapshot__`` and ``tests/lib/tools/__inline_snapshot__``
#: (Messages, 2025-2026), openai-python ``tests/lib/responses/test_responses.py`` (Responses, 2025) and
#: ``.inline-snapshot/external`` (Chat Completions chunks, 2024), and a recorded DeepSeek answer (2025, tidyllm's
#: test fixtures). Each names an object and the fields the live answer carries.
LIVE: Final[dict[str, frozenset[str]]] = {
    "anthropic.message": frozenset({"content", "id", "model", "role", "stop_reason", "stop_sequence", "type", "usage"}),
    "anthropic.usage": frozenset(
        {
            "cache_creation",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "inference_geo",
            "input_tokens",
            "output_tokens",
            "service_tier",
        }
    ),
    "anthropic.cache_creation": frozenset({"ephemeral_1h_input_tokens", "ephemeral_5m_input_tokens"}),
    "anthropic.text": frozenset({"text", "type"}),
    "anthropic.tool_use": frozenset({"caller", "id", "input", "name", "type"}),
    "anthropic.message_delta": frozenset({"delta", "type", "usage"}),
    "anthropic.message_delta.usage": frozenset(
        {"cache_creation_input_tokens", "cache_read_input_tokens", "input_tokens", "output_tokens"}
    ),
    "anthropic.error": frozenset({"error", "request_id", "type"}),
    "openai.chat.completion": frozenset({"choices", "created", "id", "model", "object", "system_fingerprint", "usage"}),
    "openai.chat.message": frozenset({"content", "refusal", "role"}),
    "openai.chat.usage": frozenset({"completion_tokens", "completion_tokens_details", "prompt_tokens", "total_tokens"}),
    "openai.chat.chunk": frozenset({"choices", "created", "id", "model", "object", "system_fingerprint"}),
    "openai.chat.error": frozenset({"code", "message", "param", "type"}),
    "openai.response": frozenset(
        {
            "background",
            "created_at",
            "error",
            "id",
            "incomplete_details",
            "instructions",
            "max_output_tokens",
            "max_tool_calls",
            "metadata",
            "model",
            "object",
            "output",
            "parallel_tool_calls",
            "previous_response_id",
            "prompt_cache_key",
            "reasoning",
            "safety_identifier",
            "service_tier",
            "status",
            "store",
            "temperature",
            "text",
            "tool_choice",
            "tools",
            "top_logprobs",
            "top_p",
            "truncation",
            "usage",
            "user",
        }
    ),
    "openai.response.usage": frozenset(
        {"input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"}
    ),
    "openai.response.input_tokens_details": frozenset({"cache_write_tokens", "cached_tokens"}),
    "openai.response.message": frozenset({"content", "id", "role", "status", "type"}),
    "openai.response.output_text": frozenset({"annotations", "logprobs", "text", "type"}),
    "deepseek.completion": frozenset({"choices", "created", "id", "model", "object", "system_fingerprint", "usage"}),
    "deepseek.message": frozenset({"content", "role"}),
    "deepseek.usage": frozenset(
        {
            "completion_tokens",
            "prompt_cache_hit_tokens",
            "prompt_cache_miss_tokens",
            "prompt_tokens",
            "prompt_tokens_details",
            "total_tokens",
        }
    ),
}

#: Fields the emulator sends beyond a live recording, each one the live API sends today per the provider's
#: current API reference (the recordings predate them) or only in the situation named.
BEYOND_LIVE: Final[dict[str, frozenset[str]]] = {
    "openai.chat.completion": frozenset({"service_tier"}),  # the API reference's example answer
    "openai.chat.message": frozenset({"annotations", "tool_calls"}),  # ditto; tool_calls when the model calls
    "openai.chat.usage": frozenset({"prompt_tokens_details"}),  # ditto (cached and written tokens)
    "openai.chat.chunk": frozenset({"service_tier", "usage"}),  # usage: null per chunk with include_usage
    "openai.response": frozenset({"prompt_cache_retention"}),  # echoed when the request sets it
    "deepseek.message": frozenset({"reasoning_content", "tool_calls"}),  # while thinking; when the model calls
    "deepseek.usage": frozenset({"completion_tokens_details"}),  # reasoning tokens, while thinking
}


def shaped(name: str, data: Mapping[str, Any]) -> None:
    """``data`` carries every field the live recording ``name`` carries, and nothing beyond it unaccounted for."""
    have = set(data)
    missing = LIVE[name] - have
    beyond = have - LIVE[name] - BEYOND_LIVE.get(name, frozenset())
    if missing or beyond:
        raise Misjudged(f"{name}: missing live fields {sorted(missing)}, unexplained fields {sorted(beyond)}: {data}")


# ---------------------------------------------------------------------------- judging one exchange

_DEEPSEEK_EXTRAS: Final = {
    # DeepSeek's documented extensions of the Chat Completions shape (api-docs.deepseek.com)
    "ChatCompletionMessage": frozenset({"reasoning_content"}),
    "ChoiceDelta": frozenset({"reasoning_content"}),
    "CompletionUsage": frozenset({"prompt_cache_hit_tokens", "prompt_cache_miss_tokens"}),
}


def _anthropic_message(message: Mapping[str, Any], *, started: bool = False) -> None:
    shaped("anthropic.message", message)
    shaped("anthropic.usage", message["usage"])
    shaped("anthropic.cache_creation", message["usage"]["cache_creation"])
    for block in message["content"]:
        if block["type"] in ("text", "tool_use"):
            shaped(f"anthropic.{block['type']}", block)


def _judge_anthropic(exchange: Exchange) -> None:
    if exchange.status != 200:
        strict(ErrorResponse, exchange.json())
        shaped("anthropic.error", exchange.json())
        JUDGED["anthropic", "errors"] += 1
        return
    if not exchange.content_type.startswith("text/event-stream"):
        data = exchange.json()
        strict(Message, data)
        _anthropic_message(data)
        JUDGED["anthropic", "answers"] += 1
        return
    names = []
    for event in exchange.events():
        data = json.loads(event.data)
        if data.get("type") != event.event:
            raise Misjudged(f"event {event.event!r} carries data of type {data.get('type')!r}")
        names.append(event.event)
        if event.event == "ping":
            if data != {"type": "ping"}:
                raise Misjudged(f"a ping is {{'type': 'ping'}}, got {data}")
        elif event.event == "error":
            strict(ErrorResponse, data)
        else:
            strict(RawMessageStreamEvent, data)
            if event.event == "message_start":
                _anthropic_message(data["message"], started=True)
            elif event.event == "message_delta":
                shaped("anthropic.message_delta", data)
                shaped("anthropic.message_delta.usage", data["usage"])
            elif event.event == "content_block_start" and data["content_block"]["type"] in ("text", "tool_use"):
                shaped(f"anthropic.{data['content_block']['type']}", data["content_block"])
        JUDGED["anthropic", "events"] += 1
    # the live order: message_start, the first block's start, then a ping
    if names[:1] != ["message_start"] or (len(names) > 2 and "ping" in names and names.index("ping") != 2):
        raise Misjudged(f"events out of the live order: {names[:4]}")


def _chat_completion(api: str, data: Mapping[str, Any]) -> None:
    if api == "deepseek":
        shaped("deepseek.completion", data)
        shaped("deepseek.message", data["choices"][0]["message"])
        shaped("deepseek.usage", data["usage"])
    else:
        shaped("openai.chat.completion", data)
        shaped("openai.chat.message", dict(data["choices"][0]["message"].items()))
        shaped("openai.chat.usage", data["usage"])


def _judge_chat(api: str, exchange: Exchange) -> None:
    allowed = _DEEPSEEK_EXTRAS if api == "deepseek" else {}
    if exchange.status != 200:
        body = exchange.json()
        if set(body) != {"error"}:
            raise Misjudged(f"an OpenAI-style error body is {{'error': {{…}}}}, got {body}")
        strict(ErrorObject, body["error"])
        shaped("openai.chat.error", body["error"])
        JUDGED[api, "errors"] += 1
        return
    if not exchange.content_type.startswith("text/event-stream"):
        data = exchange.json()
        strict(ChatCompletion, data, allowed=allowed)
        _chat_completion(api, data)
        JUDGED[api, "answers"] += 1
        return
    events = exchange.events()
    for event in events:
        if event.event is not None:
            raise Misjudged(f"Chat Completions streams name no events, got {event.event!r}")
        if event.data == "[DONE]":
            JUDGED[api, "events"] += 1
            continue
        data = json.loads(event.data)
        if "error" in data:
            if set(data) != {"error"}:
                raise Misjudged(f"a stream's error chunk is {{'error': {{…}}}}, got {data}")
            strict(ErrorObject, data["error"])
        else:
            strict(ChatCompletionChunk, data, allowed=allowed)
            if api == "openai":
                shaped("openai.chat.chunk", data)
        JUDGED[api, "events"] += 1


#: The live Responses answers carry ``store`` (test_responses.py's recording); the openai 3.x ``Response`` type no
#: longer declares it (its models keep it as an extra field).
_RESPONSE_EXTRAS: Final = {"Response": frozenset({"store"})}


def _response(data: Mapping[str, Any]) -> None:
    shaped("openai.response", data)
    if data.get("usage") is not None:
        shaped("openai.response.usage", data["usage"])
        shaped("openai.response.input_tokens_details", data["usage"]["input_tokens_details"])
    for item in data["output"]:
        if item["type"] == "message":
            shaped("openai.response.message", item)
            for part in item["content"]:
                if part["type"] == "output_text":
                    shaped("openai.response.output_text", part)


def _judge_responses(exchange: Exchange) -> None:
    if exchange.status != 200:
        body = exchange.json()
        if set(body) != {"error"}:
            raise Misjudged(f"an OpenAI-style error body is {{'error': {{…}}}}, got {body}")
        strict(ErrorObject, body["error"])
        shaped("openai.chat.error", body["error"])
        JUDGED["openai-responses", "errors"] += 1
        return
    if not exchange.content_type.startswith("text/event-stream"):
        data = exchange.json()
        strict(Response, data, allowed=_RESPONSE_EXTRAS)
        _response(data)
        JUDGED["openai-responses", "answers"] += 1
        return
    for number, event in enumerate(exchange.events()):
        data = json.loads(event.data)
        if event.event != data.get("type"):
            raise Misjudged(f"event {event.event!r} carries data of type {data.get('type')!r}")
        if data.get("sequence_number") != number:
            raise Misjudged(f"event {number} has sequence_number {data.get('sequence_number')}")
        strict(ResponseStreamEvent, data, allowed=_RESPONSE_EXTRAS)
        if event.event in ("response.created", "response.in_progress", "response.completed"):
            _response(data["response"])
        JUDGED["openai-responses", "events"] += 1


def judge_exchange(exchange: Exchange) -> None:
    """Judge one recorded exchange by the API its path names."""
    if exchange.path == "/v1/messages":
        _judge_anthropic(exchange)
    elif exchange.path == "/v1/chat/completions":
        _judge_chat("openai", exchange)
    elif exchange.path == "/chat/completions":
        _judge_chat("deepseek", exchange)
    elif exchange.path == "/v1/responses":
        _judge_responses(exchange)
    else:
        raise Misjudged(f"no API at {exchange.path}")


def judge(recorder: Recorder) -> list[Exchange]:
    """Judge every exchange recorded since the last call; the exchanges."""
    exchanges = recorder.take()
    assert exchanges, "the SDK sent nothing"
    for exchange in exchanges:
        judge_exchange(exchange)
    return exchanges
