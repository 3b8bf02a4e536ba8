"""Shared builders for the provider tests: requests, image blocks, strict SDK validation."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator
from typing import Any

import pydantic
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming, MessageCreateParamsStreaming
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)

from foldline.core import (
    CallConfig,
    GenerateOptions,
    ImageBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSpec,
    Usage,
    build_request,
)
from foldline.core.header import make_header
from foldline.core.projection import Message
from foldline.ports.attachments import AttachmentStore
from foldline.providers.base import Provider

# A real 3x2 grey PNG, fixed bytes (not regenerated through zlib, so golden fixtures stay put).
PNG_3X2 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAAAAAC4HznGAAAAEElEQVR4nGNg5+Bk4ODkAgAAygA0amI95AAAAABJRU5ErkJggg=="
)

TOOLS = (
    ToolSpec(
        "read_file",
        "Read a file from the workspace.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    ),
    ToolSpec("list_dir", "List a directory.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec("now", ""),
)


def image_block(store: AttachmentStore, data: bytes = PNG_3X2) -> ImageBlock:
    return ImageBlock(store.put(data, "image/png").image_ref())


def request(
    messages: tuple[Message, ...] | list[Message],
    *,
    system: str | None = "You are a careful agent.",
    tools: tuple[ToolSpec, ...] | None = TOOLS,
    provider: str = "anthropic",
    **config: Any,
) -> GenerateOptions:
    header = make_header(CallConfig(provider, config.pop("model", "model-x"), **config), system, tools)
    return build_request(tuple(messages), header)


def user(text: str) -> Message:
    return Message("user", (TextBlock(text),))


# ---------------------------------------------------------------------------- strict SDK validation


@functools.cache
def anthropic_request_type(stream: bool = False) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(MessageCreateParamsStreaming if stream else MessageCreateParamsNonStreaming)


@functools.cache
def openai_request_type(stream: bool = False) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(CompletionCreateParamsStreaming if stream else CompletionCreateParamsNonStreaming)


@functools.cache
def responses_request_type(stream: bool = False) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(ResponseCreateParamsStreaming if stream else ResponseCreateParamsNonStreaming)


#: DeepSeek's Chat Completions extensions (api-docs.deepseek.com/guides/thinking_mode): ``thinking`` at the top
#: level (the OpenAI SDK sends it via ``extra_body``) and ``reasoning_content`` on assistant messages.
REASONING_CHAT_EXTRA_BODY: dict[str, type] = {"thinking": dict}


def reasoning_chat_validate(body: bytes) -> None:
    """A ``reasoning-chat`` body is a Chat Completions body plus DeepSeek's two documented extensions."""
    data = json.loads(body)
    for message in data.get("messages", []):
        if "reasoning_content" in message and (
            message.get("role") != "assistant" or not isinstance(message.pop("reasoning_content"), str)
        ):
            raise NotAValidRequest("reasoning_content must be a string on an assistant message")
    thinking = data.get("thinking")
    if thinking is not None and thinking not in ({"type": "enabled"}, {"type": "disabled"}):
        raise NotAValidRequest(f"thinking must be {{type: enabled|disabled}}, got {thinking!r}")
    stream = data.get("stream") is True
    strict_validate(openai_request_type(stream), json.dumps(data).encode(), REASONING_CHAT_EXTRA_BODY)


def _materialize(value: Any) -> Any:
    """Consume pydantic's lazy ``Iterable[...]`` validators so every nested item is actually validated."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_materialize(v) for v in value]
    if isinstance(value, Iterator):
        return [_materialize(v) for v in value]
    return value


class NotAValidRequest(AssertionError):
    pass


#: Body fields the SDK types no longer declare but the API still takes (the SDK sends them via ``extra_body``):
#: anthropic>=1 removed ``temperature`` from ``MessageCreateParams`` (deprecated; accepted by models that
#: support sampling options). These are checked for type here instead.
ANTHROPIC_EXTRA_BODY: dict[str, type] = {"temperature": float}


def strict_validate(adapter: pydantic.TypeAdapter[Any], body: bytes, extra_body: dict[str, type] | None = None) -> None:
    """Validate a wire body against an SDK request TypedDict, strictly.

    pydantic validates ``Iterable[X]`` fields lazily (a ``ValidatorIterator`` that checks items only when
    iterated) and TypedDicts ignore unknown keys. So: validate, consume every lazy iterator (raising on
    the first bad item), and require the result to equal the input — a dropped unknown key or a coerced
    value shows up as a difference.
    """
    data = json.loads(body)
    for key, kind in (extra_body or {}).items():
        if key in data:
            value = data.pop(key)
            if not isinstance(value, kind):
                raise NotAValidRequest(f"extra body field {key} must be {kind.__name__}, got {value!r}")
    try:
        validated = _materialize(adapter.validate_python(data))
    except pydantic.ValidationError as exc:
        raise NotAValidRequest(str(exc)) from exc
    if validated != data:
        raise NotAValidRequest(f"the SDK type does not describe the body exactly:\n{validated!r}\n!=\n{data!r}")


# ---------------------------------------------------------------------------- a tiny agent loop


LONG_SYSTEM = "You are a careful agent working in a code repository. Explain what you do. " * 60  # > 1024 tokens


async def drive(
    provider: Provider,
    steps: int,
    *,
    system: str | None = LONG_SYSTEM,
    model: str = "model-x",
    messages: list[Message] | None = None,
    store: AttachmentStore | None = None,
    result_text: str = "result",
) -> tuple[list[Usage], list[Message]]:
    """Run ``steps`` requests like the loop does; every tool call gets a text result. Usage per request."""
    history = messages if messages is not None else [user("Please inspect the repository.")]
    usages = []
    for step in range(steps):
        req = request(tuple(history), system=system, model=model, provider=provider.name, max_tokens=400)
        answer = await provider.send(provider.serializer.serialize(req, store))
        usages.append(answer.usage)
        history.append(Message("assistant", answer.content))
        calls = [b for b in answer.content if isinstance(b, ToolCallBlock)]
        history.extend(
            Message("tool", (ToolResultBlock(c.id, (TextBlock(f"{result_text} {c.arguments}"),)),)) for c in calls
        )
        if not calls:
            history.append(user(f"Follow-up question {step}."))
    return usages, history


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
