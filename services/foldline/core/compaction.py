"""Context pressure, pure: the token estimate, what to trim, what to compact, and the summarize input.

Everything here is a function of derived messages and surface nodes — values read from the log — so the
loop and ``foldline verify`` compute the same answers. Nothing here sends anything: the loop's pressure
module (``foldline.loop.pressure``) decides when to call these and logs what it did.

* :func:`estimate_tokens` — a deterministic estimate (4 bytes of text per token; an image costs
  ``ceil(width*height/750)``; 4 tokens of framing per message). It is a budget signal, not a bill.
* :func:`plan_trims` — old, large ``tool`` messages outside the recent window and the trimmed content
  that replaces each (same call id; text cut to a prefix plus a marker; images dropped with a count).
* :func:`plan_compaction` — the surface range ``0..end`` to summarize, cut just before a user or
  assistant entry (never between a tool call and its results) and keeping at least the recent window.
* :func:`summarize_request` — the summarize one-shot's input: one user message rendering the region as
  a transcript (images kept as image blocks, so they are resolved and verified like any other), under a
  fixed instruction. Not a loop request: the loop never marks it.
* :func:`summary_content` — the content of the replacing ``user/message`` for a summary text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from .content import (
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultPart,
)
from .header import CallConfig, EpochHeader
from .projection import Message
from .request import GenerateOptions, build_request
from .validation import SurfaceNode

__all__ = [
    "SUMMARIZE_PROMPTS",
    "SUMMARIZE_PROMPT_VERSION",
    "SUMMARIZE_SYSTEM",
    "SUMMARY_HEADING",
    "TRIM_MARKER",
    "Trim",
    "estimate_tokens",
    "message_tokens",
    "plan_compaction",
    "plan_trims",
    "SummarizePrompt",
    "recent_start",
    "summarize_prompt",
    "summarize_request",
    "summary_content",
    "trimmed_parts",
]

BYTES_PER_TOKEN = 4
IMAGE_PIXELS_PER_TOKEN = 750
MESSAGE_OVERHEAD_TOKENS = 4

SUMMARY_HEADING = "[Summary of the earlier conversation]"
TRIM_MARKER = "[trimmed:"
SUMMARIZE_SYSTEM = (
    "You compress the earlier part of an agent conversation so the agent can continue without it. "
    "Write a faithful summary: the user's requests, the facts established (quote tool results that matter "
    "exactly, with their call ids), decisions taken and open questions. Do not add anything that is not "
    "in the transcript. Images in the transcript are part of it; describe what matters about them."
)
SUMMARIZE_INSTRUCTION = "Summarize the conversation above as instructed."


@dataclass(frozen=True, slots=True)
class SummarizePrompt:
    """One version of the summarize one-shot's wording: its system prompt and the transcript's closing line."""

    system: str
    instruction: str


#: Every summarize prompt version, by the number ``compaction/summary.promptVersion`` logs (absent: 1). Changing
#: the wording or the transcript syntax is a new version here; old versions stay, so old logs keep verifying.
SUMMARIZE_PROMPTS: dict[int, SummarizePrompt] = {1: SummarizePrompt(SUMMARIZE_SYSTEM, SUMMARIZE_INSTRUCTION)}
SUMMARIZE_PROMPT_VERSION = 1


def _text_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def _block_tokens(block: ContentBlock) -> int:
    match block:
        case TextBlock(text=text):
            return _text_tokens(text)
        case ImageBlock(image=ref):
            return max(1, -(-(ref.width * ref.height) // IMAGE_PIXELS_PER_TOKEN))
        case ToolCallBlock(name=name, arguments=arguments):
            return _text_tokens(name) + _text_tokens(arguments) + 2
        case ToolResultBlock(content=parts):
            return 2 + sum(_block_tokens(p) for p in parts)
        case ReasoningBlock(text=text, signature=signature):
            return _text_tokens(text) + _text_tokens(signature or "")
        case RedactedReasoningBlock(data=data):
            return _text_tokens(data)
        case EncryptedReasoningBlock(summary=summary, encrypted_content=encrypted):
            return sum(_text_tokens(s) for s in summary) + _text_tokens(encrypted)
        case _:
            assert_never(block)


def message_tokens(message: Message) -> int:
    return MESSAGE_OVERHEAD_TOKENS + sum(_block_tokens(b) for b in message.content)


def estimate_tokens(messages: Sequence[Message]) -> int:
    """The deterministic token estimate of a message list."""
    return sum(message_tokens(m) for m in messages)


def recent_start(messages: Sequence[Message], keep_recent_tokens: int) -> int:
    """The first position of the recent window: the shortest suffix holding ``keep_recent_tokens``.

    The window always holds at least the last message.
    """
    total = 0
    for i in range(len(messages) - 1, -1, -1):
        total += message_tokens(messages[i])
        if total >= keep_recent_tokens:
            return i
    return 0


# ---------------------------------------------------------------------------- trims


@dataclass(frozen=True, slots=True)
class Trim:
    """Replace the tool result at surface ``position`` (event ``seq``) with ``parts``."""

    position: int
    seq: int
    call_id: str
    name: str
    is_error: bool
    parts: tuple[ToolResultPart, ...]
    saved_tokens: int


def _is_trimmed(parts: Sequence[ToolResultPart]) -> bool:
    return any(isinstance(p, TextBlock) and TRIM_MARKER in p.text for p in parts)


def trimmed_parts(parts: Sequence[ToolResultPart], keep_chars: int) -> tuple[ToolResultPart, ...]:
    """A tool result's content cut to its first ``keep_chars`` characters of text plus a marker."""
    texts: list[str] = []
    images = 0
    for part in parts:
        match part:
            case TextBlock(text=piece):
                texts.append(piece)
            case ImageBlock():
                images += 1
            case _:
                assert_never(part)
    text = "\n".join(texts)
    kept = text[:keep_chars]
    removed = len(text) - len(kept)
    note = f"{TRIM_MARKER} {removed} of {len(text)} characters"
    if images:
        note += f" and {images} image(s)"
    return (TextBlock(f"{kept}\n{note} removed to save context]"),)


