"""The provider-neutral request: derived messages plus the folded header, deeply immutable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .header import CallConfig, EpochHeader, ToolSpec
from .projection import Message, MessageSequence
from .wire import block_to_json, header_to_json

__all__ = ["GenerateOptions", "build_request", "request_to_json"]


@dataclass(frozen=True, slots=True, weakref_slot=True, eq=False)
class GenerateOptions:
    """What a provider adapter serializes. Every field is frozen; assigning anything raises."""

    config: CallConfig
    system: str | None
    tools: tuple[ToolSpec, ...] | None
    messages: tuple[Message, ...] | MessageSequence

    @property
    def header(self) -> EpochHeader:
        return EpochHeader(self.config, self.system, self.tools)

    def same_as(self, other: GenerateOptions) -> bool:
        """Value equality of everything a provider sees."""
        return self.header == other.header and tuple(self.messages) == tuple(other.messages)


def build_request(messages: Sequence[Message], header: EpochHeader) -> GenerateOptions:
    """Build the request of a step from its derived messages and folded header."""
    frozen_messages = messages if isinstance(messages, MessageSequence | tuple) else tuple(messages)
    return GenerateOptions(header.config, header.system, header.tools, frozen_messages)


def request_to_json(req: GenerateOptions) -> dict[str, Any]:
    """A provider-neutral JSON view of a request (used for diffs and inspection)."""
    out = header_to_json(req.header)
    out["messages"] = [{"role": m.role, "content": [block_to_json(b) for b in m.content]} for m in req.messages]
    return out
