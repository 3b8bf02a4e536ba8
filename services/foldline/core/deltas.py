"""The pieces of an answer as it streams, the same for every API: what a caller shows while the model writes.

A stream assembler (:mod:`foldline.providers.streaming`) hands one of these to its sink for each piece of model
output it takes in, in the order the provider sent them. They are never logged (the assembled answer is) and
never model-visible; they are what :meth:`foldline.loop.Agent.stream` passes on to its caller, and what a
dispatcher relays to the loop that owns the session (:func:`pieces_to_json`, :func:`pieces_from_json`: a compact
JSON list, ``["t", text]``, ``["r", text]``, ``["c", index, call id, name]``, ``["a", index, text]``).

``index`` of a tool call is the position the provider's stream gives it (Anthropic's content block index, a Chat
Completions ``tool_calls`` index, a Responses ``output_index``): a :class:`ToolCallStarted` and the
:class:`ToolArgumentsDelta` s that follow it share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, assert_never

__all__ = [
    "AnswerDelta",
    "ReasoningDelta",
    "TextDelta",
    "ToolArgumentsDelta",
    "ToolCallStarted",
    "pieces_from_json",
    "pieces_to_json",
]


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


def pieces_to_json(deltas: list[AnswerDelta]) -> list[list[Any]]:
    """The deltas as the compact JSON a relay carries (see the module docstring)."""
    out: list[list[Any]] = []
    for d in deltas:
        match d:
            case TextDelta():
                out.append(["t", d.text])
            case ReasoningDelta():
                out.append(["r", d.text])
            case ToolCallStarted():
                out.append(["c", d.index, d.call_id, d.name])
            case ToolArgumentsDelta():
                out.append(["a", d.index, d.text])
            case _:
                assert_never(d)
    return out


def pieces_from_json(value: Any) -> list[AnswerDelta]:
    """Deltas back from :func:`pieces_to_json`'s JSON; what is not that shape is left out (a relay is best effort:
    it may lose pieces, never invent them)."""
    out: list[AnswerDelta] = []
    if not isinstance(value, list):
        return out
    for item in value:
        if not isinstance(item, list) or not item:
            continue
        tag, rest = item[0], item[1:]
        if tag in ("t", "r") and len(rest) == 1 and isinstance(rest[0], str):
            out.append(TextDelta(rest[0]) if tag == "t" else ReasoningDelta(rest[0]))
        elif tag == "c" and len(rest) == 3 and isinstance(rest[0], int) and all(isinstance(x, str) for x in rest[1:]):
            out.append(ToolCallStarted(rest[0], rest[1], rest[2]))
        elif tag == "a" and len(rest) == 2 and isinstance(rest[0], int) and isinstance(rest[1], str):
            out.append(ToolArgumentsDelta(rest[0], rest[1]))
    return out
