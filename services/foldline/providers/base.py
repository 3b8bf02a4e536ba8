"""The Provider port.

A provider adapter has two halves that the loop uses separately:

* a :class:`Serializer` — a pure, versioned function from a frozen request to the exact wire body
  bytes (resolving image attachments through the store, verifying them). ``foldline verify`` looks
  serializers up by ``(name, version)`` in :data:`SERIALIZERS`, so an old log replays with the code
  that wrote it;
* :meth:`Provider.send` — posts those bytes over an httpx transport and parses the answer into
  logged content and normalized usage.

The loop records ``sha256`` of the body in a ``request/dispatch`` event before calling ``send``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

from ..core.content import ContentBlock, Usage
from ..core.request import GenerateOptions
from ..ports.attachments import AttachmentStore

#: The normalized ``stop_reason`` vocabulary of :class:`ProviderResponse` (Anthropic's words; the
#: OpenAI adapter maps ``stop`` → ``end_turn``, ``tool_calls`` → ``tool_use``, ``length`` →
#: ``max_tokens``, ``content_filter`` → ``refusal``). Anything else arrives as ``other``.
STOP_REASONS: frozenset[str] = frozenset(
    {"end_turn", "tool_use", "max_tokens", "stop_sequence", "pause_turn", "refusal", "other"}
)

__all__ = [
    "SERIALIZERS",
    "STOP_REASONS",
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


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    """A parsed provider answer: the assistant content (text and tool-call blocks) and usage."""

    content: tuple[ContentBlock, ...]
    usage: Usage
    stop_reason: str


class Provider(abc.ABC):
    """Sends serialized bodies. Implementations take an ``httpx.AsyncBaseTransport``."""

    name: str
    serializer: Serializer

    @abc.abstractmethod
    async def send(self, body: bytes) -> ProviderResponse:
        """POST ``body`` exactly as given; raise :class:`~foldline.errors.ProviderError` on failure."""

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
