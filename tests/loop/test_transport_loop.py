"""The loop's transport: streamed steps, retries in the log, cancellation mid-stream, stop reasons, bad streams."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core import CallConfig, TextBlock, ToolCallBlock
from foldline.core.events import (
    AssistantChunk,
    AssistantMessage,
    Envelope,
    LlmRetry,
    RequestDispatch,
    StepEnd,
    ToolCall,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from foldline.core.wire import encode_event
from foldline.errors import ProviderStreamError, RetriesExhausted
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.agent import CONTEXT_OVERFLOW_FIX, REFUSAL_RESET_TEXT
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulator import (
    Emulator,
    EmulatorServer,
    EmulatorTransport,
    Fault,
    FaultPlan,
    Reply,
    ScriptedCall,
    ToolLoopScript,
)
from foldline.providers.openai import OpenAIProvider
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings
from foldline.replay.verify import verify_events
from tests.factories import Scripted

SYSTEM = "You are a test agent. " * 300
FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002)


class RecordingToolset(Toolset):
    """A toolset that remembers the arguments its tools ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []


def tools() -> RecordingToolset:
    toolset = RecordingToolset()

    @toolset.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        toolset.ran.append(text)
        return text

    return toolset


def agent_for(
    emulator: Emulator,
    *,
    wire: str = "anthropic",
    stream: bool = True,
    log: MemoryEventLog | None = None,
    settings: TransportSettings = FAST,
    url: str | None = None,
    **config: Any,
) -> tuple[Agent, MemoryEventLog]:
    log = log if log is not None else MemoryEventLog()
    transport = None if url is not None else EmulatorTransport(emulator)
    cls = AnthropicProvider if wire == "anthropic" else OpenAIProvider
    provider = cls(transport, None, url or "http://emulator.invalid", settings=settings)
    options = AgentOptions(
        config=CallConfig(wire, "m", max_tokens=config.pop("max_tokens", 256), stream=stream, **config),
        system=SYSTEM,
        tools=tools(),
        sender=RetryingSender(settings, rng=random.Random(0)),
    )
    return Agent("s", log, provider, options), log


def of(events: Sequence[Envelope], kind: type[Any]) -> list[Any]:
    return [e.data for e in events if isinstance(e.data, kind)]


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_a_streamed_turn_equals_the_unstreamed_one_and_verifies(wire: str) -> None:
    logs = []
    for stream in (False, True):
        agent, log = agent_for(Emulator(ToolLoopScript(tool_steps=2)), wire=wire, stream=stream)
        result = asyncio.run(agent.run_turn("Please work."))
        assert result.reason == "completed"
        assert len(result.steps) == 3
        logs.append(log.read("s"))
        assert verify_events("s", logs[-1]).ok
    plain, streamed = (
        [(a.content, a.usage, a.stop_reason, a.provider_message_id) for a in of(x, AssistantMessage)] for x in logs
    )
    assert plain == streamed
    assert all(a.provider_request_id for a in of(logs[1], AssistantMessage))
    dispatches = of(logs[1], RequestDispatch)
    streaming = {"anthropic": ("anthropic-messages", 5), "openai": ("openai-chat", 4)}[wire]  # the defaults
    assert {(d.serializer, d.serializer_version) for d in dispatches} == {streaming}


