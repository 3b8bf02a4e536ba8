"""Small builders for valid session logs used across the tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from foldline.core import (
    AssistantMessage,
    CallConfig,
    Envelope,
    EventData,
    RequestHeader,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    make_header,
)
from foldline.core.header import EpochHeader, HeaderReason
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulator import Conversation, Reply, ScriptedCall, ToolCallPart
from foldline.providers.streaming import AnswerProgress

HEADER = make_header(CallConfig("anthropic", "claude-emulated", max_tokens=512), "You are a careful agent.")


def env(seq: int, data: EventData, time: int | None = None) -> Envelope:
    return Envelope(seq, 1_700_000_000_000 + seq if time is None else time, data)


class LogBuilder:
    """Appends valid events with consecutive seqs."""

    def __init__(self, start_seq: int = 0) -> None:
        self.events: list[Envelope] = []
        self.seq = start_seq
        self.calls = 0

    def add(self, data: EventData) -> Envelope:
        e = env(self.seq, data)
        self.events.append(e)
        self.seq += 1
        return e

    def header(self, header: EpochHeader = HEADER, reason: HeaderReason = "initial") -> LogBuilder:
        self.add(RequestHeader(header, reason))
        return self

    def user(self, text: str, source: str = "user") -> LogBuilder:
        self.add(UserMessage(f"u{self.seq}", (TextBlock(text),), source))
        return self

    def assistant(self, text: str) -> LogBuilder:
        self.add(AssistantMessage(f"a{self.seq}", (TextBlock(text),), Usage(10, 5, 0, 0), "end_turn"))
        return self

    def tool_round(self, turn: int, step: int, name: str = "read", result: str = "ok") -> LogBuilder:
        call_id = f"call-{self.calls}"
        self.calls += 1
        self.add(AssistantMessage(f"a{self.seq}", (ToolCallBlock(call_id, name, '{"path":"x"}'),), Usage(), "tool_use"))
        self.add(ToolCall(turn, step, call_id, name, '{"path":"x"}'))
        self.add(ToolResult(call_id, name, (TextBlock(result),)))
        return self

    def turn(self, turn: int, text: str, steps: int = 1) -> LogBuilder:
        self.add(TurnStart(turn))
        for step in range(steps):
            self.add(StepStart(turn, step))
            if step == 0:
                self.user(text)
            if step < steps - 1:
                self.tool_round(turn, step)
            else:
                self.assistant(f"answer to {text}")
            self.add(StepEnd(turn, step))
        self.add(TurnEnd(turn, "completed"))
        return self


def event_of_size(seq: int, size: int) -> Envelope:
    """A user/message whose canonical encoding is exactly ``size`` bytes."""
    from foldline.core.wire import encode_event

    empty = len(encode_event(env(seq, UserMessage(f"u{seq}", (TextBlock(""),)))))
    event = env(seq, UserMessage(f"u{seq}", (TextBlock("x" * (size - empty)),)))
    assert len(encode_event(event)) == size
    return event


def simple_log(turns: int = 2, steps: int = 2) -> list[Envelope]:
    b = LogBuilder().header()
    for t in range(turns):
        b.turn(t, f"question {t}", steps)
    return b.events


class CapturingProvider(Provider):
    """Wraps a real provider and keeps every body it was asked to send (loop requests and one-shots), byte for byte."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.serializer = inner.serializer
        self.bodies: list[bytes] = []

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        self.bodies.append(bytes(body))  # a body in parts is kept joined
        return await self.inner.send(body, stream=stream, progress=progress)

    async def aclose(self) -> None:
        await self.inner.aclose()


class PlanScript:
    """Per user turn: the planned rounds of calls (each round's calls in one answer), then a text answer. A round
    whose tools are not offered is skipped."""

    def __init__(self, rounds: Sequence[Sequence[tuple[str, Mapping[str, Any]]]]) -> None:
        self.rounds = rounds

    def reply(self, conversation: Conversation) -> Reply:
        done = 0
        for turn in reversed(conversation.turns):
            if turn.role == "user" and any(getattr(p, "text", None) for p in turn.parts):
                break  # the user's message: the rounds since are this turn's
            if turn.role == "assistant" and any(isinstance(p, ToolCallPart) for p in turn.parts):
                done += 1
        offered = {t.name for t in conversation.tools}
        while done < len(self.rounds):
            calls = tuple(ScriptedCall(n, a) for n, a in self.rounds[done] if n in offered)
            if calls:
                return Reply(f"round {done}", calls)
            done += 1
        return Reply("done")


class ThinkingPlan(PlanScript):
    """A :class:`PlanScript` that thinks before each answer when the request asks for thinking (a thinking API
    refuses a later request whose assistant turn lacks the reasoning it produced)."""

    def reply(self, conversation: Conversation) -> Reply:
        out = super().reply(conversation)
        return replace(out, reasoning="The plan says what to call.") if conversation.thinking else out


class Scripted:
    """Replies in order, one per request."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)

    def reply(self, conversation: Conversation) -> Reply:
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
