"""A deterministic local model provider that speaks the Anthropic Messages and OpenAI Chat wire formats.

The emulator receives real wire bodies (whatever an adapter serialized), parses and checks them like the
real APIs would (unknown fields, tool-result pairing, breakpoint count), answers through a :class:`Script`,
and reports usage from a deterministic token count and a prefix cache modelled on the real providers.
Nothing here reads the clock except through the injected ``clock``, and nothing is random.

**Tokens.** The prompt is a sequence of blocks in prompt order: tool definitions, system blocks, then
every message's content blocks. Each block is encoded as canonical JSON of a format-neutral form (text,
image digest and size, tool call with canonical arguments, tool result) — the first block of every wire
message is prefixed with its role marker ``{"role":…}`` — and padded with zero bytes to a multiple of 4.
One token is 4 bytes of that stream, so a block costs ``ceil(len/4)`` tokens (at least 1); an image costs
at least ``ceil(width*height/750)`` (Anthropic's published estimate). The same conversation counts the same
in both formats except where the formats differ (tool-result images, role layout). The output count
uses the same rule over the answer's blocks.

**Prefix identity** is a sha256 chain over that token stream, seeded with the API and the model, so two
prompts share a cached prefix only if their token streams are identical up to that point: a changed system
prompt, tool or earlier message busts everything after it, and another model never shares a cache.

**Anthropic-style cache** (explicit): breakpoints are the blocks carrying ``cache_control`` plus, for a
top-level ``cache_control`` (automatic caching), the last block. More than ``max_breakpoints`` (4) is a
400. Read: for each breakpoint, the longest live entry at that block boundary or one of the
``lookback_blocks`` (20) boundaries before it; the request reads the longest of those. Write: every
breakpoint prefix of at least ``min_tokens`` (1024, Sonnet-class; configurable) that is not cached yet is
stored with the breakpoint's TTL (``ttl: "1h"`` → 3600 s, else ``ttl_seconds`` = 300); hits and re-marked
entries are refreshed. Usage: ``cache_read_input_tokens`` = the read prefix, ``cache_creation_input_tokens``
= tokens from there to the furthest newly written breakpoint, ``input_tokens`` = the rest.

**OpenAI-style cache** (automatic): every request stores the digests of its token stream at each multiple
of ``granularity`` (128) tokens from ``min_tokens`` (1024) up; ``cached_tokens`` is the longest stored,
live such prefix — so it is 0 below 1024 and grows in 128-token steps. Entries live ``ttl_seconds`` (300)
after their last use. ``prompt_tokens`` includes the cached tokens, as OpenAI reports it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeAlias

import httpx

from ..core.codec import canonical_json, loads
from ..core.images import image_dimensions, sniff_media_type

__all__ = [
    "AnthropicCachePolicy",
    "Conversation",
    "Emulator",
    "EmulatorResponse",
    "EmulatorTransport",
    "ImagePart",
    "OpenAICachePolicy",
    "Part",
    "Reply",
    "Script",
    "ScriptedCall",
    "TextPart",
    "ToolCallPart",
    "ToolDef",
    "ToolLoopScript",
    "ToolResultPart",
    "Turn",
    "count_tokens",
]

Api = Literal["anthropic", "openai"]
ANTHROPIC_PATH: Final = "/v1/messages"
OPENAI_PATH: Final = "/v1/chat/completions"
BYTES_PER_TOKEN: Final = 4
IMAGE_PIXELS_PER_TOKEN: Final = 750

# ---------------------------------------------------------------------------- what a script sees


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    media_type: str
    digest: str  # sha256:<hex> of the image bytes
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    id: str
    name: str
    arguments: Any  # the parsed JSON arguments (OpenAI: the raw string when it is not JSON)


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    tool_call_id: str
    content: tuple[TextPart | ImagePart, ...]
    is_error: bool = False


Part: TypeAlias = TextPart | ImagePart | ToolCallPart | ToolResultPart


@dataclass(frozen=True, slots=True)
class Turn:
    """One wire message, format-neutral. OpenAI tool messages are turns of role ``tool``."""

    role: Literal["system", "user", "assistant", "tool"]
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A parsed request. ``prompt_digest`` is the hex sha256 of its whole token stream (a stable seed)."""

    api: Api
    model: str
    system: str | None
    tools: tuple[ToolDef, ...]
    turns: tuple[Turn, ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    prompt_digest: str


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model answers: optional text, then tool calls (in that order on the wire)."""

    text: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()


class Script(Protocol):
    """Decides the answer from the parsed conversation. Must be deterministic."""

    def reply(self, conversation: Conversation) -> Reply: ...


class ToolLoopScript:
    """The default script: for every user turn, ``tool_steps`` rounds of tool calls, then a text answer.

    A round is an assistant message with tool calls since the last assistant message without any. Each
    round calls ``calls_per_step`` tools, chosen and given arguments from the sha256 of the prompt (every
    property of the tool's schema gets a value of its type), so the same conversation always gets the same
    answer and different conversations get different ones. With no tools it answers right away.
    """

    def __init__(self, tool_steps: int = 2, calls_per_step: int = 1) -> None:
        if tool_steps < 0 or calls_per_step < 1:
            raise ValueError("tool_steps must be >= 0 and calls_per_step >= 1")
        self.tool_steps = tool_steps
        self.calls_per_step = calls_per_step

    def reply(self, conversation: Conversation) -> Reply:
        seed = bytes.fromhex(conversation.prompt_digest)
        rounds = 0
        for turn in reversed(conversation.turns):
            if turn.role != "assistant":
                continue
            if any(isinstance(p, ToolCallPart) for p in turn.parts):
                rounds += 1
            else:
                break
        if conversation.tools and rounds < self.tool_steps:
            calls = []
            for k in range(self.calls_per_step):
                h = hashlib.sha256(seed + k.to_bytes(2, "big")).digest()
                tool = conversation.tools[h[0] % len(conversation.tools)]
                calls.append(ScriptedCall(tool.name, scripted_arguments(tool.input_schema, h)))
            names = ", ".join(c.name for c in calls)
            return Reply(f"Step {rounds + 1} of {self.tool_steps}: calling {names}.", tuple(calls))
        question = _last_user_text(conversation.turns)
        words = " ".join(_WORDS[b % len(_WORDS)] for b in seed[:8])
        return Reply(f"Answer to {question[:60]!r} after {rounds} tool round(s): {words}.")


_WORDS: Final = (
    "alpha", "bravo", "cache", "delta", "event", "fold", "graph", "header",
    "index", "join", "kafka", "log", "merge", "node", "offset", "prefix",
)  # fmt: skip


def _last_user_text(turns: Sequence[Turn]) -> str:
    for turn in reversed(turns):
        if turn.role == "user":
            texts = [p.text for p in turn.parts if isinstance(p, TextPart)]
            if texts:
                return texts[-1]
    return ""


def scripted_arguments(schema: Mapping[str, Any], seed: bytes) -> dict[str, Any]:
    """Deterministic arguments for a JSON schema: one value per property, by its declared type."""
    out: dict[str, Any] = {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return out
    for name in sorted(properties):
        spec = properties[name]
        h = hashlib.sha256(seed + name.encode("utf-8")).digest()
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        enum = spec.get("enum") if isinstance(spec, Mapping) else None
        if isinstance(enum, Sequence) and not isinstance(enum, str) and enum:
            out[name] = enum[h[0] % len(enum)]
        elif kind == "string":
            out[name] = f"{name}-{h.hex()[:8]}"
        elif kind == "integer":
            out[name] = h[0] % 100
        elif kind == "number":
            out[name] = (h[0] % 100) / 4
        elif kind == "boolean":
            out[name] = h[0] % 2 == 0
        elif kind == "array":
            out[name] = []
        elif kind == "object":
            out[name] = {}
    return out


# ---------------------------------------------------------------------------- cache policies


@dataclass(frozen=True, slots=True)
class AnthropicCachePolicy:
    min_tokens: int = 1024
    ttl_seconds: float = 300.0
    long_ttl_seconds: float = 3600.0
    lookback_blocks: int = 20
    max_breakpoints: int = 4


@dataclass(frozen=True, slots=True)
class OpenAICachePolicy:
    min_tokens: int = 1024
    granularity: int = 128
    ttl_seconds: float = 300.0


# ---------------------------------------------------------------------------- token stream


class RequestRejected(Exception):
    """The request is invalid for the API it was sent to; becomes an HTTP error answer."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(slots=True)
class _Block:
    data: bytes  # padded to tokens * BYTES_PER_TOKEN
    tokens: int
    ttl: float | None = None  # set when this block is a cache breakpoint


def _block(neutral: Any, role: str | None = None, min_tokens: int = 1) -> _Block:
    raw = canonical_json(neutral)
    if role is not None:
        raw = b'{"role":"' + role.encode() + b'"}' + raw
    tokens = max(min_tokens, 1, -(-len(raw) // BYTES_PER_TOKEN))
    return _Block(raw + b"\0" * (tokens * BYTES_PER_TOKEN - len(raw)), tokens)


def count_tokens(neutral: Any) -> int:
    """Tokens of one format-neutral block (see the module docstring)."""
    return _block(neutral).tokens


def _image_tokens(width: int, height: int) -> int:
    return max(1, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


@dataclass(slots=True)
class _Prompt:
    """A parsed request: the conversation for the script and the blocks for token accounting."""

    api: Api
    model: str
    system: list[str] = field(default_factory=list)
    tools: list[ToolDef] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()

    def add_turn(self, role: Literal["system", "user", "assistant", "tool"], parts: list[tuple[Part, _Block]]) -> None:
        if not parts:
            raise RequestRejected(400, f"messages: a {role} message has no content")
        first = parts[0][1]
        marker = b'{"role":"' + role.encode() + b'"}'
        raw = marker + first.data.rstrip(b"\0")
        tokens = max(first.tokens, -(-len(raw) // BYTES_PER_TOKEN))
        first.data, first.tokens = raw + b"\0" * (tokens * BYTES_PER_TOKEN - len(raw)), tokens
        self.turns.append(Turn(role, tuple(p for p, _ in parts)))
        self.blocks.extend(b for _, b in parts)

    def digests(self) -> tuple[list[bytes], hashlib._Hash]:
        """sha256 chain at every block boundary (seeded with api and model) and the running hasher."""
        h = hashlib.sha256(b"foldline-emulator\0" + self.api.encode() + b"\0" + self.model.encode() + b"\0")
        out = []
        for b in self.blocks:
            h.update(b.data)
            out.append(h.digest())
        return out, h

    def conversation(self, prompt_digest: str) -> Conversation:
        return Conversation(
            self.api,
            self.model,
            "\n".join(self.system) or None,
            tuple(self.tools),
            tuple(self.turns),
            self.max_tokens,
            self.stop,
            prompt_digest,
        )


# ---------------------------------------------------------------------------- parsing helpers


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestRejected(400, f"{where}: expected an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestRejected(400, f"{where}: expected an array")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestRejected(400, f"{where}: expected a string")
    return value


def _only(d: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise RequestRejected(400, f"{where}.{extra[0]}: Extra inputs are not permitted")


def _image_part(data: bytes, media_type: str, where: str) -> tuple[ImagePart, _Block]:
    if sniff_media_type(data) != media_type:
        raise RequestRejected(400, f"{where}: image data is not a valid {media_type}")
    try:
        width, height = image_dimensions(data, media_type)
    except ValueError as exc:
        raise RequestRejected(400, f"{where}: {exc}") from None
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    part = ImagePart(media_type, digest, width, height)
    neutral = {"digest": digest, "height": height, "media_type": media_type, "type": "image", "width": width}
    return part, _block(neutral, min_tokens=_image_tokens(width, height))


def _neutral_part(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text, "type": "text"}
    return {"digest": part.digest, "height": part.height, "media_type": part.media_type, "type": "image"}


def _result_block(part: ToolResultPart) -> _Block:
    neutral: dict[str, Any] = {
        "content": [_neutral_part(p) for p in part.content],
        "tool_call_id": part.tool_call_id,
        "type": "tool_result",
    }
    if part.is_error:
        neutral["is_error"] = True
    images = sum(_image_tokens(p.width, p.height) for p in part.content if isinstance(p, ImagePart))
    text_tokens = _block(neutral).tokens
    return _block(neutral, min_tokens=text_tokens + images)


def _call_block(part: ToolCallPart) -> _Block:
    arguments = part.arguments if isinstance(part.arguments, str) else canonical_json(part.arguments).decode()
    return _block({"arguments": arguments, "id": part.id, "name": part.name, "type": "tool_call"})


def _tool_block(tool: ToolDef) -> _Block:
    return _block({"description": tool.description, "input_schema": tool.input_schema, "name": tool.name})


# ---------------------------------------------------------------------------- Anthropic parsing

_ANTHROPIC_TOP: Final = frozenset(
    {
        "model", "max_tokens", "messages", "system", "tools", "temperature", "stop_sequences", "cache_control",
        "metadata", "tool_choice", "top_p", "top_k", "stream", "thinking", "output_config", "service_tier",
    }
)  # fmt: skip


def _anthropic_ttl(value: Any, where: str, policy: AnthropicCachePolicy) -> float | None:
    if value is None:
        return None
    cc = _obj(value, where)
    _only(cc, frozenset({"type", "ttl"}), where)
    if cc.get("type") != "ephemeral":
        raise RequestRejected(400, f"{where}.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise RequestRejected(400, f"{where}.ttl: Input should be '5m' or '1h'")
    return policy.long_ttl_seconds if ttl == "1h" else policy.ttl_seconds


def _anthropic_content_part(item: Any, where: str) -> tuple[TextPart | ImagePart, _Block, Any]:
    """A text or image block (as in user content and tool_result content) and its cache_control value."""
    block = _obj(item, where)
    kind = block.get("type")
    if kind == "text":
        _only(block, frozenset({"type", "text", "cache_control", "citations"}), where)
        text = _str(block.get("text"), f"{where}.text")
        if not text:
            raise RequestRejected(400, f"{where}: text content blocks must be non-empty")
        part = TextPart(text)
        return part, _block(_neutral_part(part)), block.get("cache_control")
    if kind == "image":
        _only(block, frozenset({"type", "source", "cache_control"}), where)
        source = _obj(block.get("source"), f"{where}.source")
        if source.get("type") != "base64":
            raise RequestRejected(400, f"{where}.source: the emulator only takes base64 image sources")
        media_type = _str(source.get("media_type"), f"{where}.source.media_type")
        try:
            data = base64.b64decode(_str(source.get("data"), f"{where}.source.data"), validate=True)
        except binascii.Error:
            raise RequestRejected(400, f"{where}.source.data: invalid base64") from None
        image, b = _image_part(data, media_type, where)
        return image, b, block.get("cache_control")
    raise RequestRejected(400, f"{where}.type: unexpected content block type {kind!r}")


def parse_anthropic(body: Any, policy: AnthropicCachePolicy) -> _Prompt:
    req = _obj(body, "body")
    _only(req, _ANTHROPIC_TOP, "body")
    if req.get("stream"):
        raise RequestRejected(400, "stream: the emulator does not stream")
    model = _str(req.get("model"), "model")
    max_tokens = req.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise RequestRejected(400, "max_tokens: Field required (a positive integer)")
    prompt = _Prompt("anthropic", model, max_tokens=max_tokens)
    stop = req.get("stop_sequences", [])
    prompt.stop = tuple(_str(s, "stop_sequences[]") for s in _list(stop, "stop_sequences"))
    temperature = req.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 1):
        raise RequestRejected(400, "temperature: Input should be between 0 and 1")

    for i, item in enumerate(_list(req.get("tools", []), "tools")):
        where = f"tools.{i}"
        tool = _obj(item, where)
        _only(tool, frozenset({"name", "description", "input_schema", "cache_control", "type"}), where)
        schema = _obj(tool.get("input_schema"), f"{where}.input_schema")
        if schema.get("type") != "object":
            raise RequestRejected(400, f"{where}.input_schema.type: Input should be 'object'")
        td = ToolDef(_str(tool.get("name"), f"{where}.name"), str(tool.get("description", "")), schema)
        if any(t.name == td.name for t in prompt.tools):
            raise RequestRejected(400, f"{where}.name: tool names must be unique")
        prompt.tools.append(td)
        b = _tool_block(td)
        b.ttl = _anthropic_ttl(tool.get("cache_control"), f"{where}.cache_control", policy)
        prompt.blocks.append(b)

    system = req.get("system")
    if isinstance(system, str):
        if system:
            prompt.system.append(system)
            prompt.blocks.append(_block({"text": system, "type": "text"}, role="system"))
    elif system is not None:
        for i, item in enumerate(_list(system, "system")):
            where = f"system.{i}"
            blk = _obj(item, where)
            _only(blk, frozenset({"type", "text", "cache_control"}), where)
            if blk.get("type") != "text":
                raise RequestRejected(400, f"{where}.type: Input should be 'text'")
            text = _str(blk.get("text"), f"{where}.text")
            prompt.system.append(text)
            b = _block({"text": text, "type": "text"}, role="system" if i == 0 else None)
            b.ttl = _anthropic_ttl(blk.get("cache_control"), f"{where}.cache_control", policy)
            prompt.blocks.append(b)

    messages = _list(req.get("messages"), "messages")
    if not messages:
        raise RequestRejected(400, "messages: at least one message is required")
    previous_calls: set[str] = set()
    for m, item in enumerate(messages):
        where = f"messages.{m}"
        msg = _obj(item, where)
        _only(msg, frozenset({"role", "content"}), where)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise RequestRejected(400, f"{where}.role: Input should be 'user' or 'assistant'")
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts: list[tuple[Part, _Block]] = []
        calls: set[str] = set()
        for k, raw in enumerate(_list(content, f"{where}.content")):
            w = f"{where}.content.{k}"
            blk = _obj(raw, w)
            kind = blk.get("type")
            block: _Block
            part: Part
            if kind == "tool_use":
                if role != "assistant":
                    raise RequestRejected(400, f"{w}: tool_use blocks are only allowed in assistant messages")
                _only(blk, frozenset({"type", "id", "name", "input", "cache_control"}), w)
                call = ToolCallPart(
                    _str(blk.get("id"), f"{w}.id"), _str(blk.get("name"), f"{w}.name"), blk.get("input")
                )
                _obj(call.arguments, f"{w}.input")
                calls.add(call.id)
                part, block = call, _call_block(call)
            elif kind == "tool_result":
                if role != "user":
                    raise RequestRejected(400, f"{w}: tool_result blocks are only allowed in user messages")
                _only(blk, frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}), w)
                call_id = _str(blk.get("tool_use_id"), f"{w}.tool_use_id")
                if call_id not in previous_calls:
                    raise RequestRejected(
                        400,
                        f"{w}: unexpected tool_use_id {call_id!r}: it must answer a tool_use of the previous message",
                    )
                result_content = blk.get("content", [])
                if isinstance(result_content, str):
                    result_content = [{"type": "text", "text": result_content}] if result_content else []
                inner = tuple(
                    _anthropic_content_part(x, f"{w}.content.{j}")[0]
                    for j, x in enumerate(_list(result_content, f"{w}.content"))
                )
                result = ToolResultPart(call_id, inner, bool(blk.get("is_error", False)))
                part, block = result, _result_block(result)
            elif kind in ("text", "image"):
                if kind == "image" and role != "user":
                    raise RequestRejected(400, f"{w}: image blocks are only allowed in user messages")
                part, block, _ = _anthropic_content_part(blk, w)
            else:
                raise RequestRejected(400, f"{w}.type: unexpected content block type {kind!r}")
            block.ttl = _anthropic_ttl(blk.get("cache_control"), f"{w}.cache_control", policy)
            parts.append((part, block))
        prompt.add_turn(role, parts)
        previous_calls = calls
    if (auto := _anthropic_ttl(req.get("cache_control"), "cache_control", policy)) is not None:
        last = prompt.blocks[-1]
        last.ttl = max(last.ttl or 0.0, auto)
    return prompt


# ---------------------------------------------------------------------------- OpenAI parsing

_OPENAI_TOP: Final = frozenset(
    {
        "model", "messages", "max_completion_tokens", "max_tokens", "temperature", "stop", "reasoning_effort",
        "tools", "tool_choice", "parallel_tool_calls", "top_p", "seed", "stream", "user", "metadata", "n",
        "prompt_cache_key", "service_tier", "store", "response_format",
    }
)  # fmt: skip


def _data_url_image(url: str, where: str) -> tuple[ImagePart, _Block]:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise RequestRejected(400, f"{where}: the emulator only takes base64 data URLs for images")
    media_type = head[len("data:") : -len(";base64")]
    try:
        data = base64.b64decode(payload, validate=True)
    except binascii.Error:
        raise RequestRejected(400, f"{where}: invalid base64") from None
    return _image_part(data, media_type, where)


def _openai_parts(content: Any, where: str, *, images: bool) -> list[tuple[TextPart | ImagePart, _Block]]:
    if isinstance(content, str):
        part = TextPart(content)
        return [(part, _block(_neutral_part(part)))]
    out: list[tuple[TextPart | ImagePart, _Block]] = []
    for k, raw in enumerate(_list(content, where)):
        w = f"{where}.{k}"
        item = _obj(raw, w)
        kind = item.get("type")
        if kind == "text":
            _only(item, frozenset({"type", "text"}), w)
            text_part = TextPart(_str(item.get("text"), f"{w}.text"))
            out.append((text_part, _block(_neutral_part(text_part))))
        elif kind == "image_url" and images:
            _only(item, frozenset({"type", "image_url"}), w)
            image = _obj(item.get("image_url"), f"{w}.image_url")
            _only(image, frozenset({"url", "detail"}), f"{w}.image_url")
            out.append(_data_url_image(_str(image.get("url"), f"{w}.image_url.url"), f"{w}.image_url.url"))
        else:
            raise RequestRejected(400, f"{w}.type: unexpected content part type {kind!r} here")
    return out


def parse_openai(body: Any) -> _Prompt:
    req = _obj(body, "body")
    _only(req, _OPENAI_TOP, "body")
    if req.get("stream"):
        raise RequestRejected(400, "stream: the emulator does not stream")
    prompt = _Prompt("openai", _str(req.get("model"), "model"))
    limit = req.get("max_completion_tokens", req.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise RequestRejected(400, "max_completion_tokens: expected a positive integer")
    prompt.max_tokens = limit
    stop = req.get("stop")
    if isinstance(stop, str):
        prompt.stop = (stop,)
    elif stop is not None:
        prompt.stop = tuple(_str(s, "stop[]") for s in _list(stop, "stop"))
    temperature = req.get("temperature")
    if temperature is not None and not (isinstance(temperature, int | float) and 0 <= temperature <= 2):
        raise RequestRejected(400, "temperature: expected a number between 0 and 2")

    for i, item in enumerate(_list(req.get("tools", []), "tools")):
        where = f"tools.{i}"
        tool = _obj(item, where)
        _only(tool, frozenset({"type", "function"}), where)
        if tool.get("type") != "function":
            raise RequestRejected(400, f"{where}.type: expected 'function'")
        fn = _obj(tool.get("function"), f"{where}.function")
        _only(fn, frozenset({"name", "description", "parameters", "strict"}), f"{where}.function")
        params = _obj(fn.get("parameters", {"type": "object", "properties": {}}), f"{where}.function.parameters")
        td = ToolDef(_str(fn.get("name"), f"{where}.function.name"), str(fn.get("description", "")), params)
        prompt.tools.append(td)
        prompt.blocks.append(_tool_block(td))

    messages = _list(req.get("messages"), "messages")
    if not messages:
        raise RequestRejected(400, "messages: at least one message is required")
    pending: set[str] = set()
    leading = True
    for m, item in enumerate(messages):
        where = f"messages[{m}]"
        msg = _obj(item, where)
        role = msg.get("role")
        if role != "tool" and pending:
            raise RequestRejected(
                400,
                f"{where}: an assistant message with 'tool_calls' must be followed by tool messages responding to "
                f"each 'tool_call_id'; missing: {sorted(pending)}",
            )
        parts: list[tuple[Part, _Block]] = []
        if role in ("system", "developer"):
            _only(msg, frozenset({"role", "content", "name"}), where)
            texts = _openai_parts(msg.get("content"), f"{where}.content", images=False)
            if leading:
                prompt.system.extend(p.text for p, _ in texts if isinstance(p, TextPart))
            parts.extend(texts)
            prompt.add_turn("system", parts)
            continue
        leading = False
        if role == "user":
            _only(msg, frozenset({"role", "content", "name"}), where)
            parts.extend(_openai_parts(msg.get("content"), f"{where}.content", images=True))
            prompt.add_turn("user", parts)
        elif role == "assistant":
            _only(msg, frozenset({"role", "content", "tool_calls", "name", "refusal"}), where)
            if msg.get("content") is not None:
                parts.extend(_openai_parts(msg.get("content"), f"{where}.content", images=False))
            for k, raw in enumerate(_list(msg.get("tool_calls", []), f"{where}.tool_calls")):
                w = f"{where}.tool_calls[{k}]"
                tc = _obj(raw, w)
                _only(tc, frozenset({"id", "type", "function"}), w)
                fn = _obj(tc.get("function"), f"{w}.function")
                _only(fn, frozenset({"name", "arguments"}), f"{w}.function")
                arguments = _str(fn.get("arguments"), f"{w}.function.arguments")
                try:
                    parsed: Any = loads(arguments)
                except ValueError:
                    parsed = arguments
                call = ToolCallPart(_str(tc.get("id"), f"{w}.id"), _str(fn.get("name"), f"{w}.function.name"), parsed)
                pending.add(call.id)
                parts.append((call, _call_block(call)))
            prompt.add_turn("assistant", parts)
        elif role == "tool":
            _only(msg, frozenset({"role", "content", "tool_call_id"}), where)
            call_id = _str(msg.get("tool_call_id"), f"{where}.tool_call_id")
            if call_id not in pending:
                raise RequestRejected(
                    400,
                    f"{where}: messages with role 'tool' must be a response to a preceding message with "
                    f"'tool_calls' (unknown tool_call_id {call_id!r})",
                )
            pending.discard(call_id)
            texts = _openai_parts(msg.get("content"), f"{where}.content", images=False)
            result = ToolResultPart(call_id, tuple(p for p, _ in texts))
            parts.append((result, _result_block(result)))
            prompt.add_turn("tool", parts)
        else:
            raise RequestRejected(400, f"{where}.role: unexpected role {role!r}")
    if pending:
        raise RequestRejected(400, f"messages: tool calls without responses: {sorted(pending)}")
    return prompt


# ---------------------------------------------------------------------------- the emulator


@dataclass(frozen=True, slots=True)
class EmulatorResponse:
    status: int
    body: bytes
    content_type: str = "application/json"


@dataclass(slots=True)
class _Entry:
    expires: float


@dataclass(frozen=True, slots=True)
class _Answer:
    content: tuple[TextPart | ToolCallPart, ...]
    output_tokens: int
    stop_reason: Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"]
    stop_sequence: str | None


class Emulator:
    """The provider backend: parse, answer through the script, account tokens and cache. Thread-safe.

    ``api_key``: when set, requests must carry it (``x-api-key`` / ``Authorization: Bearer``), else 401.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        clock: Callable[[], float] = time.time,
        anthropic_cache: AnthropicCachePolicy | None = None,
        openai_cache: OpenAICachePolicy | None = None,
        api_key: str | None = None,
    ) -> None:
        self.script: Script = script if script is not None else ToolLoopScript()
        self.clock = clock
        self.anthropic_cache = anthropic_cache or AnthropicCachePolicy()
        self.openai_cache = openai_cache or OpenAICachePolicy()
        self.api_key = api_key
        self._lock = threading.Lock()
        self._caches: dict[tuple[Api, str], dict[bytes, _Entry]] = {}
        self.requests = 0

    # ------------------------------------------------------------------ HTTP-shaped entry point

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        """Answer one HTTP request (path without query). Never raises for a bad request."""
        lower = {k.lower(): v for k, v in headers.items()}
        api: Api | None = "anthropic" if path == ANTHROPIC_PATH else "openai" if path == OPENAI_PATH else None
        try:
            if api is None:
                raise RequestRejected(
                    404, f"no route for {path}; POST {ANTHROPIC_PATH} or {OPENAI_PATH}", "not_found_error"
                )
            if method != "POST":
                raise RequestRejected(405, f"{method} {path}: only POST is supported", "invalid_request_error")
            self._authenticate(api, lower)
            if api == "anthropic" and "anthropic-version" not in lower:
                raise RequestRejected(400, "anthropic-version: header is required")
            try:
                payload = loads(body)
            except ValueError as exc:
                raise RequestRejected(400, f"body is not valid JSON: {exc}") from None
            answer = self.anthropic_messages(payload) if api == "anthropic" else self.openai_chat(payload)
            return EmulatorResponse(200, canonical_json(answer))
        except RequestRejected as exc:
            return EmulatorResponse(exc.status, canonical_json(_error_body(api, exc)))

    def _authenticate(self, api: Api, headers: Mapping[str, str]) -> None:
        if self.api_key is None:
            return
        given = (
            headers.get("x-api-key") if api == "anthropic" else headers.get("authorization", "").removeprefix("Bearer ")
        )
        if given != self.api_key:
            raise RequestRejected(401, "invalid api key", "authentication_error")

    # ------------------------------------------------------------------ the two APIs (parsed JSON in, JSON out)

    def anthropic_messages(self, payload: Any) -> dict[str, Any]:
        prompt = parse_anthropic(payload, self.anthropic_cache)
        breakpoints = [i for i, b in enumerate(prompt.blocks) if b.ttl is not None]
        if len(breakpoints) > self.anthropic_cache.max_breakpoints:
            raise RequestRejected(
                400,
                f"A maximum of {self.anthropic_cache.max_breakpoints} blocks with cache_control may be provided. "
                f"Found {len(breakpoints)}.",
            )
        digests, hasher = prompt.digests()
        seed = hasher.hexdigest()
        with self._lock:
            read, write = self._account_anthropic(prompt, digests, breakpoints)
        total = sum(b.tokens for b in prompt.blocks)
        answer = self._answer(prompt, seed)
        ids = hashlib.sha256(b"ids" + bytes.fromhex(seed)).hexdigest()
        content: list[dict[str, Any]] = []
        for k, part in enumerate(answer.content):
            if isinstance(part, TextPart):
                content.append({"citations": None, "text": part.text, "type": "text"})
            else:
                content.append(
                    {
                        "id": f"toolu_emu_{ids[:20]}{k:02d}",
                        "input": part.arguments,
                        "name": part.name,
                        "type": "tool_use",
                    }
                )
        return {
            "content": content,
            "id": f"msg_emu_{ids[20:44]}",
            "model": prompt.model,
            "role": "assistant",
            "stop_reason": answer.stop_reason,
            "stop_sequence": answer.stop_sequence,
            "type": "message",
            "usage": {
                "cache_creation_input_tokens": write,
                "cache_read_input_tokens": read,
                "input_tokens": total - read - write,
                "output_tokens": answer.output_tokens,
            },
        }

    def openai_chat(self, payload: Any) -> dict[str, Any]:
        prompt = parse_openai(payload)
        total = sum(b.tokens for b in prompt.blocks)
        stream = b"".join(b.data for b in prompt.blocks)
        _, hasher = prompt.digests()
        seed = hasher.hexdigest()
        with self._lock:
            cached = self._account_openai(prompt, stream)
        answer = self._answer(prompt, seed)
        ids = hashlib.sha256(b"ids" + bytes.fromhex(seed)).hexdigest()
        text = "".join(p.text for p in answer.content if isinstance(p, TextPart)) or None
        calls = [
            {
                "function": {"arguments": canonical_json(p.arguments).decode(), "name": p.name},
                "id": f"call_emu_{ids[:20]}{k:02d}",
                "type": "function",
            }
            for k, p in enumerate(answer.content)
            if isinstance(p, ToolCallPart)
        ]
        message: dict[str, Any] = {"content": text, "refusal": None, "role": "assistant"}
        if calls:
            message["tool_calls"] = calls
        finish = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
        return {
            "choices": [
                {"finish_reason": finish[answer.stop_reason], "index": 0, "logprobs": None, "message": message}
            ],
            "created": int(self.clock()),
            "id": f"chatcmpl-emu-{ids[20:44]}",
            "model": prompt.model,
            "object": "chat.completion",
            "usage": {
                "completion_tokens": answer.output_tokens,
                "prompt_tokens": total,
                "prompt_tokens_details": {"cached_tokens": cached},
                "total_tokens": total + answer.output_tokens,
            },
        }

    def reset_caches(self) -> None:
        with self._lock:
            self._caches.clear()

    # ------------------------------------------------------------------ answers

    def _answer(self, prompt: _Prompt, seed: str) -> _Answer:
        reply = self.script.reply(prompt.conversation(seed))
        names = {t.name for t in prompt.tools}
        for call in reply.tool_calls:
            if call.name not in names:
                raise RequestRejected(500, f"script called unknown tool {call.name!r}", "api_error")
        text = reply.text
        stop_reason: Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"] = (
            "tool_use" if reply.tool_calls else "end_turn"
        )
        stop_sequence = None
        calls = reply.tool_calls
        if text is not None:
            hits = [(text.find(s), s) for s in prompt.stop if s and s in text]
            if hits:
                at, stop_sequence = min(hits)
                text, calls, stop_reason = text[:at], (), "stop_sequence"
        parts: list[TextPart | ToolCallPart] = [TextPart(text)] if text else []
        parts.extend(ToolCallPart("", c.name, dict(c.arguments)) for c in calls)
        output = sum(_output_tokens(p) for p in parts)
        if prompt.max_tokens is not None and output > prompt.max_tokens:
            cut = (text or "")[: prompt.max_tokens * BYTES_PER_TOKEN // 2]
            parts = [TextPart(cut)] if cut else []
            output = min(prompt.max_tokens, sum(_output_tokens(p) for p in parts))
            stop_reason, stop_sequence = "max_tokens", None
        return _Answer(tuple(parts), output, stop_reason, stop_sequence)

    # ------------------------------------------------------------------ cache accounting (under the lock)

    def _cache(self, api: Api, model: str) -> dict[bytes, _Entry]:
        cache = self._caches.setdefault((api, model), {})
        self.requests += 1
        if self.requests % 256 == 0:
            now = self.clock()
            for c in self._caches.values():
                for key in [k for k, e in c.items() if e.expires <= now]:
                    del c[key]
        return cache

    def _account_anthropic(self, prompt: _Prompt, digests: list[bytes], breakpoints: list[int]) -> tuple[int, int]:
        policy = self.anthropic_cache
        cache = self._cache("anthropic", prompt.model)
        now = self.clock()
        cumulative: list[int] = []
        running = 0
        for b in prompt.blocks:
            running += b.tokens
            cumulative.append(running)
        read_at = -1
        for p in breakpoints:
            for j in range(p, max(-1, p - policy.lookback_blocks - 1), -1):
                entry = cache.get(digests[j])
                if entry is not None and entry.expires > now:
                    read_at = max(read_at, j)
                    break
        read = cumulative[read_at] if read_at >= 0 else 0
        if read_at >= 0:
            hit = cache[digests[read_at]]
            hit.expires = max(hit.expires, now + policy.ttl_seconds)
        written_to = read_at
        for p in breakpoints:
            ttl = prompt.blocks[p].ttl
            assert ttl is not None
            entry = cache.get(digests[p])
            if entry is not None and entry.expires > now:
                entry.expires = max(entry.expires, now + ttl)
            elif cumulative[p] >= policy.min_tokens:
                cache[digests[p]] = _Entry(now + ttl)
                written_to = max(written_to, p)
        write = cumulative[written_to] - read if written_to > read_at else 0
        return read, write

    def _account_openai(self, prompt: _Prompt, stream: bytes) -> int:
        policy = self.openai_cache
        cache = self._cache("openai", prompt.model)
        now = self.clock()
        step = policy.granularity * BYTES_PER_TOKEN
        h = hashlib.sha256(b"foldline-emulator\0openai\0" + prompt.model.encode() + b"\0")
        keys: list[tuple[int, bytes]] = []
        for k in range(1, len(stream) // step + 1):
            h.update(stream[(k - 1) * step : k * step])
            tokens = k * policy.granularity
            if tokens >= policy.min_tokens:
                keys.append((tokens, h.digest()))
        cached = 0
        for tokens, key in reversed(keys):
            entry = cache.get(key)
            if entry is not None and entry.expires > now:
                cached = tokens
                break
        for _, key in keys:
            cache[key] = _Entry(now + policy.ttl_seconds)
        return cached


def _output_tokens(part: TextPart | ToolCallPart) -> int:
    if isinstance(part, TextPart):
        return _block(_neutral_part(part)).tokens
    return _block({"arguments": canonical_json(part.arguments).decode(), "name": part.name, "type": "tool_call"}).tokens


def _error_body(api: Api | None, exc: RequestRejected) -> dict[str, Any]:
    if api == "openai":
        return {"error": {"code": None, "message": exc.message, "param": None, "type": exc.kind}}
    return {"error": {"message": exc.message, "type": exc.kind}, "type": "error"}


# ---------------------------------------------------------------------------- in-process transport


class EmulatorTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that answers from an in-process :class:`Emulator` — no socket, same bytes.

    The adapters' real serializers and HTTP code run unchanged; only the network is skipped.
    """

    def __init__(self, emulator: Emulator | None = None) -> None:
        self.emulator = emulator if emulator is not None else Emulator()

    def _respond(self, request: httpx.Request, body: bytes) -> httpx.Response:
        answer = self.emulator.handle(request.method, request.url.path, request.headers, body)
        return httpx.Response(answer.status, headers={"content-type": answer.content_type}, content=answer.body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, await request.aread())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._respond(request, request.read())
