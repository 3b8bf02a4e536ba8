"""The calls of one answer: run concurrently (bounded; a tool may run alone), each within its time limit, results
logged in call order whatever order they finish in; a cancelled turn stops its running tools and logs each as
interrupted."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core.content import TextBlock
from foldline.core.events import ToolResult, TurnEnd
from foldline.core.header import CallConfig
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.tool_runner import CANCELLED_RESULT
from foldline.providers import emulated_provider
from foldline.providers.emulator import Emulator
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider, PlanScript

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
WAIT = 30.0  # a bound on waits that only a bug would reach


def make(
    tools: Toolset, rounds: Sequence[Sequence[tuple[str, Mapping[str, Any]]]], **options: Any
) -> tuple[Agent, MemoryEventLog, CapturingProvider]:
    log = MemoryEventLog()
    provider = CapturingProvider(emulated_provider(emulator=Emulator(PlanScript(rounds))))
    agent = Agent("s", log, provider, AgentOptions(CONFIG, tools=tools, **options), attachments=MemoryAttachmentStore())
    return agent, log, provider


def results(log: MemoryEventLog) -> list[ToolResult]:
    return [e.data for e in log.read("s") if isinstance(e.data, ToolResult)]


def text(result: ToolResult) -> str:
    return "".join(p.text for p in result.content if isinstance(p, TextBlock))


def test_the_calls_of_one_answer_run_at_the_same_time() -> None:
    """Each tool waits for the others to have started: only concurrent calls finish (else: the time limit)."""
    tools = Toolset()
    started: dict[str, asyncio.Event] = {}

    async def meet(me: str, others: list[str]) -> str:
        started[me].set()
        for other in others:
            await started[other].wait()
        return f"{me} met {', '.join(others)}"

    for name in ("a", "b", "c"):

        def tool(name: str = name) -> Any:
            async def fn() -> str:
                return await meet(name, [n for n in "abc" if n != name])

            fn.__name__, fn.__doc__ = name, f"Tool {name}."
            return fn

        tools.add(tool())

    agent, log, _ = make(tools, [[("a", {}), ("b", {}), ("c", {})]], tool_timeout_s=WAIT)

    async def main() -> None:
        started.update({n: asyncio.Event() for n in "abc"})
        await agent.run_turn("go")

    asyncio.run(main())
    assert [text(r) for r in results(log)] == ["a met b, c", "b met a, c", "c met a, b"]


def test_blocking_tools_run_in_threads_side_by_side() -> None:
    barrier = threading.Barrier(2, timeout=WAIT)
    tools = Toolset()

    @tools.tool
    def left() -> str:
        """Left."""
        barrier.wait()  # both calls must be in their threads at once
        return "left"

    @tools.tool
    def right() -> str:
        """Right."""
        barrier.wait()
        return "right"

    agent, log, _ = make(tools, [[("left", {}), ("right", {})]])
    asyncio.run(agent.run_turn("go"))
    assert [text(r) for r in results(log)] == ["left", "right"]


def test_an_exclusive_tool_runs_alone_and_the_limit_bounds_the_rest() -> None:
    running = 0
    seen: dict[str, int] = {}
    tools = Toolset()

    async def busy(name: str) -> str:
        nonlocal running
        running += 1
        seen[name] = max(seen.get(name, 0), running)
        await asyncio.sleep(0.01)
        seen[name] = max(seen[name], running)
        running -= 1
        return name

    @tools.tool
    async def plain(tag: str) -> str:
        """Plain."""
        return await busy(tag)

    @tools.tool(exclusive=True)
    async def alone(tag: str) -> str:
        """Alone."""
        return await busy(tag)

    calls = [("plain", {"tag": "p1"}), ("plain", {"tag": "p2"}), ("plain", {"tag": "p3"}), ("alone", {"tag": "x"})]
    calls += [("plain", {"tag": "p4"})]
    agent, log, _ = make(tools, [calls], max_parallel_tools=2)
    asyncio.run(agent.run_turn("go"))
    assert [text(r) for r in results(log)] == ["p1", "p2", "p3", "x", "p4"]
    assert seen["x"] == 1  # nothing ran beside it
    assert max(seen[p] for p in ("p1", "p2", "p3")) == 2  # at most two at once


def test_the_log_and_the_next_request_do_not_depend_on_the_order_calls_finish_in() -> None:
    runs = []
    for delays in itertools.permutations((0.0, 0.02, 0.04)):
        tools = Toolset()

        for i, delay in enumerate(delays):

            def tool(i: int = i, delay: float = delay) -> Any:
                async def fn(x: int) -> str:
                    await asyncio.sleep(delay)
                    return f"tool {i} got {x}"

                fn.__name__, fn.__doc__ = f"t{i}", f"Tool {i}."
                return fn

            tools.add(tool())
        agent, log, provider = make(tools, [[("t0", {"x": 1}), ("t1", {"x": 2}), ("t2", {"x": 3})]])
        asyncio.run(agent.run_turn("go"))
        runs.append(([e.data for e in log.read("s")], provider.bodies))
    assert all(run == runs[0] for run in runs[1:])
    assert [text(r) for r in results(log)] == ["tool 0 got 1", "tool 1 got 2", "tool 2 got 3"]


def test_a_call_past_its_limit_is_cancelled_and_answered_with_the_limit() -> None:
    cancelled = []
    tools = Toolset()

    @tools.tool(timeout_s=0.05)
    async def stuck() -> str:
        """Never finishes."""
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            cancelled.append("stuck")
            raise
        return "late"

    @tools.tool
    async def quick() -> str:
        """Done at once."""
        return "quick"

    agent, log, _ = make(tools, [[("stuck", {}), ("quick", {})]], tool_timeout_s=WAIT)
    asyncio.run(agent.run_turn("go"))
    stuck_result, quick_result = results(log)
    assert stuck_result.is_error
    assert text(stuck_result).startswith("timeout: stuck did not finish within its limit of 0.05 s")
    assert cancelled == ["stuck"]
    assert text(quick_result) == "quick"


def test_the_agent_default_limit_applies_to_tools_without_their_own() -> None:
    tools = Toolset()

    @tools.tool
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(WAIT)
        return "late"

    agent, log, _ = make(tools, [[("slow", {})]], tool_timeout_s=0.05)
    asyncio.run(agent.run_turn("go"))
    assert "within its limit of 0.05 s" in text(results(log)[0])


def test_cancelling_the_turn_stops_running_tools_and_logs_each_as_interrupted() -> None:
    stopped = []
    tools = Toolset()
    hanging = asyncio.Event()

    @tools.tool
    async def quick() -> str:
        """Done at once."""
        return "quick result"

    @tools.tool
    async def hang() -> str:
        """Never finishes."""
        hanging.set()
        try:
            await asyncio.sleep(WAIT)
        finally:
            stopped.append("hang")
        return "never"

    agent, log, _ = make(tools, [[("quick", {}), ("hang", {}), ("hang", {})]], tool_timeout_s=WAIT)

    async def main() -> None:
        turn = asyncio.ensure_future(agent.run_turn("go"))
        await asyncio.wait_for(hanging.wait(), WAIT)
        await asyncio.sleep(0.01)
        turn.cancel()
        try:
            await turn
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the turn was not cancelled")
        assert stopped == ["hang", "hang"]  # both running calls stopped before the turn ended
        agent.options.tool_timeout_s = 0.05
        await agent.run_turn("again")  # the next request is one the provider accepts

    asyncio.run(main())
    first = results(log)[:3]
    assert [text(r) for r in first] == ["quick result", CANCELLED_RESULT, CANCELLED_RESULT]
    assert [r.is_error for r in first] == [False, True, True]
    ends = [e.data.reason for e in log.read("s") if isinstance(e.data, TurnEnd)]
    assert ends[0] == "aborted"
    report = verify_events("s", log.read("s"), agent.attachments)
    assert report.ok, report
