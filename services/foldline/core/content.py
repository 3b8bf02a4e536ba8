"""Content blocks, image references and token usage: the parts messages are made of."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "ATTACHMENT_ID_RE",
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


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A content-addressed image: the log records the digest and the metadata the bytes must match."""

    attachment_id: str
    media_type: str
    bytes: int
    width: int
    height: int

    def __post_init__(self) -> None:
        if not ATTACHMENT_ID_RE.match(self.attachment_id):
            raise ValueError(f"attachmentId must be 'sha256:' + 64 lowercase hex, got {self.attachment_id!r}")
        if self.media_type not in IMAGE_MEDIA_TYPES:
            raise ValueError(f"image mediaType must be one of {sorted(IMAGE_MEDIA_TYPES)}, got {self.media_type!r}")
        if self.bytes < 0 or self.width <= 0 or self.height <= 0:
            raise ValueError("image bytes must be >= 0 and width/height > 0")


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImageBlock:
    image: ImageRef
    kind: Literal["image"] = "image"


@dataclass(frozen=True, slots=True)
class ToolCallBlock:
    id: str
    name: str
    arguments: str  # the raw JSON text the model produced
    kind: Literal["tool-call"] = "tool-call"


ToolResultPart: TypeAlias = TextBlock | ImageBlock


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    tool_call_id: str
    content: tuple[ToolResultPart, ...]
    is_error: bool = False
    kind: Literal["tool-result"] = "tool-result"


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    """The model's reasoning text, and the provider's signature over it when the provider signs it.

    Anthropic ``thinking {thinking, signature}``; a ``reasoning_content`` string (DeepSeek, vLLM, SGLang);
    dsh's ``reasoning {text}``. ``signature`` is opaque, kept byte for byte, absent when there is none.
    """

    text: str
    signature: str | None = None
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class RedactedReasoningBlock:
    """Reasoning the provider returned encrypted, with no text: Anthropic ``redacted_thinking {data}``."""

    data: str
    kind: Literal["redacted-reasoning"] = "redacted-reasoning"


@dataclass(frozen=True, slots=True)
class EncryptedReasoningBlock:
    """An OpenAI Responses reasoning item: its id, its summary texts and its ``encrypted_content``.

    The summary parts are kept as separate strings (in order) so the item goes back exactly as it came.
    """

    id: str
    summary: tuple[str, ...]
    encrypted_content: str
    kind: Literal["encrypted-reasoning"] = "encrypted-reasoning"


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


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one provider call, normalized: ``input`` counts uncached input tokens only."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Every input token of the request, cached or not."""
        return self.input + self.cache_read + self.cache_write