def plan_trims(
    messages: Sequence[Message],
    surface: Sequence[SurfaceNode],
    *,
    keep_recent_tokens: int,
    trim_over_tokens: int,
    keep_chars: int,
) -> list[Trim]:
    """Tool results before the recent window larger than ``trim_over_tokens``, oldest first."""
    if len(messages) != len(surface):
        raise ValueError(f"{len(messages)} messages but {len(surface)} surface nodes; pass the same session's")
    trims: list[Trim] = []
    for pos in range(recent_start(messages, keep_recent_tokens)):
        message, node = messages[pos], surface[pos]
        if message.role != "tool" or node.call_id is None or node.name is None:
            continue
        block = message.content[0]
        assert isinstance(block, ToolResultBlock)
        before = message_tokens(message)
        if before <= trim_over_tokens or _is_trimmed(block.content):
            continue
        parts = trimmed_parts(block.content, keep_chars)
        after = message_tokens(Message("tool", (ToolResultBlock(block.tool_call_id, parts, block.is_error),)))
        if after >= before:
            continue
        trims.append(Trim(pos, node.seq, node.call_id, node.name, node.is_error, parts, before - after))
    return trims


# ---------------------------------------------------------------------------- compaction


def plan_compaction(
    messages: Sequence[Message], *, keep_recent_tokens: int, min_region_tokens: int = 0
) -> tuple[int, int] | None:
    """The inclusive surface range ``(0, end)`` to summarize, or None when nothing is worth compacting.

    The kept part starts at a user or assistant entry (a tool result stays with its call), holds at least
    ``keep_recent_tokens``, and the range covers at least two entries estimated above
    ``min_region_tokens`` (a region no larger than its summary could be is not worth a cache miss).
    """
    cut = recent_start(messages, keep_recent_tokens)
    while cut > 0 and messages[cut].role == "tool":
        cut -= 1
    if cut < 2 or estimate_tokens(messages[:cut]) <= min_region_tokens:
        return None
    return (0, cut - 1)


def _transcript(messages: Sequence[Message], instruction: str) -> list[ContentBlock]:
    out: list[ContentBlock] = []
    lines: list[str] = []

    def flush() -> None:
        if lines:
            out.append(TextBlock("\n".join(lines)))
            lines.clear()

    for message in messages:
        for block in message.content:
            match block:
                case TextBlock(text=text):
                    lines.append(f"{message.role}: {text}")
                case ImageBlock():
                    lines.append(f"{message.role}: [image]")
                    flush()
                    out.append(block)
                case ToolCallBlock(id=call_id, name=name, arguments=arguments):
                    lines.append(f"{message.role} calls {name} {arguments} (call {call_id})")
                case ToolResultBlock(tool_call_id=call_id, content=parts, is_error=is_error):
                    kind = "error" if is_error else "result"
                    lines.append(f"tool {kind} for call {call_id}:")
                    for part in parts:
                        match part:
                            case TextBlock(text=piece):
                                lines.append(piece)
                            case ImageBlock():
                                lines.append("[image]")
                                flush()
                                out.append(part)
                            case _:
                                assert_never(part)
                case ReasoningBlock() | RedactedReasoningBlock() | EncryptedReasoningBlock():
                    pass  # reasoning is not part of the transcript (every prompt version so far)
                case _:
                    assert_never(block)
    lines.append("")
    lines.append(instruction)
    flush()
    return out


def summarize_prompt(version: int) -> SummarizePrompt:
    """The summarize prompt of ``version``; an unknown version is a ValueError naming the known ones."""
    prompt = SUMMARIZE_PROMPTS.get(version)
    if prompt is None:
        raise ValueError(
            f"summarize prompt version {version} is unknown to this build (known: {sorted(SUMMARIZE_PROMPTS)}); "
            "verify with the foldline version that wrote the log"
        )
    return prompt


def summarize_request(
    region: Sequence[Message], config: CallConfig, version: int = SUMMARIZE_PROMPT_VERSION
) -> GenerateOptions:
    """The summarize one-shot for a region of derived messages (deterministic; never a loop request)."""
    if not region:
        raise ValueError("a compaction region must hold at least one message")
    prompt = summarize_prompt(version)
    transcript = tuple(_transcript(region, prompt.instruction))
    return build_request((Message("user", transcript),), EpochHeader(config, prompt.system, None))


def summary_content(summary: str) -> tuple[ContentBlock, ...]:
    """The content of the ``user/message`` that replaces a compacted range."""
    return (TextBlock(f"{SUMMARY_HEADING}\n{summary}"),)
