"""A turn read as events while dispatchers serve its steps over Redis (the real local Redis): the dispatcher
relays the pieces of the answer it receives to the loop that owns the session, a lost relay costs pieces and
never the answer or the log, and a streamed answer cut at the dispatcher is sent again by the loop."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis

from foldline.adapters import redis_steps
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.config import DispatchConfig, RedisConfig
from foldline.core import CallConfig, TextBlock
from foldline.core.events import AssistantMessage, LlmRetry
from foldline.dispatcher import Dispatcher, RedisStepClient, serve_steps
from foldline.loop import (
    Agent,
    AgentOptions,
    AttemptDiscarded,
    StepFinished,
    StepStarted,
    StreamEvent,
    TextDelta,
    ToolArgumentsDelta,
    ToolCallFinished,
    Toolset,
    TurnFinished,
)
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, Fault, FaultPlan, ToolLoopScript
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings
from foldline.replay.verify import verify_events
from tests.contracts.step_dispatch import ProjectingLog

pytestmark = pytest.mark.redis

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=1024, stream=True)
FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002)


def redis_url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


def toolset() -> Toolset:
    tools = Toolset()

    @tools.tool
    def lookup(topic: str) -> str:
        """Look a topic up in the notes."""
        return f"notes on {topic}"

    return tools


def served(
    body: Callable[[Agent, ProjectingLog], Coroutine[Any, Any, None]], *, faults: FaultPlan | None = None
) -> None:
    """``body`` runs an agent whose steps a dispatcher serves over Redis (its emulator streams 4-character pieces)."""
    stream = f"test:dispatch:{uuid.uuid4().hex[:10]}"
    group = DispatchConfig().group

    async def main() -> None:
        folds = MemoryFoldStore()
        emulator = Emulator(ToolLoopScript(tool_steps=1), faults=faults, piece_chars=4)
        dispatcher = Dispatcher(folds, {"anthropic": emulated_provider(emulator=emulator)}, fold_timeout_s=5)
        client = RedisStepClient(RedisConfig(redis_url()), stream=stream, group=group, answer_timeout_s=30)
        log = ProjectingLog(folds)
        stop = asyncio.Event()
        server = asyncio.create_task(
            serve_steps(dispatcher, RedisConfig(redis_url()), stream=stream, group=group, stop=stop)
        )
        options = AgentOptions(
            CONFIG, system="You are a test agent.", tools=toolset(), dispatcher=client, sender=RetryingSender(FAST)
        )
        agent = Agent("s", log, emulated_provider(emulator=emulator), options)
        try:
            await body(agent, log)
        finally:
            stop.set()
            await server
            await client.aclose()
            await dispatcher.aclose()

    try:
        asyncio.run(main())
    finally:
        r = redis.Redis.from_url(redis_url())
        for key in r.scan_iter(f"{stream}*"):
            r.delete(key)
        r.close()


def _answers(log: ProjectingLog) -> list[AssistantMessage]:
    return [e.data for e in log.read("s") if isinstance(e.data, AssistantMessage)]


def _text(answer: AssistantMessage) -> str:
    return "".join(b.text for b in answer.content if isinstance(b, TextBlock))


def test_the_dispatcher_relays_the_pieces_of_each_answer_to_the_loop() -> None:
    events: list[StreamEvent] = []

    async def body(agent: Agent, log: ProjectingLog) -> None:
        events.extend([e async for e in agent.stream("Find the notes.")])
        assert verify_events("s", log.read("s")).status == "verified"
        answers = _answers(log)
        starts = [i for i, e in enumerate(events) if isinstance(e, StepStarted)] + [len(events)]
        assert len(starts) - 1 == len(answers) == 2
        for n, answer in enumerate(answers):
            window = events[starts[n] : starts[n + 1]]
            assert "".join(e.text for e in window if isinstance(e, TextDelta)) == _text(answer)
            calls = [e for e in window if isinstance(e, ToolCallFinished)]
            pieces = "".join(e.text for e in window if isinstance(e, ToolArgumentsDelta))
            assert pieces == "".join(c.arguments for c in calls)
        assert len([e for e in events if isinstance(e, TextDelta)]) > 4  # pieces, not one block per answer

    served(body)
    assert [type(e) for e in events[-2:]] == [StepFinished, TurnFinished]
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.reason == "completed"


def test_a_lost_relay_costs_pieces_never_the_answer_or_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(self: Any, piece: Any) -> None:  # every PUBLISH of pieces goes nowhere
        return None

    monkeypatch.setattr(redis_steps._Publisher, "push", lost)
    events: list[StreamEvent] = []

    async def body(agent: Agent, log: ProjectingLog) -> None:
        events.extend([e async for e in agent.stream("Find the notes.")])
        assert verify_events("s", log.read("s")).status == "verified"
        assert all(_text(a) for a in _answers(log))

    served(body)
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert sum(isinstance(e, StepFinished) for e in events) == 2
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.reason == "completed"


def test_a_stream_cut_at_the_dispatcher_is_sent_again_by_the_loop() -> None:
    events: list[StreamEvent] = []

    async def body(agent: Agent, log: ProjectingLog) -> None:
        events.extend([e async for e in agent.stream("Find the notes.")])
        records = log.read("s")
        (retry,) = [e.data for e in records if isinstance(e.data, LlmRetry)]
        assert retry.received_bytes > 0
        assert retry.wait_ms is not None
        assert verify_events("s", records).status == "verified"

    served(body, faults=FaultPlan(by_index={0: Fault("reset-mid")}))
    assert [(e.step, e.attempt) for e in events if isinstance(e, AttemptDiscarded)] == [(0, 1)]
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.reason == "completed"
