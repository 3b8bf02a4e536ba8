"""The model's answer, format-neutral: the script's reply checked against the tools and cut like a model's.

A stop sequence in the text ends the answer there (its tool calls are dropped); an answer over
``max_tokens`` is cut to the text that fits. When the request asks for thinking, the script's reasoning comes
first (kept whole when the answer is cut: it was produced before the text). Each API's module writes the
:class:`Answer` in its wire form.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, TypeAlias

from .checks import RequestRejected
from .prompt import Prompt
from .script import ReasoningPart, Script, TextPart, ToolCallPart
from .structured import answer_text
from .tokens import BYTES_PER_TOKEN, output_tokens

__all__ = ["Answer", "AnswerPart", "StopReason", "answer"]

StopReason: TypeAlias = Literal[
    "end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal", "pause_turn", "model_context_window_exceeded"
]
AnswerPart: TypeAlias = TextPart | ToolCallPart | ReasoningPart


@dataclass(frozen=True, slots=True)
class Answer:
    """What the model says. Tool calls carry no id yet: ids derive from ``ids``, the hex of the prompt digest."""

    content: tuple[AnswerPart, ...]
    output_tokens: int
    stop_reason: StopReason
    stop_sequence: str | None
    ids: str

    def message_id(self, prefix: str) -> str:
        return f"{prefix}{self.ids[20:44]}"

    def call_id(self, prefix: str, index: int) -> str:
        return f"{prefix}{self.ids[:20]}{index:02d}"


def answer(script: Script, prompt: Prompt) -> Answer:
    """Ask the script and shape its reply; a call to a tool the request does not offer is a 500."""
    conversation = prompt.conversation()
    reply = script.reply(conversation)
    names = {t.name for t in prompt.tools}
    for call in reply.tool_calls:
        if call.name not in names:
            raise RequestRejected(500, f"script called unknown tool {call.name!r}", "api_error")
    text = reply.text
    stop_reason: StopReason = reply.stop or ("tool_use" if reply.tool_calls else "end_turn")
    stop_sequence = None
    calls = () if reply.stop == "refusal" else reply.tool_calls
    if text is not None:
        hits = [(text.find(s), s) for s in prompt.stop if s and s in text]
        if hits:
            at, stop_sequence = min(hits)
            text, calls, stop_reason = text[:at], (), "stop_sequence"
    if prompt.output is not None and text is not None and not calls and reply.stop is None:
        text = answer_text(prompt.output, text, bytes.fromhex(conversation.prompt_digest))
    thought: list[AnswerPart] = [ReasoningPart(reply.reasoning)] if reply.reasoning and prompt.thinking else []
    parts: list[AnswerPart] = [*thought, *([TextPart(text)] if text else [])]
    parts.extend(ToolCallPart("", c.name, dict(c.arguments)) for c in calls)
    output = sum(output_tokens(p) for p in parts)
    if prompt.max_tokens is not None and output > prompt.max_tokens:
        cut = (text or "")[: prompt.max_tokens * BYTES_PER_TOKEN // 2]
        parts = [*thought, *([TextPart(cut)] if cut else [])]
        output = min(prompt.max_tokens, sum(output_tokens(p) for p in parts))
        stop_reason, stop_sequence = "max_tokens", None
    ids = hashlib.sha256(b"ids" + bytes.fromhex(conversation.prompt_digest)).hexdigest()
    return Answer(tuple(parts), output, stop_reason, stop_sequence, ids)
