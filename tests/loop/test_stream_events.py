"""A turn read as typed events (``Agent.stream``): the same events for every wire format, the log of an unread
run, a slow reader that never slows the step, an answer cut and sent again, and a reader that stops early."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig, TextBlock
from foldline.core.deltas import pieces_from_json, pieces_to_json
from foldline.core.events import AssistantChunk, AssistantMessage, LlmRetry, RequestDispatch, StepEnd, TurnEnd
from foldline.errors import ConfigError, RetriesExhausted
from foldline.loop import (
    Agent,
    AgentOptions,
    AttemptDiscarded,
    ReasoningDelta,
    StepFinished,
    StepStarted,
    StreamEvent,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallFinished,
    ToolCallResult,
    ToolCallStarted,
    Toolset,
    TurnFinished,
)
from foldline.loop.stream import DEFAULT_STREAM_BUFFER, EventBuffer
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator, EmulatorServer, Fault, FaultPlan
from foldline.providers.emulator.script import Conversation, Reply
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings
from foldline.replay import verify_events

FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002)

#: wire format → a streaming call config the emulator answers on it (deepseek reasons before it answers)
CONFIGS: dict[WireFormat, CallConfig] = {
    "anthropic": CallConfig("anthropic", "claude-sonnet-4-5", max_tokens=1024, stream=True),
    "openai": CallConfig("openai", "gpt-4.1", max_tokens=1024, stream=True),
    "openai-responses": CallConfig("openai", "gpt-5", max_tokens=1024, stream=True),
    "deepseek": CallConfig("deepseek", "deepseek-reasoner", max_tokens=1024, stream=True),
}


def toolset() -> Toolset:
    tools = Toolset()

    @tools.tool
    def lookup(topic: str, depth: int) -> str:
        """Look a topic up in the notes."""
        return f"notes on {topic} at depth {depth}"

    return tools


def agent_on(log: MemoryEventLog, wire: WireFormat, emulator: Emulator, settings: TransportSettings = FAST) -> Agent:
    options = AgentOptions(
        config=CONFIGS[wire],
        system="You are a test agent.",
        tools=toolset(),
        sender=RetryingSender(settings, sleep=_no_wait),
    )
    return Agent("s", log, emulated_provider(wire, emulator=emulator), options, clock=lambda: 0)


async def _no_wait(_: float) -> None:
    return None


async def read_all(agent: Agent, prompt: str, **kwargs: Any) -> list[StreamEvent]:
    return [event async for event in agent.stream(prompt, **kwargs)]


def logged(log: MemoryEventLog) -> list[tuple[int, bool, Any]]:
    """The log without its times (every event's seq, ignorable flag and data)."""
    return [(e.seq, e.ignorable, e.data) for e in log.read("s")]


@pytest.mark.parametrize("wire", sorted(CONFIGS))
def test_a_streamed_turn_yields_typed_events_and_logs_what_an_unread_turn_logs(wire: WireFormat) -> None:
    streamed_log, plain_log = MemoryEventLog(), MemoryEventLog()

    async def main() -> tuple[list[StreamEvent], str]:
        events = await read_all(agent_on(streamed_log, wire, Emulator()), "Find the notes.")
        plain = await agent_on(plain_log, wire, Emulator()).run_turn("Find the notes.")
        return events, plain.text

    events, plain_text = asyncio.run(main())
    assert logged(streamed_log) == logged(plain_log)  # the stream writes nothing of its own

    steps = [e for e in events if isinstance(e, StepStarted)]
    finished = [e for e in events if isinstance(e, StepFinished)]
    assert [(e.turn, e.step) for e in steps] == [(e.turn, e.step) for e in finished] == [(0, 0), (0, 1), (0, 2)]
    dispatches = [(e.data.digest, e.seq) for e in streamed_log.read("s") if isinstance(e.data, RequestDispatch)]
    assert [(f.digest, f.dispatch_seq) for f in finished] == dispatches
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.reason == "completed"
    assert events[-1].result.text == plain_text

    # per step: the text pieces make the logged answer's text, the argument pieces each call's arguments
    answers = [e.data for e in streamed_log.read("s") if isinstance(e.data, AssistantMessage)]
    bounds = [events.index(s) for s in steps] + [len(events)]
    for n, answer in enumerate(answers):
        window = events[bounds[n] : bounds[n + 1]]
        text = "".join(e.text for e in window if isinstance(e, TextDelta))
        assert text == "".join(b.text for b in answer.content if isinstance(b, TextBlock))
        started = {e.index: e for e in window if isinstance(e, ToolCallStarted)}
        calls = [e for e in window if isinstance(e, ToolCallFinished)]
        assert [s.name for s in started.values()] == [c.name for c in calls]
        for index, call in zip(started, calls, strict=True):
            pieces = "".join(e.text for e in window if isinstance(e, ToolArgumentsDelta) and e.index == index)
            assert pieces == call.arguments
            assert started[index].call_id == call.call_id
        results = [e for e in window if isinstance(e, ToolCallResult)]
        assert [r.call_id for r in results] == [c.call_id for c in calls]
        assert all(r.content and not r.is_error for r in results)
    reasoning = [e for e in events if isinstance(e, ReasoningDelta)]
    assert bool(reasoning) == (wire == "deepseek")  # only the reasoning model thinks aloud here
    assert verify_events("s", streamed_log.read("s")).status == "verified"


class LongAnswer:
    """Answers every request with one text of ``size`` characters (streamed one character an event)."""

    def __init__(self, size: int) -> None:
        self.text = "".join("abcdefghij"[i % 10] for i in range(size - 1)) + "."

    def reply(self, conversation: Conversation) -> Reply:
        return Reply(self.text)


def test_a_reader_that_sleeps_never_slows_the_step_and_still_gets_the_final_events() -> None:
    script = LongAnswer(2000)
    # over HTTP, 2,000 events; the unread run on a server of its own (one prompt cache each, as on one account)
    server, plain_server = (EmulatorServer(emulator=Emulator(script=script, piece_chars=1)).start() for _ in "ab")
    streamed_log, plain_log = MemoryEventLog(), MemoryEventLog()
    read: list[StreamEvent] = []
    ended_after: list[int] = []  # how many events the reader had taken when the step ended

    def over_http(log: MemoryEventLog, on: EmulatorServer) -> Agent:
        options = AgentOptions(config=CONFIGS["anthropic"], system="You are a test agent.", tools=toolset())
        return Agent("s", log, AnthropicProvider(None, None, on.url), options, clock=lambda: 0)

    async def main() -> None:
        agent, plain = over_http(streamed_log, server), over_http(plain_log, plain_server)
        agent.step_listeners.append(lambda _: ended_after.append(len(read)))
        async for event in agent.stream("Write at length."):
            read.append(event)
            await asyncio.sleep(0.01)
        await plain.run_turn("Write at length.")
        for done in (agent, plain):
            assert isinstance(done.provider, AnthropicProvider)
            await done.provider.aclose()

    try:
        asyncio.run(main())
    finally:
        server.close()
        plain_server.close()
    pieces = [e for e in read if isinstance(e, TextDelta)]
    assert "".join(p.text for p in pieces) == script.text  # every character, in order
    # 2,000 pieces at 10 ms each would have kept the reader 20 s behind; once the buffer was full the pieces
    # were merged, so it read far fewer of them — and the step had ended while it was still reading
    assert len(pieces) <= DEFAULT_STREAM_BUFFER + 200
    (at_step_end,) = ended_after
    assert at_step_end < len(read) - 100
    assert isinstance(read[-2], StepFinished)
    assert isinstance(read[-1], TurnFinished)
    assert read[-1].result.text == script.text
    assert logged(streamed_log) == logged(plain_log)


def test_the_buffer_merges_pieces_of_one_kind_past_its_bound_and_never_final_events() -> None:
    buffer = EventBuffer(4)
    buffer.push(StepStarted(0, 0))
    for piece in "abcdef":
        buffer.push(TextDelta(piece))
    buffer.push(ToolCallStarted(1, "c1", "lookup"))
    for piece in ('{"a"', ":1", "}"):
        buffer.push(ToolArgumentsDelta(1, piece))
    buffer.push(ToolArgumentsDelta(2, "{}"))
    buffer.push(StepFinished(0, 0, _usage(), "end_turn", "sha256:00", 3))
    buffer.close()

    async def drain() -> list[StreamEvent]:
        out: list[StreamEvent] = []
        while (event := await buffer.get()) is not None:
            out.append(event)
        return out

    assert asyncio.run(drain()) == [
        StepStarted(0, 0),
        TextDelta("a"),
        TextDelta("b"),
        TextDelta("cdef"),  # the bound was reached: merged into the piece before
        ToolCallStarted(1, "c1", "lookup"),
        ToolArgumentsDelta(1, '{"a":1}'),
        ToolArgumentsDelta(2, "{}"),  # another call's pieces are never merged into this one's
        StepFinished(0, 0, _usage(), "end_turn", "sha256:00", 3),
    ]
    assert buffer.merged == 5
    with pytest.raises(ConfigError, match="at least one event"):
        EventBuffer(0)


def _usage() -> Any:
    from foldline.core.content import Usage

    return Usage(1, 2, 0, 0)


def test_an_answer_cut_in_the_middle_is_discarded_sent_again_and_logged() -> None:
    log = MemoryEventLog()
    emulator = Emulator(faults=FaultPlan(by_index={0: Fault("reset-mid")}))

    async def main() -> list[StreamEvent]:
        agent = agent_on(log, "anthropic", emulator)
        first = await read_all(agent, "Find the notes.")
        second = await agent.run_turn("And again.")  # the next turn works
        assert second.reason == "completed"
        return first

    events = asyncio.run(main())
    discarded = [i for i, e in enumerate(events) if isinstance(e, AttemptDiscarded)]
    assert len(discarded) == 1
    cut = events[discarded[0]]
    assert isinstance(cut, AttemptDiscarded)
    assert (cut.turn, cut.step, cut.attempt) == (0, 0, 1)
    first_step_end = next(i for i, e in enumerate(events) if isinstance(e, StepFinished))
    after = "".join(e.text for e in events[discarded[0] : first_step_end] if isinstance(e, TextDelta))
    records = log.read("s")
    answer = next(e.data for e in records if isinstance(e.data, AssistantMessage))
    assert after == "".join(getattr(b, "text", "") for b in answer.content)
    ((retry, ignorable),) = [(e.data, e.ignorable) for e in records if isinstance(e.data, LlmRetry)]
    assert retry.received_bytes > 0
    assert retry.wait_ms is not None
    assert ignorable
    # what had arrived of the cut answer is logged with its retry: its events, under its attempt
    arrived = [(e.seq, e.ignorable, e.data) for e in records if isinstance(e.data, AssistantChunk)]
    assert arrived
    assert {(chunk.attempt, ignored) for _, ignored, chunk in arrived} == {(1, True)}
    retry_seq = next(e.seq for e in records if isinstance(e.data, LlmRetry))
    assert [seq for seq, _, _ in arrived] == list(range(retry_seq - len(arrived), retry_seq))
    assert sum(len(chunk.data.encode()) for _, _, chunk in arrived) < retry.received_bytes
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.reason == "completed"
    assert verify_events("s", records).status == "verified"


def test_retries_exhausted_on_cut_streams_end_the_turn_with_a_typed_failure_not_an_exception() -> None:
    log = MemoryEventLog()
    emulator = Emulator(faults=FaultPlan(by_index={i: Fault("reset-mid") for i in range(3)}))
    settings = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002, max_attempts=3)

    async def main() -> tuple[list[StreamEvent], str]:
        agent = agent_on(log, "anthropic", emulator, settings)
        events = await read_all(agent, "Find the notes.")
        after = await agent.run_turn("Try once more.")
        return events, after.reason

    events, next_reason = asyncio.run(main())
    finished = events[-1]
    assert isinstance(finished, TurnFinished)
    assert finished.result.reason == "error"
    assert isinstance(finished.result.failure, RetriesExhausted)
    assert finished.result.failure.attempts == 3
    assert [e.attempt for e in events if isinstance(e, AttemptDiscarded)] == [1, 2, 3]
    assert next_reason == "completed"
    records = log.read("s")
    assert [e.data.wait_ms is None for e in records if isinstance(e.data, LlmRetry)] == [False, False, True]
    first_end = next(e.data for e in records if isinstance(e.data, TurnEnd))
    assert first_end.reason == "error"
    assert any(isinstance(e.data, StepEnd) for e in records)
    assert verify_events("s", records).status == "verified"


