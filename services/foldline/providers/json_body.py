"""The plumbing every wire serializer shares: a canonical JSON body with a top-level message list.

A :class:`JsonBodySerializer` says what goes around the messages (:meth:`~JsonBodySerializer.top_level`,
:meth:`~JsonBodySerializer.lead_messages`) and how a run of session messages becomes wire messages
(:meth:`~JsonBodySerializer.wire_messages`); from those it writes the body as a frame plus one canonical
chunk per wire message — the :class:`~foldline.providers.framing.FramedSerializer` protocol that
:class:`~foldline.providers.framing.IncrementalBody` reuses across a session's steps. ``serialize`` is
``canonical_json(body(...))``, which equals head + the comma-joined chunks + tail.

Streaming is the same for every API: a version that can ask for a streamed answer names the top-level keys
that do (:attr:`JsonBodySerializer.stream_fields`) and writes them when the logged ``config.stream`` is true;
a version without them predates streaming and refuses such a request (docs/FORMAT.md §9.7).

Key order is too: a version with :attr:`JsonBodySerializer.ordered_schemas` sends each tool's input schema in its
author's order; every earlier version sorts it like the rest of the body (docs/FORMAT.md §9.8).

And structured output: a version with :attr:`JsonBodySerializer.structured_output` writes the logged
``config.outputSchema`` with its API's native field (:meth:`JsonBodySerializer.output_fields`); a version without
it predates structured output and refuses such a request (docs/FORMAT.md §9.10).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..core.codec import canonical_json
from ..core.projection import Message
from ..core.request import GenerateOptions
from ..errors import ProviderError
from ..ports.attachments import AttachmentStore
from .framing import split_frame

__all__ = ["JsonBodySerializer"]


class JsonBodySerializer(abc.ABC):
    """GenerateOptions → exact body bytes, written as frame + chunks. Stateless; one instance serves everyone."""

    name: str
    version: int
    #: The top-level key of the wire message list (``input`` for the Responses API).
    list_key: ClassVar[str] = "messages"
    #: The top-level keys that ask for a streamed answer (None: this version predates streaming).
    stream_fields: ClassVar[Mapping[str, Any] | None] = None
    #: Whether tool schemas go out in their author's key order (False: sorted, the versions before §9.8).
    ordered_schemas: ClassVar[bool] = False
    #: Whether this version writes ``config.outputSchema`` (False: it predates structured output and refuses it).
    structured_output: ClassVar[bool] = False

    @abc.abstractmethod
    def top_level(self, request: GenerateOptions) -> dict[str, Any]:
        """Every top-level key of the body except ``messages``."""

    def output_fields(self, out: dict[str, Any], name: str, schema: Mapping[str, Any]) -> None:
        """Write the output schema into the top-level keys ``out`` (a version with :attr:`structured_output`)."""
        raise NotImplementedError  # pragma: no cover - every version that sets structured_output overrides it

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

    def _top(self, request: GenerateOptions) -> dict[str, Any]:
        """:meth:`top_level` plus, when the config streams, :attr:`stream_fields` (or the refusal)."""
        out = self.top_level(request)
        if request.config.stream:
            if self.stream_fields is None:
                raise ProviderError(
                    f"serializer {self.name}/v{self.version} predates streaming and cannot write a body that "
                    "streams; send with the adapter's default serializer, which can"
                )
            out.update(self.stream_fields)
        config = request.config
        if config.output_schema is not None:
            if not self.structured_output:
                raise ProviderError(
                    f"serializer {self.name}/v{self.version} predates structured output and cannot write a body "
                    "with an output schema; send with the adapter's default serializer, which can"
                )
            assert config.output_name is not None  # the config holds both or neither
            self.output_fields(out, config.output_name, config.output_schema)
        return out

    def body(self, request: GenerateOptions, attachments: AttachmentStore | None) -> dict[str, Any]:
        """The request body as plain JSON values."""
        out = self._top(request)
        out[self.list_key] = [*self.lead_messages(request), *self.wire_messages(request.messages, 0, attachments)]
        return out

    def frame(self, request: GenerateOptions) -> tuple[bytes, bytes, tuple[bytes, ...]]:
        out = self._top(request)
        out[self.list_key] = []
        head, tail = split_frame(canonical_json(out), self.list_key)
        return head, tail, tuple(canonical_json(m) for m in self.lead_messages(request))

    def wire_bytes(self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None) -> bytes:
        """The wire messages' canonical bytes joined by commas, encoded in one pass: the canonical JSON of their list
        without its brackets (an encoder call per message would allocate and free a buffer for each)."""
        return canonical_json(self.wire_messages(messages, start, attachments))[1:-1]

    def serialize(self, request: GenerateOptions, attachments: AttachmentStore | None) -> bytes:
        """The body's canonical JSON in one encoder pass: the same bytes as the frame with the message chunks
        between head and tail (:class:`~foldline.providers.framing.IncrementalBody` relies on it)."""
        return canonical_json(self.body(request, attachments))
