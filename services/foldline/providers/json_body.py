"""The plumbing every wire serializer shares: a canonical JSON body with a top-level message list.

A :class:`JsonBodySerializer` says what goes around the messages (:meth:`~JsonBodySerializer.top_level`,
:meth:`~JsonBodySerializer.lead_messages`) and how a run of session messages becomes wire messages
(:meth:`~JsonBodySerializer.wire_messages`); from those it writes the body as a frame plus one canonical
chunk per wire message — the :class:`~foldline.providers.framing.FramedSerializer` protocol that
:class:`~foldline.providers.framing.IncrementalBody` reuses across a session's steps. ``serialize`` always
equals ``canonical_json(body(...))``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

from ..core.codec import canonical_json
from ..core.projection import Message
from ..core.request import GenerateOptions
from ..ports.attachments import AttachmentStore
from .framing import assemble, split_frame

__all__ = ["JsonBodySerializer"]


class JsonBodySerializer(abc.ABC):
    """GenerateOptions → exact body bytes, written as frame + chunks. Stateless; one instance serves everyone."""

    name: str
    version: int
    #: The top-level key of the wire message list (``input`` for the Responses API).
    list_key: ClassVar[str] = "messages"

    @abc.abstractmethod
    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        """Every top-level key of the body except ``messages``."""

    def lead_messages(self, request: GenerateOptions) -> list[dict[str, Any]]:
        """Wire messages that precede the session's messages (none unless the API puts the system prompt there)."""
        return []

    @abc.abstractmethod
    def wire_messages(
        self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None
    ) -> list[dict[str, Any]]:
        """The wire messages of ``messages``, which begins at index ``start`` of the request's messages."""

    @abc.abstractmethod
    def boundary(self, prev: Message, nxt: Message) -> bool:
        """True if no wire message spans the gap between ``prev`` and ``nxt``."""

    def body(self, request: GenerateOptions, attachments: AttachmentStore | None) -> dict[str, Any]:
        """The request body as plain JSON values."""
        out = self.top_level(request)
        out[self.list_key] = [*self.lead_messages(request), *self.wire_messages(request.messages, 0, attachments)]
        return out

    def frame(self, request: GenerateOptions) -> tuple[bytes, bytes, tuple[bytes, ...]]:
        out = self.top_level(request)
        out[self.list_key] = []
        head, tail = split_frame(canonical_json(out), self.list_key)
        return head, tail, tuple(canonical_json(m) for m in self.lead_messages(request))

    def wire_chunks(self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None) -> list[bytes]:
        return [canonical_json(m) for m in self.wire_messages(messages, start, attachments)]

    def serialize(self, request: GenerateOptions, attachments: AttachmentStore | None) -> bytes:
        head, tail, lead = self.frame(request)
        return assemble(head, [*lead, *self.wire_chunks(request.messages, 0, attachments)], tail)