def test_failed_attempts_are_logged_before_the_answer_and_the_log_verifies() -> None:
    plan = FaultPlan(by_index={0: Fault.rate_limited(0.01), 1: Fault.overloaded(), 3: Fault("reset-before")})
    agent, log = agent_for(Emulator(ToolLoopScript(tool_steps=1), faults=plan))
    assert asyncio.run(agent.run_turn("Please work.")).reason == "completed"
    events = log.read("s")
    retries = [e for e in events if isinstance(e.data, LlmRetry)]
    records: list[LlmRetry] = of(events, LlmRetry)
    assert [(r.attempt, r.status, r.step) for r in records] == [(1, 429, 0), (2, 529, 0), (1, None, 1)]
    assert all(r.ignorable for r in retries)
    assert b'"ignorable":true' in encode_event(retries[0])
    assert records[0].wait_ms == 10
    assert records[0].provider_request_id == "req_emu_00000000"
    for r in retries:  # each between its step's dispatch and its answer
        dispatch = max(e.seq for e in events if isinstance(e.data, RequestDispatch) and e.seq < r.seq)
        answer = min(e.seq for e in events if isinstance(e.data, AssistantMessage) and e.seq > r.seq)
        assert dispatch < r.seq < answer
    report = verify_events("s", events)
    assert report.ok
    assert report.retries == 3
    assert report.to_json()["retries"] == 3


def test_a_retry_outside_its_step_is_reported_by_verify() -> None:
    agent, log = agent_for(Emulator(ToolLoopScript(tool_steps=0)))
    asyncio.run(agent.run_turn("hi"))
    events = log.read("s")
    stray = Envelope(len(events), 1, LlmRetry(9, 9, 1, "overloaded_error", 529, 10), ignorable=True)
    report = verify_events("s", [*events, stray])
    assert not report.ok
    assert "follows no request/dispatch" in report.unreconstructable[0].reason


def test_cancelling_mid_stream_closes_the_connection_and_keeps_what_arrived() -> None:
    script = ToolLoopScript(tool_steps=0)
    with EmulatorServer(emulator=Emulator(script, event_delay_s=0.02, piece_chars=4)) as server:
        agent, log = agent_for(server.emulator, url=server.url, settings=TransportSettings(log_chunks=True))

        async def main() -> None:
            task = asyncio.create_task(agent.run_turn("Tell me a long story."))
            while sum(isinstance(e.data, AssistantChunk) for e in log.read("s")) < 6:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await agent.provider.aclose()

        asyncio.run(main())
        for _ in range(100):
            if server.disconnects:
                break
            asyncio.run(asyncio.sleep(0.02))
        assert server.disconnects == 1  # the stream's connection was closed under it
    events = log.read("s")
    (interrupted,) = of(events, AssistantMessage)
    assert interrupted.stop_reason == "interrupted"
    assert interrupted.content
    assert interrupted.content[0].text.startswith("Answer to")
    assert interrupted.provider_message_id is not None
    assert [e.type for e in events[-3:]] == ["assistant/message", "step/end", "turn/end"]
    assert events[-1].data == TurnEnd(0, "aborted")
    assert verify_events("s", events).ok
    # the cut answer is model-visible: the next request carries it
    agent2, _ = agent_for(Emulator(ToolLoopScript(tool_steps=0)), log=log)
    asyncio.run(agent2.run_turn("Go on."))
    assert agent2.last_request is not None
    assert any(m.role == "assistant" and m.content == interrupted.content for m in agent2.last_request.messages)
    assert verify_events("s", log.read("s")).ok


def test_pause_turn_continues_the_turn_without_running_anything() -> None:
    agent, log = agent_for(Emulator(Scripted(Reply("Searching…", stop="pause_turn"), Reply("Found it."))))
    result = asyncio.run(agent.run_turn("Search."))
    assert result.reason == "completed"
    assert [a.stop_reason for a in of(log.read("s"), AssistantMessage)] == ["pause_turn", "end_turn"]
    assert verify_events("s", log.read("s")).ok


def test_max_tokens_never_runs_a_tool_from_a_cut_answer() -> None:
    long = "x" * 4000
    script = Scripted(Reply(long, (ScriptedCall("echo", {"text": "hi"}),)))
    agent, log = agent_for(Emulator(script), max_tokens=20)
    result = asyncio.run(agent.run_turn("Go."))
    assert result.reason == "max-tokens"
    events = log.read("s")
    assert of(events, ToolCall) == []
    assert of(events, ToolResult) == []
    ran = agent.options.tools
    assert isinstance(ran, RecordingToolset)
    assert ran.ran == []
    assert not any(isinstance(b, ToolCallBlock) for a in of(events, AssistantMessage) for b in a.content)
    assert verify_events("s", events).ok


