"""The pieces of an answer as it streams, the same for every API: what a caller shows while the model writes.

A stream assembler (:mod:`foldline.providers.streaming`) hands one of these to its sink for each piece of model
output it takes in, in the order the provider sent them. They are never logged (the assembled answer is) and
never model-visible; they are what :meth:`foldline.loop.Agent.stream` passes on to its caller.

``index`` of a tool call is the position the provider's stream gives it (Anthropic's content block index, a Chat
Completions ``tool_calls`` index, a Responses ``output_index``): a :class:`ToolCallStarted` and the
:class:`ToolArgumentsDelta` s that follow it share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["AnswerDelta", "ReasoningDelta", "TextDelta", "ToolArgumentsDelta", "ToolCallStarted"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the answer's text."""

    text: str
    kind: Literal["text-delta"] = "text-delta"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of the model's reasoning (Anthropic thinking, a reasoning summary, ``reasoning_content``)."""

    text: str
    kind: Literal["reasoning-delta"] = "reasoning-delta"


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The model began a tool call: its id (as the provider names it; empty when the stream gives none yet) and
    the tool's name."""

    index: int
    call_id: str
    name: str
    kind: Literal["tool-call-started"] = "tool-call-started"


@dataclass(frozen=True, slots=True)
class ToolArgumentsDelta:
    """A piece of a tool call's arguments (JSON text; the pieces of one call concatenate to its arguments)."""

    index: int
    text: str
    kind: Literal["tool-arguments-delta"] = "tool-arguments-delta"


AnswerDelta: TypeAlias = TextDelta | ReasoningDelta | ToolCallStarted | ToolArgumentsDelta
