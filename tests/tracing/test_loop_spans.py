"""The spans a loop's appends become (foldline.tracing), checked against the log they were derived from, with the
SDK's in-memory exporter; and what the standard variables switch on and off."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from typer.testing import CliRunner

from foldline import tracing
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.cli.main import app
from foldline.config.prices import builtin_price_table
from foldline.core.events import AssistantMessage, Envelope, RequestDispatch, ToolCall
from foldline.core.header import CallConfig
from foldline.core.usage import normalize_usage
from foldline.demo import SYSTEM_PROMPT, demo_toolset
from foldline.dispatcher import Dispatcher
from foldline.loop import Agent, AgentOptions
from foldline.ports.step_dispatch import StepHandoff
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator
from tests.contracts.step_dispatch import ProjectingLog

CONSOLE = {"OTEL_TRACES_EXPORTER": "console"}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    made = tracing.configure(
        "foldline-test", CONSOLE, prices=builtin_price_table(), processors=[SimpleSpanProcessor(exporter)]
    )
    assert made is not None
    yield exporter
    tracing.shutdown()


def _run(log: MemoryEventLog, session: str = "s", turns: int = 2) -> None:
    provider = emulated_provider("anthropic", emulator=Emulator())
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512), system=SYSTEM_PROMPT, tools=demo_toolset()
    )

    async def run() -> None:
        agent = Agent(session, tracing.traced_log(log), provider, options)
        for i in range(turns):
            await agent.run_turn(f"Question {i}: what do the notes say about kafka?")
        await provider.aclose()

    asyncio.run(run())


def _by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name.startswith(prefix)]


def _finished(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, ...]:
    """The spans built so far: the tracer's thread builds them from the notes of the appends; flush it first."""
    made = tracing.current()
    if made is not None:
        made.loop.flush()
    return exporter.get_finished_spans()


def test_turns_steps_and_tool_calls_become_genai_spans_with_the_logs_figures(spans: InMemorySpanExporter) -> None:
    log = MemoryEventLog()
    _run(log)
    finished = _finished(spans)
    events = log.read("s")
    turns = _by_name(finished, "invoke_agent")
    chats = _by_name(finished, "chat ")
    tools = _by_name(finished, "execute_tool ")
    answers = [e for e in events if isinstance(e.data, AssistantMessage)]
    dispatches = [e for e in events if isinstance(e.data, RequestDispatch)]
    assert len(turns) == 2
    assert len(chats) == len(answers) == len(dispatches)
    assert len(tools) == sum(1 for e in events if isinstance(e.data, ToolCall))
    turn_ids = {t.context.span_id for t in turns}
    for span in (*chats, *tools):
        assert span.parent is not None
        assert span.parent.span_id in turn_ids  # chat and execute_tool are children of the turn
        assert span.context.trace_id in {t.context.trace_id for t in turns}
    for turn in turns:
        assert turn.kind == SpanKind.INTERNAL
        assert turn.attributes is not None
        assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert turn.attributes["gen_ai.provider.name"] == "anthropic"
        assert turn.attributes["foldline.turn.reason"] == "completed"
    for chat, dispatch, answer in zip(chats, dispatches, answers, strict=True):
        a = chat.attributes
        assert a is not None
        assert isinstance(answer.data, AssistantMessage)
        assert answer.data.usage is not None
        assert isinstance(dispatch.data, RequestDispatch)
        usage = normalize_usage(answer.data.usage)
        assert chat.name == "chat claude-emulated"
        assert chat.kind == SpanKind.CLIENT
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == "claude-emulated"
        assert a["gen_ai.conversation.id"] == "s"
        assert a["gen_ai.response.id"] == answer.data.provider_message_id
        assert a["gen_ai.usage.input_tokens"] == usage.prompt  # the cache tokens included
        assert a["gen_ai.usage.cache_read.input_tokens"] == answer.data.usage.cache_read
        assert a["gen_ai.usage.cache_creation.input_tokens"] == answer.data.usage.cache_write
        assert a["gen_ai.usage.output_tokens"] == answer.data.usage.output
        assert a["foldline.seq"] == dispatch.seq
        assert a["foldline.request.digest"] == dispatch.data.digest
        assert a["foldline.response.seq"] == answer.seq
        assert a["foldline.cost.currency"] == "USD"
        assert isinstance(a["foldline.cost.spend"], float)
        assert a["foldline.cost.spend"] > 0
        assert "gen_ai.input.messages" not in a  # no content unless asked for
    assert chats[0].attributes is not None
    assert chats[0].attributes["foldline.header.reason"] == "initial"
    assert chats[0].attributes["foldline.drop.cause"] == "first-request"
    assert chats[1].attributes is not None
    assert chats[1].attributes["foldline.header.reason"] == "unchanged"
    for tool in tools:
        assert tool.kind == SpanKind.INTERNAL
        assert tool.attributes is not None
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.name == f"execute_tool {tool.attributes['gen_ai.tool.name']!s}"
        assert "gen_ai.tool.call.arguments" not in tool.attributes