def test_a_refusal_ends_the_turn_and_the_next_turn_starts_without_it() -> None:
    script = Scripted(
        Reply(None, (ScriptedCall("echo", {"text": "a"}),)),
        Reply("I can't help with that.", stop="refusal"),
        Reply("Sure."),
    )
    agent, log = agent_for(Emulator(script))
    assert asyncio.run(agent.run_turn("Do the bad thing.")).reason == "refusal"
    assert asyncio.run(agent.run_turn("Something else then.")).reason == "completed"
    events = log.read("s")
    (reset,) = [u for u in of(events, UserMessage) if u.source == "refusal-reset"]
    assert reset.content == (TextBlock(REFUSAL_RESET_TEXT),)
    assert len(reset.source_event_seqs) == 4  # the prompt, the tool call, its result and the refusal
    assert agent.last_request is not None
    texts = [b.text for m in agent.last_request.messages for b in m.content if isinstance(b, TextBlock)]
    assert "Do the bad thing." not in texts
    assert "I can't help with that." not in texts
    assert verify_events("s", events).ok


def test_a_refusal_left_by_an_earlier_instance_is_removed_by_the_next_one() -> None:
    agent, log = agent_for(Emulator(Scripted(Reply("No.", stop="refusal"), Reply("Yes."))))
    asyncio.run(agent.run_turn("Bad."))
    agent2, _ = agent_for(Emulator(ToolLoopScript(tool_steps=0)), log=log)
    asyncio.run(agent2.run_turn("Good."))
    assert [u.source for u in of(log.read("s"), UserMessage)][-2:] == ["refusal-reset", "user"]
    assert verify_events("s", log.read("s")).ok


def test_a_full_context_window_ends_the_turn_with_the_fix() -> None:
    overflow = Fault("status", 400, message="prompt is too long: 210000 tokens > 200000 maximum")
    agent, log = agent_for(Emulator(ToolLoopScript(tool_steps=0), faults=FaultPlan(by_index={0: overflow})))
    result = asyncio.run(agent.run_turn("Hi."))
    assert result.reason == "context-overflow"
    assert result.detail is not None
    assert result.detail.startswith(CONTEXT_OVERFLOW_FIX)
    events = log.read("s")
    (failed,) = of(events, LlmRetry)
    assert (failed.status, failed.wait_ms) == (400, None)
    assert events[-1].data == TurnEnd(0, "context-overflow")
    agent2, log2 = agent_for(Emulator(Scripted(Reply("cut", stop="model_context_window_exceeded"))))
    assert asyncio.run(agent2.run_turn("Hi.")).reason == "context-overflow"
    assert verify_events("s", log2.read("s")).ok


class Broken:
    """An emulator whose streams break in the given way."""

    def __init__(self, mangle: Callable[[tuple[bytes, ...]], tuple[bytes, ...]]) -> None:
        self.emulator = _MangledEmulator(ToolLoopScript(tool_steps=0), mangle)


class _MangledEmulator(Emulator):
    """The emulator, its streamed answers rewritten by ``mangle`` before they go out."""

    def __init__(self, script: ToolLoopScript, mangle: Callable[[tuple[bytes, ...]], tuple[bytes, ...]]) -> None:
        super().__init__(script)
        self._mangle = mangle

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> Any:
        from dataclasses import replace

        answer = super().handle(method, path, headers, body)
        chunks = self._mangle(answer.chunks or ())
        return replace(answer, chunks=chunks, body=b"".join(chunks))


