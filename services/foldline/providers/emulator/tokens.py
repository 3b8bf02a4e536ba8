"""The token stream: how the emulator counts a prompt and tells two prompts' prefixes apart.

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
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, assert_never

from ...core.codec import canonical_json
from .script import ImagePart, Part, ReasoningPart, Role, TextPart, ToolCallPart, ToolDef, ToolResultPart

__all__ = [
    "BYTES_PER_TOKEN",
    "IMAGE_PIXELS_PER_TOKEN",
    "Block",
    "block",
    "chain_seed",
    "count_tokens",
    "digest_chain",
    "mark_role",
    "output_tokens",
    "part_block",
    "tool_block",
]

BYTES_PER_TOKEN: Final = 4
IMAGE_PIXELS_PER_TOKEN: Final = 750


@dataclass(slots=True)
class Block:
    data: bytes  # padded to tokens * BYTES_PER_TOKEN
    tokens: int
    ttl: float | None = None  # set when this block is a cache breakpoint


def _padded(raw: bytes, tokens: int) -> bytes:
    return raw + b"\0" * (tokens * BYTES_PER_TOKEN - len(raw))


def _role_marker(role: str) -> bytes:
    return b'{"role":"' + role.encode() + b'"}'


def block(neutral: Any, role: str | None = None, min_tokens: int = 1) -> Block:
    """The block of one format-neutral value, optionally led by a role marker."""
    raw = canonical_json(neutral)
    if role is not None:
        raw = _role_marker(role) + raw
    tokens = max(min_tokens, 1, -(-len(raw) // BYTES_PER_TOKEN))
    return Block(_padded(raw, tokens), tokens)


def mark_role(first: Block, role: Role) -> None:
    """Lead a wire message's first block with its role marker (an image keeps its larger minimum)."""
    raw = _role_marker(role) + first.data.rstrip(b"\0")
    tokens = max(first.tokens, -(-len(raw) // BYTES_PER_TOKEN))
    first.data, first.tokens = _padded(raw, tokens), tokens


def count_tokens(neutral: Any) -> int:
    """Tokens of one format-neutral block (see the module docstring)."""
    return block(neutral).tokens


def _image_tokens(width: int, height: int) -> int:
    return max(1, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


def _neutral_content(part: TextPart | ImagePart) -> dict[str, Any]:
    """A text or image as it counts inside a tool result (an image without its width)."""
    match part:
        case TextPart(text=text):
            return {"text": text, "type": "text"}
        case ImagePart():
            return {"digest": part.digest, "height": part.height, "media_type": part.media_type, "type": "image"}
        case _:
            assert_never(part)


def _result_block(part: ToolResultPart) -> Block:
    neutral: dict[str, Any] = {
        "content": [_neutral_content(p) for p in part.content],
        "tool_call_id": part.tool_call_id,
        "type": "tool_result",
    }
    if part.is_error:
        neutral["is_error"] = True
    images = sum(_image_tokens(p.width, p.height) for p in part.content if isinstance(p, ImagePart))
    text_tokens = block(neutral).tokens
    return block(neutral, min_tokens=text_tokens + images)


def part_block(part: Part) -> Block:
    """The block of one message part, as it stands in the prompt."""
    match part:
        case TextPart():
            return block(_neutral_content(part))
        case ImagePart(media_type=media_type, digest=digest, width=width, height=height):
            neutral = {"digest": digest, "height": height, "media_type": media_type, "type": "image", "width": width}
            return block(neutral, min_tokens=_image_tokens(width, height))
        case ToolCallPart(id=call_id, name=name, arguments=arguments):
            raw = arguments if isinstance(arguments, str) else canonical_json(arguments).decode()
            return block({"arguments": raw, "id": call_id, "name": name, "type": "tool_call"})
        case ToolResultPart():
            return _result_block(part)
        case ReasoningPart(text=text):
            return block({"text": text, "type": "reasoning"})
        case _:
            assert_never(part)


def tool_block(tool: ToolDef) -> Block:
    return block({"description": tool.description, "input_schema": tool.input_schema, "name": tool.name})


def output_tokens(part: TextPart | ToolCallPart | ReasoningPart) -> int:
    """Tokens of one part of an answer (a tool call counts without its id, which the emulator assigns)."""
    match part:
        case TextPart():
            return block(_neutral_content(part)).tokens
        case ReasoningPart(text=text):
            return block({"text": text, "type": "reasoning"}).tokens
        case ToolCallPart(name=name, arguments=arguments):
            return block({"arguments": canonical_json(arguments).decode(), "name": name, "type": "tool_call"}).tokens
        case _:
            assert_never(part)


def chain_seed(api: str, model: str) -> bytes:
    """What the digest chain of a prompt starts from: the API and the model."""
    return b"foldline-emulator\0" + api.encode() + b"\0" + model.encode() + b"\0"


def digest_chain(api: str, model: str, blocks: Sequence[Block]) -> tuple[list[bytes], str]:
    """The sha256 chain at every block boundary (seeded with api and model) and the hex digest of it all."""
    h = hashlib.sha256(chain_seed(api, model))
    out = []
    for b in blocks:
        h.update(b.data)
        out.append(h.digest())
    return out, h.hexdigest()
