"""Content blocks, image references and token usage: the parts messages are made of."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, TypeAlias

import msgspec

from .records import Content, Id, Nat, Pos, Record, tagged

__all__ = [
    "ATTACHMENT_ID_RE",
    "Block",
    "REASONING_KINDS",
    "ContentBlock",
    "EncryptedReasoningBlock",
    "ImageBlock",
    "ImageRef",
    "ReasoningBlock",
    "ReasoningContent",
    "RedactedReasoningBlock",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "ToolResultPart",
    "Usage",
]

ATTACHMENT_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class ImageRef(Record, frozen=True):
    """A content-addressed image: the log records the digest and the metadata the bytes must match."""

    attachment_id: str
    media_type: str
    bytes: Nat
    width: Pos
    height: Pos
    name: Content | None = None  # the file name the image came with, when it had one; not model-visible, but sealed

    def __post_init__(self) -> None:
        if not ATTACHMENT_ID_RE.match(self.attachment_id):
            raise ValueError(f"attachmentId must be 'sha256:' + 64 lowercase hex, got {self.attachment_id!r}")
        if self.media_type not in IMAGE_MEDIA_TYPES:
            raise ValueError(f"image mediaType must be one of {sorted(IMAGE_MEDIA_TYPES)}, got {self.media_type!r}")
        if self.bytes < 0 or self.width <= 0 or self.height <= 0:
            raise ValueError("image bytes must be >= 0 and width/height > 0")


class Block(Record, tag_field="type", frozen=True):
    """A content block; ``kind`` is its logged ``type``."""

    kind: ClassVar[str]


@tagged
class TextBlock(Block, tag="text", frozen=True):
    text: Content


@tagged
class ImageBlock(Block, tag="image", frozen=True):
    image: ImageRef = msgspec.field(name="attachment")


@tagged
class ToolCallBlock(Block, tag="tool-call", frozen=True):
    id: Id
    name: Id
    arguments: Annotated[Content, msgspec.Meta(description="The raw JSON text the model produced.")]


ToolResultPart: TypeAlias = TextBlock | ImageBlock


@tagged
class ToolResultBlock(Block, tag="tool-result", frozen=True):
    tool_call_id: Id
    content: tuple[ToolResultPart, ...]
    is_error: bool = False


@tagged
class ReasoningBlock(Block, tag="reasoning", frozen=True):
    """The model's reasoning text, and the provider's signature over it when the provider signs it.

    Anthropic ``thinking {thinking, signature}``; a ``reasoning_content`` string (DeepSeek, vLLM, SGLang);
    dsh's ``reasoning {text}``. ``signature`` is opaque, kept byte for byte, absent when there is none.
    """

    text: Content
    signature: Content | None = None


@tagged
class RedactedReasoningBlock(Block, tag="redacted-reasoning", frozen=True):
    """Reasoning the provider returned encrypted, with no text: Anthropic ``redacted_thinking {data}``."""

    data: Content


@tagged
class EncryptedReasoningBlock(Block, tag="encrypted-reasoning", frozen=True):
    """An OpenAI Responses reasoning item: its id, its summary texts and its ``encrypted_content``.

    The summary parts are kept as separate strings (in order) so the item goes back exactly as it came.
    """

    id: str
    summary: tuple[Content, ...]
    encrypted_content: Content


ReasoningContent: TypeAlias = ReasoningBlock | RedactedReasoningBlock | EncryptedReasoningBlock
REASONING_KINDS: frozenset[str] = frozenset({"reasoning", "redacted-reasoning", "encrypted-reasoning"})

ContentBlock: TypeAlias = (
    TextBlock
    | ImageBlock
    | ToolCallBlock
    | ToolResultBlock
    | ReasoningBlock
    | RedactedReasoningBlock
    | EncryptedReasoningBlock
)


class Usage(Record, frozen=True):
    """Token usage of one provider call, as logged: ``input`` counts uncached input tokens only.

    ``reasoning_tokens``: how many of the ``output`` tokens the model spent reasoning, when the provider says
    (OpenAI ``completion_tokens_details.reasoning_tokens`` and ``output_tokens_details.reasoning_tokens``,
    DeepSeek, Gemini ``thoughtsTokenCount``). ``cache_write_1h``: how many of the ``cache_write`` tokens were
    written with the 1-hour TTL, when the provider says (Anthropic ``cache_creation.ephemeral_1h_input_tokens``);
    the rest of ``cache_write`` was written with the provider's short TTL. What every cost figure reads is
    derived from this once (:mod:`foldline.core.usage`)."""

    input: Nat = 0
    output: Nat = 0
    cache_read: Nat = 0
    cache_write: Nat = 0
    reasoning_tokens: Nat | None = None
    cache_write_1h: Nat | None = msgspec.field(default=None, name="cacheWrite1h")

    def __post_init__(self) -> None:
        if self.cache_write_1h is not None and self.cache_write_1h > self.cache_write:
            raise ValueError(
                f"cacheWrite1h {self.cache_write_1h} exceeds cacheWrite {self.cache_write} (it is a part of it)"
            )

    @property
    def prompt_tokens(self) -> int:
        """Every input token of the request, cached or not."""
        return self.input + self.cache_read + self.cache_write