@pytest.mark.parametrize(
    ("name", "mangle"),
    [
        ("malformed", lambda c: (*c[:3], b"data: {oops\n\n", *c[3:])),
        ("unknown-event", lambda c: (*c[:3], b'event: surprise\ndata: {"type":"surprise"}\n\n', *c[3:])),
        ("too-large", lambda c: (*c[:3], b'event: ping\ndata: {"type":"ping"}\n\n' * 2000, *c[3:])),
    ],
)
def test_a_bad_stream_ends_the_turn_with_a_reason_and_nothing_half_written(name: str, mangle: Any) -> None:
    broken = Broken(mangle)
    agent, log = agent_for(broken.emulator, settings=TransportSettings(max_answer_bytes=40_000))
    with pytest.raises((ProviderStreamError, Exception)) as caught:
        asyncio.run(agent.run_turn("Hi."))
    assert caught.typename in ("ProviderStreamError", "AnswerTooLarge")
    events = log.read("s")
    assert of(events, AssistantMessage) == []
    (failed,) = of(events, LlmRetry)
    assert failed.wait_ms is None
    assert [type(e.data) for e in events[-2:]] == [StepEnd, TurnEnd]
    assert events[-1].data == TurnEnd(0, "error")
    assert verify_events("s", events).ok


def test_a_stream_that_always_stops_short_is_sent_again_until_the_attempts_run_out() -> None:
    # a stream that ends before its final event is a cut stream: sent again; when every attempt is cut the
    # turn ends `error` with the typed failure, nothing raised, nothing of the answer logged
    broken = Broken(lambda c: c[:-1])
    settings = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002, max_attempts=3)
    agent, log = agent_for(broken.emulator, settings=settings)
    result = asyncio.run(agent.run_turn("Hi."))
    assert result.reason == "error"
    assert isinstance(result.failure, RetriesExhausted)
    assert isinstance(result.failure.__cause__, ProviderStreamError)
    assert result.failure.__cause__.error_type == "incomplete-stream"
    events = log.read("s")
    assert of(events, AssistantMessage) == []
    failed = of(events, LlmRetry)
    assert [(f.attempt, f.error_type, f.wait_ms is None) for f in failed] == [
        (1, "incomplete-stream", False),
        (2, "incomplete-stream", False),
        (3, "incomplete-stream", True),
    ]
    assert [type(e.data) for e in events[-2:]] == [StepEnd, TurnEnd]
    assert events[-1].data == TurnEnd(0, "error")
    assert verify_events("s", events).ok


def test_show_and_verify_on_the_command_line_understand_retries(tmp_path: Any) -> None:
    plan = FaultPlan(by_index={0: Fault.rate_limited(0.01)})
    log = SqliteEventLog(tmp_path)
    agent, _ = agent_for(Emulator(ToolLoopScript(tool_steps=0), faults=plan))
    agent = Agent("s", log, agent.provider, agent.options)
    asyncio.run(agent.run_turn("Hi."))
    log.close()
    runner = CliRunner()
    shown = runner.invoke(app, ["show", "s", "--data-dir", str(tmp_path)])
    assert shown.exit_code == 0
    assert "llm/retry" in shown.stdout
    assert "HTTP 429 rate_limit_error" in shown.stdout
    assert "request=req_emu_00000001" in shown.stdout
    verified = runner.invoke(app, ["verify", "--data-dir", str(tmp_path)])
    assert verified.exit_code == 0
    assert "1 failed attempt(s) resent the same bytes" in " ".join(verified.stdout.split())


def test_every_attempt_of_a_step_puts_the_dispatched_digest_on_the_wire() -> None:
    plan = FaultPlan(by_index={0: Fault.overloaded(), 1: Fault("reset-before"), 2: Fault.server_error()})
    with EmulatorServer(emulator=Emulator(ToolLoopScript(tool_steps=0), faults=plan), record_bodies=True) as server:
        agent, log = agent_for(server.emulator, url=server.url)

        async def main() -> None:
            try:
                await agent.run_turn("Hi.")
            finally:
                await agent.provider.aclose()

        asyncio.run(main())
        bodies = server.bodies
    (dispatch,) = of(log.read("s"), RequestDispatch)
    assert ["sha256:" + hashlib.sha256(b).hexdigest() for _, b in bodies] == [dispatch.digest] * 4