def test_leaving_the_stream_early_cancels_the_turn_and_logs_it() -> None:
    log = MemoryEventLog()
    emulator = Emulator(script=LongAnswer(2000), piece_chars=1, event_delay_s=0.001)

    async def main() -> int:
        agent = agent_on(log, "anthropic", emulator)
        seen = 0
        async with agent.stream("Write at length.") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    seen += 1
                    if seen == 20:
                        break
        return seen

    assert asyncio.run(main()) == 20
    records = log.read("s")
    (answer,) = [e.data for e in records if isinstance(e.data, AssistantMessage)]
    assert answer.stop_reason == "interrupted"
    assert 0 < len("".join(getattr(b, "text", "") for b in answer.content)) < 2000
    assert isinstance(records[-1].data, TurnEnd)
    assert records[-1].data.reason == "aborted"


def test_breaking_out_of_a_plain_loop_cancels_the_turn_too() -> None:
    log = MemoryEventLog()
    emulator = Emulator(script=LongAnswer(2000), piece_chars=1, event_delay_s=0.001)

    async def main() -> None:
        agent = agent_on(log, "anthropic", emulator)
        async for event in agent.stream("Write at length."):
            if isinstance(event, TextDelta):
                break  # the stream is dropped here: the turn is cancelled
        for _ in range(500):  # the cancelled turn closes itself in the log
            records = log.read("s")
            if records and isinstance(records[-1].data, TurnEnd):
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    records = log.read("s")
    assert isinstance(records[-1].data, TurnEnd)
    assert records[-1].data.reason == "aborted"
    assert [e.data.stop_reason for e in records if isinstance(e.data, AssistantMessage)] == ["interrupted"]


