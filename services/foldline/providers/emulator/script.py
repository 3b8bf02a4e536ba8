"""What a script sees and answers: the parsed conversation, format-neutral, and the default tool-loop script.

Both wire formats parse into one :class:`Conversation` of :class:`Turn` s made of the :data:`Part` union, so a
:class:`Script` never knows which API it answers. Its :class:`Reply` (optional text, then tool calls) is turned
into the wire answer by :mod:`.answer` and the API's module. The package's ``__all__`` lists these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeAlias

Api: TypeAlias = Literal["anthropic", "openai", "openai-responses", "deepseek"]
Role: TypeAlias = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    media_type: str
    digest: str  # sha256:<hex> of the image bytes
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    id: str
    name: str
    arguments: Any  # the parsed JSON arguments (OpenAI: the raw string when it is not JSON)


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    tool_call_id: str
    content: tuple[TextPart | ImagePart, ...]
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Reasoning the model produced earlier and the request carries back (already checked by the parser):
    Anthropic ``thinking`` / ``redacted_thinking`` (``text`` empty), a Responses reasoning item, a
    ``reasoning_content``."""

    text: str


Part: TypeAlias = TextPart | ImagePart | ToolCallPart | ToolResultPart | ReasoningPart


@dataclass(frozen=True, slots=True)
class Turn:
    """One wire message, format-neutral. OpenAI tool messages are turns of role ``tool``."""

    role: Role
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A parsed request. ``prompt_digest`` is the hex sha256 of its whole token stream (a stable seed)."""

    api: Api
    model: str
    system: str | None
    tools: tuple[ToolDef, ...]
    turns: tuple[Turn, ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    prompt_digest: str
    thinking: bool = False  # the request asks this model to reason before it answers


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    name: str
    arguments: Mapping[str, Any]


#: How a scripted answer may end other than by itself: a refusal, a paused turn (Anthropic's long-running
#: server tools), or a full context window.
StopOverride: TypeAlias = Literal["refusal", "pause_turn", "model_context_window_exceeded"]


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model answers: optional reasoning (only when the request asks for thinking), optional text, then
    tool calls (in that order on the wire); ``stop`` ends it with that stop reason instead of ``end_turn`` /
    ``tool_use`` (a refusal drops the tool calls)."""

    text: str | None = None
    tool_calls: tuple[ScriptedCall, ...] = ()
    reasoning: str | None = None
    stop: StopOverride | None = None


class Script(Protocol):
    """Decides the answer from the parsed conversation. Must be deterministic."""

    def reply(self, conversation: Conversation) -> Reply: ...


class ToolLoopScript:
    """The default script: for every user turn, ``tool_steps`` rounds of tool calls, then a text answer.

    A round is an assistant message with tool calls since the last assistant message without any. Each
    round calls ``calls_per_step`` tools, chosen and given arguments from the sha256 of the prompt (every
    property of the tool's schema gets a value of its type), so the same conversation always gets the same
    answer and different conversations get different ones. With no tools it answers right away.
    """

    def __init__(self, tool_steps: int = 2, calls_per_step: int = 1) -> None:
        if tool_steps < 0 or calls_per_step < 1:
            raise ValueError("tool_steps must be >= 0 and calls_per_step >= 1")
        self.tool_steps = tool_steps
        self.calls_per_step = calls_per_step

    def reply(self, conversation: Conversation) -> Reply:
        seed = bytes.fromhex(conversation.prompt_digest)
        rounds = 0
        for turn in reversed(conversation.turns):
            if turn.role != "assistant":
                continue
            if any(isinstance(p, ToolCallPart) for p in turn.parts):
                rounds += 1
            else:
                break
        if conversation.tools and rounds < self.tool_steps:
            calls = []
            for k in range(self.calls_per_step):
                h = hashlib.sha256(seed + k.to_bytes(2, "big")).digest()
                tool = conversation.tools[h[0] % len(conversation.tools)]
                calls.append(ScriptedCall(tool.name, scripted_arguments(tool.input_schema, h)))
            names = ", ".join(c.name for c in calls)
            thought = f"Round {rounds + 1}: the notes are not in context yet, so I call {names}." * 2
            return Reply(
                f"Step {rounds + 1} of {self.tool_steps}: calling {names}.",
                tuple(calls),
                thought if conversation.thinking else None,
            )
        question = _last_user_text(conversation.turns)
        words = " ".join(_WORDS[b % len(_WORDS)] for b in seed[:8])
        thought = f"I have {rounds} tool result round(s); they are enough to answer {question[:40]!r}."
        return Reply(
            f"Answer to {question[:60]!r} after {rounds} tool round(s): {words}.",
            reasoning=thought if conversation.thinking else None,
        )


_WORDS: Final = (
    "alpha", "bravo", "cache", "delta", "event", "fold", "graph", "header",
    "index", "join", "kafka", "log", "merge", "node", "offset", "prefix",
)  # fmt: skip


def _last_user_text(turns: Sequence[Turn]) -> str:
    for turn in reversed(turns):
        if turn.role == "user":
            texts = [p.text for p in turn.parts if isinstance(p, TextPart)]
            if texts:
                return texts[-1]
    return ""


def scripted_arguments(schema: Mapping[str, Any], seed: bytes) -> dict[str, Any]:
    """Deterministic arguments for a JSON schema: one value per property, by its declared type."""
    out: dict[str, Any] = {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return out
    for name in sorted(properties):
        spec = properties[name]
        h = hashlib.sha256(seed + name.encode("utf-8")).digest()
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        enum = spec.get("enum") if isinstance(spec, Mapping) else None
        if isinstance(enum, Sequence) and not isinstance(enum, str) and enum:
            out[name] = enum[h[0] % len(enum)]
        elif kind == "string":
            out[name] = f"{name}-{h.hex()[:8]}"
        elif kind == "integer":
            out[name] = h[0] % 100
        elif kind == "number":
            out[name] = (h[0] % 100) / 4
        elif kind == "boolean":
            out[name] = h[0] % 2 == 0
        elif kind == "array":
            out[name] = []
        elif kind == "object":
            out[name] = {}
    return out
