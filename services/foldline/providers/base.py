"""The Provider port.

A provider adapter has two halves that the loop uses separately:

* a :class:`Serializer` — a pure, versioned function from a frozen request to the exact wire body
  bytes (resolving image attachments through the store, verifying them). ``foldline verify`` looks
  serializers up by ``(name, version)`` in :data:`SERIALIZERS`, so an old log replays with the code
  that wrote it;
* :meth:`Provider.send` — posts those bytes over an httpx transport, once, and parses the answer (read whole,
  or assembled from server-sent events when ``stream`` is true) into logged content, normalized usage and the
  provider's ids. One call is one attempt; :class:`~foldline.providers.retry.RetryingSender` makes the
  attempts, each with the same bytes.

A body is handed to ``send`` as one ``bytes`` object or as :class:`BodyParts`, consecutive byte strings whose
concatenation is the body: a session's incremental body cache
(:class:`~foldline.providers.framing.IncrementalBody`) keeps the unchanging start of a long body in blocks
that every later body shares, so no step copies the whole body into one fresh object just to hand it over.

The loop records ``sha256`` of the body in a ``request/dispatch`` event before calling ``send``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from ..core.content import ContentBlock, Usage
from ..core.request import GenerateOptions
from ..ports.attachments import AttachmentStore
from .streaming import AnswerProgress

#: The normalized ``stop_reason`` vocabulary of :class:`ProviderResponse` (Anthropic's words; the
#: OpenAI adapter maps ``stop`` → ``end_turn``, ``tool_calls`` → ``tool_use``, ``length`` →
#: ``max_tokens``, ``content_filter`` → ``refusal``). Anything else arrives as ``other``.
STOP_REASONS: frozenset[str] = frozenset(
    {
        "end_turn",
        "tool_use",
        "max_tokens",
        "stop_sequence",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
        "other",
    }
)

__all__ = [
    "SERIALIZERS",
    "STOP_REASONS",
    "Body",
    "BodyParts",
    "Provider",
    "ProviderResponse",
    "Serializer",
    "register_serializer",
    "serializer_for",
]


class Serializer(Protocol):
    """Pure request → bytes. Same request, same store contents, same version ⇒ same bytes."""

    name: str
    version: int

    def serialize(self, request: GenerateOptions, attachments: AttachmentStore | None) -> bytes: ...


class BodyParts:
    """A request body as consecutive byte strings: the body is their concatenation, ``len`` its length in
    bytes and ``bytes(parts)`` the body in one object (a copy: for whoever needs it contiguous). The parts
    are immutable, so one body may share them with another and a retry sends the same bytes again."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        self.parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __repr__(self) -> str:
        return f"BodyParts({len(self.parts)} parts, {self.size} bytes)"


#: What :meth:`Provider.send` posts: the body's bytes, whole or in parts.
Body: TypeAlias = bytes | BodyParts


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A parsed provider answer: the assistant content (text and tool-call blocks), usage, the stop reason,
    and the provider's names for it — the request id (from the response headers) and the message id."""

    content: tuple[ContentBlock, ...]
    usage: Usage
    stop_reason: str
    request_id: str | None = None
    message_id: str | None = None


class Provider(abc.ABC):
    """Sends serialized bodies. Implementations take an ``httpx.AsyncBaseTransport``."""

    name: str
    serializer: Serializer

    @abc.abstractmethod
    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        """POST ``body`` exactly as given (:class:`BodyParts`: their concatenation), once; raise
        :class:`~foldline.errors.ProviderError` on failure.

        ``stream``: the body asks for server-sent events (its header config says so); the answer is assembled
        from them. ``progress`` is updated as the answer arrives (bytes, request id, first token, the partial
        answer) so a caller that cancels can record what had arrived."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the transport."""


SERIALIZERS: dict[tuple[str, int], Serializer] = {}


def register_serializer(serializer: Serializer) -> Serializer:
    SERIALIZERS[(serializer.name, serializer.version)] = serializer
    return serializer


def serializer_for(name: str, version: int) -> Serializer:
    from ..errors import ReconstructionError

    try:
        return SERIALIZERS[(name, version)]
    except KeyError:
        known = ", ".join(f"{n}/v{v}" for n, v in sorted(SERIALIZERS))
        raise ReconstructionError(
            f"no serializer {name}/v{version} in this foldline build (known: {known}); "
            "replay with the foldline version that wrote the log"
        ) from None