def test_an_unstreamed_request_gives_the_same_events_without_pieces() -> None:
    log = MemoryEventLog()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-sonnet-4-5", max_tokens=1024),  # stream off
        system="You are a test agent.",
        tools=toolset(),
    )
    agent = Agent("s", log, emulated_provider("anthropic", emulator=Emulator()), options, clock=lambda: 0)
    events = asyncio.run(read_all(agent, "Find the notes."))
    kinds = [e.kind for e in events]
    assert not {"text-delta", "reasoning-delta", "tool-call-started", "tool-arguments-delta"} & set(kinds)
    assert kinds.count("step-started") == kinds.count("step-finished") == 3
    assert kinds.count("tool-call-finished") == kinds.count("tool-call-result") == 2
    assert kinds[-1] == "turn-finished"


def test_pieces_go_through_the_relay_json_unchanged_and_junk_is_left_out() -> None:
    pieces: list[Any] = [TextDelta("Hel"), ReasoningDelta("think"), ToolCallStarted(2, "c1", "lookup")]
    pieces.append(ToolArgumentsDelta(2, '{"topic":'))
    wire = json.loads(json.dumps(pieces_to_json(pieces)))
    assert pieces_from_json(wire) == pieces
    assert pieces_from_json([*wire, ["t"], ["x", "y"], ["a", "2", "z"], "t", []]) == pieces
    assert pieces_from_json({"t": "no"}) == []