def test_a_dispatched_steps_prepare_and_send_are_children_of_its_chat_span(spans: InMemorySpanExporter) -> None:
    """A dispatched step's opening is logged with its request/dispatch, after the hand-over: the hand-over opens the
    turn's and the step's spans, which the logged events then take as theirs (no second span, no orphan)."""
    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    emulator = Emulator()
    inner = Dispatcher(folds, {"anthropic": emulated_provider("anthropic", emulator=emulator)}, fold_timeout_s=5.0)
    dispatcher = tracing.traced_dispatcher(inner, loop=True, serve=True)
    provider = emulated_provider("anthropic", emulator=emulator)
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512),
        system=SYSTEM_PROMPT,
        tools=demo_toolset(),
        dispatcher=dispatcher,
    )

    async def run() -> None:
        agent = Agent("s", tracing.traced_log(log), provider, options)
        for i in range(2):
            await agent.run_turn(f"Question {i}: what do the notes say about kafka?")
        await inner.aclose()
        await provider.aclose()

    asyncio.run(run())
    finished = _finished(spans)
    events = log.read("s")
    turns = _by_name(finished, "invoke_agent")
    chats = _by_name(finished, "chat ")
    dispatches = [e.data for e in events if isinstance(e.data, RequestDispatch)]
    assert len(turns) == 2
    assert len(chats) == len(dispatches) > 2
    by_step = {(c.attributes["foldline.turn"], c.attributes["foldline.step"]): c for c in chats if c.attributes}
    assert sorted(by_step) == [(d.turn, d.step) for d in dispatches]
    turn_ids = {t.context.span_id for t in turns}
    assert all(c.parent is not None and c.parent.span_id in turn_ids for c in chats)
    served = _by_name(finished, "foldline.dispatch.")
    assert len(served) == 2 * len(dispatches)  # a prepare and a send per step
    for span in served:
        a = span.attributes
        assert a is not None
        assert span.parent is not None
        chat = by_step[(a["foldline.turn"], a["foldline.step"])]
        assert span.parent.span_id == chat.context.span_id
        assert chat.start_time is not None
        assert span.start_time is not None
        assert chat.start_time <= span.start_time


