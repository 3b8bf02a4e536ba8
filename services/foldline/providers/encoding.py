"""Pieces shared by the wire serializers: image resolution, tool arguments, tool schemas, misplaced blocks, the
results of a tool message.

Key order (docs/FORMAT.md §9.0): a body is canonical JSON, sorted at every depth, except the objects a version
sends in their author's order — the tool schemas of every version from ``anthropic-messages`` v4,
``openai-chat`` v3, ``openai-responses`` v3 and ``reasoning-chat`` v3 on, and ``anthropic-messages`` v4's tool-call
``input``. Such an object is handed to the encoder as an :class:`~foldline.core.frozen.OrderedObject` (a schema,
written in its order) or as its text already encoded in order (an ``orjson.Fragment``: a tool call's input); an
earlier version hands it over as a plain ``dict``, which the encoder sorts.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from ..core.codec import loads
from ..core.content import ImageRef, ToolResultBlock
from ..core.frozen import OrderedObject, freeze_ordered, thaw_json
from ..core.projection import Message
from ..errors import ProviderError
from ..ports.attachments import AttachmentStore

__all__ = [
    "EMPTY_OBJECT_SCHEMA",
    "image_base64",
    "misplaced_block",
    "tool_input",
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


def tool_input(arguments: str, call_id: str, provider: str, *, ordered: bool) -> dict[str, Any] | orjson.Fragment:
    """A tool call's raw arguments as the JSON object a Messages API ``tool_use`` carries: ``ordered``, its keys in
    the text's order at every depth (a key given twice keeps its first place and its last value: what the parser
    builds), written once as it will be spliced into the body; else a plain ``dict`` that canonical JSON sorts."""
    value = tool_input_object(arguments, call_id, provider)
    return orjson.Fragment(orjson.dumps(value)) if ordered else value


def tool_schema(schema: Mapping[str, Any], *, ordered: bool) -> Mapping[str, Any]:
    """A tool's JSON schema as sent: the empty schema becomes an object schema with no properties (sorted, ours);
    any other in its author's order when ``ordered`` (the logged :class:`~foldline.core.frozen.OrderedObject`), else
    as a plain ``dict`` that canonical JSON sorts at every depth (what every earlier version sends)."""
    if not len(schema):
        return EMPTY_OBJECT_SCHEMA
    if ordered:
        return schema if isinstance(schema, OrderedObject) else freeze_ordered(schema)
    plain: dict[str, Any] = thaw_json(schema)
    return plain
