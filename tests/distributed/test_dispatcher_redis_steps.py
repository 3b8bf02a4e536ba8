"""Steps handed to a dispatcher over a Redis stream (the real local Redis), answered through the reply key."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.config import DispatchConfig, RedisConfig
from foldline.core.events import RequestDispatch, TurnEnd
from foldline.dispatcher import Dispatcher, RedisStepClient, StepHandoff, serve_steps
from foldline.errors import DispatchFailed, DispatchTimeout
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replay.verify import verify_events

from .test_dispatcher import CONFIG, SYSTEM, ProjectingLog, tools

pytestmark = pytest.mark.redis


def redis_url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


def with_server(
    body: Callable[[ProjectingLog, RedisStepClient, Emulator], Coroutine[Any, Any, None]],
    *,
    serve: bool = True,
) -> None:
    stream = f"test:dispatch:{uuid.uuid4().hex[:10]}"

    async def main() -> None:
        folds = MemoryFoldStore()
        log = ProjectingLog(folds)
        emulator = Emulator(ToolLoopScript(tool_steps=1))
        dispatcher = Dispatcher(log, folds, {"anthropic": emulated_provider(emulator=emulator)}, fold_timeout_s=1)
        stop = asyncio.Event()
        redis = RedisConfig(redis_url())
        steps = DispatchConfig()
        server = (
            asyncio.create_task(
                serve_steps(
                    dispatcher, redis, stream=stream, group=steps.group, max_in_flight=steps.concurrency, stop=stop
                )
            )
            if serve
            else None
        )
        client = RedisStepClient(redis, stream=stream, timeout_s=1.0 if not serve else 10.0)
        try:
            await body(log, client, emulator)
        finally:
            stop.set()
            if server is not None:
                await server
            await client.aclose()
            await dispatcher.aclose()

    try:
        asyncio.run(main())
    finally:
        r = redis.Redis.from_url(redis_url())
        r.delete(stream)
        r.close()


def test_sessions_dispatched_through_the_stream_verify() -> None:
    async def body(log: ProjectingLog, client: RedisStepClient, emulator: Emulator) -> None:
        async def session(sid: str) -> None:
            agent = Agent(
                sid,
                log,
                emulated_provider(emulator=emulator),
                AgentOptions(CONFIG, system=SYSTEM, tools=tools(), dispatcher=client),
            )
            await agent.run_turn(f"[{sid}] question one")
            await agent.run_turn(f"[{sid}] question two")

        ids = [f"r-{i}" for i in range(6)]
        await asyncio.gather(*(session(sid) for sid in ids))
        for sid in ids:
            report = verify_events(sid, log.read(sid))
            assert (report.ok, report.checked) == (True, 4), sid

    with_server(body)


def test_a_failed_step_comes_back_typed_and_a_missing_dispatcher_times_out() -> None:
    async def failing(log: ProjectingLog, client: RedisStepClient, emulator: Emulator) -> None:
        with pytest.raises(DispatchFailed, match=r"FoldTimeout: .*projector") as info:
            # a step the log never opened: the fold never reaches it
            await client.dispatch(StepHandoff("nobody", 3, 0, 0, 1))
        assert info.value.kind == "FoldTimeout"

    async def no_server(log: ProjectingLog, client: RedisStepClient, emulator: Emulator) -> None:
        agent = Agent(
            "lonely", log, emulated_provider(emulator=emulator), AgentOptions(CONFIG, system=SYSTEM, dispatcher=client)
        )
        with pytest.raises(DispatchTimeout, match="foldline dispatcher"):
            await agent.run_turn("anyone there?")
        events = log.read("lonely")
        assert not any(isinstance(e.data, RequestDispatch) for e in events)
        assert isinstance(events[-1].data, TurnEnd)
        assert events[-1].data.reason == "error"
        assert emulator.requests == 0

    with_server(failing)
    with_server(no_server, serve=False)


def test_a_handoff_waits_its_whole_timeout_even_past_the_redis_socket_timeout() -> None:
    """The reply wait is one blocking BLPOP: the client's socket must outlast it, or a slow answer (a long
    provider call) would surface as a lost Redis connection instead of waiting."""

    async def main() -> None:
        settings = RedisConfig(redis_url(), socket_timeout_s=0.2, connect_timeout_s=1.0)
        client = RedisStepClient(settings, stream=f"test:dispatch:{uuid.uuid4().hex[:10]}", timeout_s=1.5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(DispatchTimeout, match="no dispatcher answered within"):
                await client.dispatch(StepHandoff("nobody", 3, 0, 0, 1))
        finally:
            await client.aclose()
            r = redis.Redis.from_url(settings.url)
            r.delete(client.stream)
            r.close()
        assert loop.time() - started >= 1.5

    asyncio.run(main())