def test_message_content_only_when_the_user_opts_in(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    env = {**CONSOLE, tracing.CAPTURE_CONTENT_VARIABLE: "true"}
    tracing.configure("foldline-test", env, processors=[SimpleSpanProcessor(exporter)])
    try:
        _run(MemoryEventLog(), turns=1)
    finally:
        tracing.shutdown()
    chats = _by_name(exporter.get_finished_spans(), "chat ")
    first = chats[0].attributes
    assert first is not None
    inputs = json.loads(str(first["gen_ai.input.messages"]))
    assert inputs[0]["role"] == "user"
    assert inputs[0]["parts"][0] == {"type": "text", "content": "Question 0: what do the notes say about kafka?"}
    assert json.loads(str(first["gen_ai.system_instructions"])) == [{"type": "text", "content": SYSTEM_PROMPT}]
    outputs = json.loads(str(first["gen_ai.output.messages"]))
    assert outputs[0]["role"] == "assistant"
    assert outputs[0]["finish_reason"] == "tool_calls"
    assert any(p["type"] == "tool_call" for p in outputs[0]["parts"])
    last = chats[-1].attributes
    assert last is not None
    history = json.loads(str(last["gen_ai.input.messages"]))
    assert [m["role"] for m in history][:3] == ["user", "assistant", "tool"]
    tools = _by_name(exporter.get_finished_spans(), "execute_tool ")
    assert tools
    assert all(t.attributes is not None and "gen_ai.tool.call.arguments" in t.attributes for t in tools)


def test_a_failing_tool_is_an_error_span(spans: InMemorySpanExporter) -> None:
    log = MemoryEventLog()
    provider = emulated_provider("anthropic", emulator=Emulator())
    tools = demo_toolset()

    @tools.tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(reason)

    from foldline.providers.emulator import Reply, ScriptedCall

    class Script:
        def reply(self, conversation: object) -> Reply:
            turns = getattr(conversation, "turns", ())
            if any(t.role == "assistant" for t in turns):
                return Reply("done")
            return Reply(None, (ScriptedCall("explode", {"reason": "disk full"}),))

    provider = emulated_provider("anthropic", emulator=Emulator(Script()))
    options = AgentOptions(config=CallConfig("anthropic", "claude-emulated", max_tokens=512), tools=tools)

    async def run() -> None:
        await Agent("s", tracing.traced_log(log), provider, options).run_turn("go")
        await provider.aclose()

    asyncio.run(run())
    (tool,) = _by_name(_finished(spans), "execute_tool ")
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.attributes is not None
    assert tool.attributes["error.type"] == "tool_error"


def test_off_unless_an_exporter_is_named_and_then_nothing_is_wrapped() -> None:
    assert not tracing.enabled({})
    assert not tracing.enabled({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.enabled({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.enabled({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
    assert tracing.configure("x", {}) is None
    log = MemoryEventLog()
    assert tracing.traced_log(log) is log


def test_a_traced_hand_over_carries_the_trace_and_old_ones_still_read() -> None:
    handoff = StepHandoff("s", 3, 0, 0, 1, trace={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert StepHandoff.from_json(handoff.to_json()) == handoff
    plain = StepHandoff("s", 3, 0, 0, 1)
    assert "trace" not in plain.to_json()
    assert StepHandoff.from_json(plain.to_json()) == plain


def test_an_unknown_exporter_or_protocol_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    res = runner.invoke(app, ["sessions", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "OTEL_TRACES_EXPORTER names 'zipkin'" in res.output
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    res = runner.invoke(app, ["sessions", "--data-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "http/protobuf or grpc" in res.output
    tracing.shutdown()


def test_with_tracing_off_no_opentelemetry_sdk_is_loaded(tmp_path: Path) -> None:
    # the OpenTelemetry API may be loaded by another package (the mcp package imports it for its own spans); with
    # tracing off foldline loads neither the SDK nor an exporter, and sets no tracer provider
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys\n"
        "from foldline.cli.main import app\n"
        f"try:\n    app(['demo', '--sessions', '1', '--steps', '2', '--data-dir', {str(tmp_path)!r}, '--json'])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')))\n"
        "assert not loaded, loaded\n"
        "if 'opentelemetry.trace' in sys.modules:\n"
        "    from opentelemetry import trace\n"
        "    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), trace.get_tracer_provider()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_tracers_thread_builds_the_spans_without_being_asked(spans: InMemorySpanExporter) -> None:
    import time

    _run(MemoryEventLog(), turns=1)
    deadline = time.monotonic() + 10
    while not _by_name(spans.get_finished_spans(), "invoke_agent") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _by_name(spans.get_finished_spans(), "invoke_agent")


def test_a_session_resumed_in_another_process_reads_its_history_once(spans: InMemorySpanExporter) -> None:
    """The tracer meets the session mid-way (its first turn was written by another loop instance, untraced): it
    reads what it missed, so the new instance's first step is classified against the old one (a resume)."""
    log = MemoryEventLog()
    provider = emulated_provider("anthropic", emulator=Emulator())
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512), system=SYSTEM_PROMPT, tools=demo_toolset()
    )

    async def run() -> None:
        await Agent("s", log, provider, options).run_turn("first, untraced")  # another process, in effect
        await Agent("s", tracing.traced_log(log), provider, options).run_turn("second, traced")
        await provider.aclose()

    asyncio.run(run())
    chats = _by_name(_finished(spans), "chat ")
    assert chats
    first = chats[0].attributes
    assert first is not None
    assert first["foldline.header.reason"] == "resume"
    answers = [e for e in log.read("s") if isinstance(e.data, AssistantMessage)]
    seq = first["foldline.response.seq"]
    assert isinstance(seq, int)
    assert seq > answers[0].seq  # none of the untraced turn's steps became spans
    assert len(_by_name(_finished(spans), "invoke_agent")) == 1


class _CountingLog(MemoryEventLog):
    """A memory log that notes the range of every read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int | None]] = []

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        self.reads.append((from_seq, to_seq))
        return super().read(session_id, from_seq, to_seq)


def test_a_session_taken_over_is_handed_to_the_tracer_as_read_not_read_again(spans: InMemorySpanExporter) -> None:
    log = _CountingLog()
    provider = emulated_provider("anthropic", emulator=Emulator())
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=512), system=SYSTEM_PROMPT, tools=demo_toolset()
    )

    async def run() -> None:
        await Agent("s", log, provider, options).run_turn("first, untraced")  # another process, in effect
        head = log.head("s")
        traced = tracing.traced_log(log)
        opened = traced.acquire_and_read("s")  # the take-over's one read of the session (as `foldline resume` does)
        log.reads.clear()
        await Agent("s", traced, provider, options, opened=opened).run_turn("second, traced")
        await provider.aclose()
        tracer_reads = [r for r in log.reads if r[0] < head]
        assert not tracer_reads, tracer_reads  # nothing written before the take-over was read again

    asyncio.run(run())
    chats = _by_name(_finished(spans), "chat ")
    assert chats
    first = chats[0].attributes
    assert first is not None
    assert first["foldline.header.reason"] == "resume"
    assert len(_by_name(_finished(spans), "invoke_agent")) == 1
