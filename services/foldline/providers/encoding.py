"""Pieces shared by the wire serializers: image resolution, tool arguments, tool schemas, misplaced blocks, the
results of a tool message."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

from ..core.codec import loads
from ..core.content import ImageRef, ToolResultBlock
from ..core.projection import Message
from ..errors import ProviderError
from ..ports.attachments import AttachmentStore

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "image_base64",
    "misplaced_block",
    "tool_input_object",
    "tool_results",
    "tool_schema",
]

#: A tool without a schema takes no arguments; both APIs want an object schema, so it is sent as this.
EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"properties": {}, "type": "object"}


def image_base64(ref: ImageRef, attachments: AttachmentStore | None, provider: str) -> str:
    """The verified bytes of an image, base64-encoded. Store errors (not found, corrupt) propagate as is."""
    if attachments is None:
        raise ProviderError(
            f"{provider}: the request carries image {ref.attachment_id} but the serializer was given no "
            "attachment store; pass the session's AttachmentStore"
        )
    data = attachments.get(ref.attachment_id, expected=ref)
    return base64.b64encode(data).decode("ascii")


def misplaced_block(provider: str, api: str, kind: str, index: int, role: str) -> ProviderError:
    """The error for a content block the message's role cannot carry in ``api`` (e.g. a tool call from the user)."""
    return ProviderError(f"{provider}: message {index} (role {role}) cannot carry a {kind} block in {api}")


def tool_results(message: Message, index: int, provider: str, api: str) -> Iterator[ToolResultBlock]:
    """The blocks of tool message ``index``, in order; a tool message carries only tool results, so any other
    block raises :func:`misplaced_block` when the walk reaches it."""
    for block in message.content:
        if not isinstance(block, ToolResultBlock):
            raise misplaced_block(provider, api, block.kind, index, message.role)
        yield block


def tool_input_object(arguments: str, call_id: str, provider: str) -> dict[str, Any]:
    """Parse a logged tool call's raw arguments; they must be the text of a JSON object."""
    try:
        value = loads(arguments)
    except ValueError:
        raise ProviderError(
            f"{provider}: tool call {call_id!r} has arguments that are not valid JSON "
            f"({arguments[:80]!r}); this API needs a JSON object as tool input"
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            f"{provider}: tool call {call_id!r} has arguments that are JSON {type(value).__name__}, "
            "not an object; this API needs a JSON object as tool input"
        )
    return value


def tool_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """A tool's JSON schema as sent: the empty schema becomes an object schema with no properties."""
    return schema if len(schema) else EMPTY_OBJECT_SCHEMA
