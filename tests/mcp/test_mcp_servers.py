"""MCP servers as tool sources, against real servers: the reference server-everything (stdio and Streamable HTTP),
a server written with the mcp SDK and one that answers garbage. Every session must verify; no server process may
outlive the agent's ``async with``."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core.content import ImageBlock, TextBlock
from foldline.core.drops import classify_session
from foldline.core.events import RequestHeader, ToolResult
from foldline.core.header import CallConfig
from foldline.demo import SYSTEM_PROMPT
from foldline.errors import ConfigError, ToolServerError, ToolServerUnavailable
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.loop.mcp import MCPServer, model_tool_name
from foldline.providers import emulated_provider
from foldline.providers.emulated import WireFormat
from foldline.providers.emulator import Emulator
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider, PlanScript, ThinkingPlan
from tests.mcp.conftest import REPO, processes_marked

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)


def agent_for(
    tools: Toolset, rounds: Sequence[Sequence[tuple[str, Mapping[str, Any]]]], session: str = "s"
) -> tuple[Agent, MemoryEventLog, MemoryAttachmentStore]:
    log, store = MemoryEventLog(), MemoryAttachmentStore()
    provider = emulated_provider(emulator=Emulator(PlanScript(rounds)))
    options = AgentOptions(CONFIG, system=SYSTEM_PROMPT, tools=tools)
    return Agent(session, log, provider, options, attachments=store), log, store


def tool_server(mark: str, name: str = "t", **kwargs: Any) -> MCPServer:
    env = {"FOLDLINE_TEST_MARK": mark, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
    return MCPServer(
        name, command=sys.executable, args=["-m", "tests.mcp_servers.tool_server", "stdio"], env=env, **kwargs
    )


def results(log: MemoryEventLog, session: str = "s") -> list[ToolResult]:
    return [e.data for e in log.read(session) if isinstance(e.data, ToolResult)]


def text_of(result: ToolResult) -> str:
    return "".join(p.text for p in result.content if isinstance(p, TextBlock))


def headers(log: MemoryEventLog, session: str = "s") -> list[RequestHeader]:
    return [e.data for e in log.read(session) if isinstance(e.data, RequestHeader)]


def assert_verifies(log: MemoryEventLog, store: MemoryAttachmentStore, session: str = "s") -> None:
    report = verify_events(session, log.read(session), store)
    assert report.ok, report
    assert report.checked > 0


def test_server_everything_over_stdio_runs_in_a_turn_and_stops_with_the_agent(everything: Path, mark: str) -> None:
    server = MCPServer("everything", command="node", args=[str(everything), "stdio"], env={"FOLDLINE_TEST_MARK": mark})
    tools = Toolset()
    tools.include(server)
    plan: list[list[tuple[str, dict[str, Any]]]] = [
        [("everything__echo", {"message": "hi"}), ("everything__get-sum", {"a": 2, "b": 40})],
        [("everything__get-tiny-image", {})],
        [("everything__get-structured-content", {"location": "Chicago"})],
    ]
    agent, log, store = agent_for(tools, plan)

    async def main() -> None:
        async with agent:
            assert processes_marked(mark), "the server runs while the agent is entered"
            names = [s.name for s in tools.specs()]
            assert "everything__echo" in names
            assert "everything__get-tiny-image" in names
            assert "everything__simulate-research-query" not in names  # a task-only tool is left out
            result = await agent.run_turn("go")
            assert result.reason == "completed"

    asyncio.run(main())
    assert processes_marked(mark) == [], "no server process outlives the agent's async with"
    got = results(log)
    assert [r.name for r in got] == [
        "everything__echo",
        "everything__get-sum",
        "everything__get-tiny-image",
        "everything__get-structured-content",
    ]
    assert text_of(got[0]) == "Echo: hi"
    assert "42" in text_of(got[1])
    images = [p for p in got[2].content if isinstance(p, ImageBlock)]
    assert len(images) == 1
    assert images[0].image.media_type == "image/png"
    assert store.get(images[0].image.attachment_id)  # kept by digest
    assert '"conditions"' in text_of(got[3])
    assert_verifies(log, store)


def test_server_everything_over_streamable_http(everything_http: str) -> None:
    tools = Toolset()
    tools.include(MCPServer("everything", url=everything_http))
    agent, log, store = agent_for(
        tools, [[("everything__get-sum", {"a": 1, "b": 2}), ("everything__echo", {"message": "x"})]]
    )

    async def main() -> None:
        async with agent:
            await agent.run_turn("go")

    asyncio.run(main())
    assert [text_of(r) for r in results(log)] == ["The sum of 1 and 2 is 3.", "Echo: x"]
    assert_verifies(log, store)


#: wire format → the provider its config names, and where a body puts a tool's schema
ORDERED_WIRES: dict[WireFormat, str] = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openai-responses": "openai",
    "deepseek": "deepseek",
}


@pytest.mark.parametrize("wire", list(ORDERED_WIRES))
def test_an_mcp_tool_schema_reaches_the_wire_in_the_servers_order_and_verifies(wire: WireFormat, mark: str) -> None:
    """The server lists ``reading``'s properties as declared (zeta, alpha, mid): every adapter sends them so, and the
    log rebuilds each body byte for byte (docs/FORMAT.md §1.9, §9.8)."""
    tools = Toolset()
    tools.include(tool_server(mark))
    log, store = MemoryEventLog(), MemoryAttachmentStore()
    provider = CapturingProvider(
        emulated_provider(wire, emulator=Emulator(ThinkingPlan([[("t__reading", {"zeta": "z", "alpha": 1})]])))
    )
    config = CallConfig(ORDERED_WIRES[wire], f"{wire}-emulated", max_tokens=256)
    agent = Agent("s", log, provider, AgentOptions(config, system=SYSTEM_PROMPT, tools=tools), attachments=store)

    async def main() -> None:
        async with agent:
            await agent.run_turn("go")

    asyncio.run(main())
    assert [text_of(r).startswith("recorded z 1 None") for r in results(log)] == [True]
    assert len(provider.bodies) == 2
    for body in provider.bodies:
        (schema,) = [
            t.get("input_schema") or t.get("parameters") or t["function"]["parameters"]
            for t in orjson.loads(body)["tools"]
            if t.get("name", t.get("function", {}).get("name")) == "t__reading"
        ]
        assert list(schema["properties"]) == ["zeta", "alpha", "mid"], wire
    assert_verifies(log, store)


def test_headers_go_with_every_request_to_an_http_server(tool_server_http: str) -> None:
    server = MCPServer("t", url=tool_server_http, headers={"Authorization": "Bearer s3cret"})

    async def main() -> str:
        tools = Toolset()
        tools.include(server)
        async with tools:
            out = await tools.call("t__whoami", "{}")
            assert not out.is_error, out
            return "".join(p.text for p in out.parts() if isinstance(p, TextBlock))

    assert "Bearer s3cret" in asyncio.run(main())


def test_a_list_change_is_a_change_snapshot_and_explains_the_next_cache_drop(mark: str) -> None:
    tools = Toolset()
    tools.include(tool_server(mark))
    plan: list[list[tuple[str, dict[str, Any]]]] = [
        [("t__add", {"a": 1, "b": 2})],
        [("t__grow", {})],
        [("t__extra", {"text": "abc"})],
    ]
    agent, log, store = agent_for(tools, plan)

    async def main() -> None:
        async with agent:
            await agent.run_turn("first")
            await agent.run_turn("second")

    asyncio.run(main())
    snapshots = headers(log)
    assert [h.reason for h in snapshots] == ["initial", "change"]
    before, after = (tuple(t.name for t in h.header.tools or ()) for h in snapshots)
    assert set(after) - set(before) == {"t__extra"}
    assert any(text_of(r).startswith("cba") for r in results(log))
    events = log.read("s")
    change_seq = next(e.seq for e in events if isinstance(e.data, RequestHeader) and e.data.reason == "change")
    verdicts = classify_session("s", events)
    dropped = [v.drop for v in verdicts if v.drop is not None and v.step.dispatch_seq > change_seq]
    assert dropped
    assert dropped[0].cause == "header-change", dropped
    assert all(d.cause != "unexplained" for d in (v.drop for v in verdicts) if d is not None)
    assert_verifies(log, store)


def test_a_server_that_dies_is_an_error_result_and_is_connected_again_at_the_next_step(
    mark: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = tool_server(mark)
    tools = Toolset()
    tools.include(server)
    agent, log, store = agent_for(tools, [[("t__crash", {})], [("t__add", {"a": 2, "b": 2})]])

    async def main() -> None:
        async with agent:
            with caplog.at_level(logging.WARNING, "foldline.mcp"):
                await agent.run_turn("go")

    asyncio.run(main())
    crash, add = results(log)
    assert crash.is_error
    assert "MCP server 't'" in text_of(crash), text_of(crash)
    assert not add.is_error
    assert text_of(add).startswith("4")
    assert server.connections == 2
    assert [h.reason for h in headers(log)] == ["initial"]  # the same list after the reconnect: no change
    assert any("connection lost" in r.getMessage() for r in caplog.records), caplog.text
    assert processes_marked(mark) == []
    assert_verifies(log, store)


def test_a_server_that_cannot_come_back_withdraws_its_tools_as_a_header_change(mark: str, tmp_path: Path) -> None:
    refuse = tmp_path / "refuse"
    server = tool_server(mark, env={"TOOL_SERVER_REFUSE": str(refuse)})
    tools = Toolset()

    @tools.tool
    def note(text: str) -> str:
        """Keep a note."""
        refuse.write_text("no restart")  # the server is told not to start again, then crashed
        return "noted"

    tools.include(server)
    agent, log, store = agent_for(
        tools, [[("note", {"text": "x"})], [("t__crash", {})], [("t__add", {"a": 1, "b": 1})]]
    )

    async def main() -> None:
        async with agent:
            await agent.run_turn("go")

    asyncio.run(main())
    snapshots = headers(log)
    assert [h.reason for h in snapshots] == ["initial", "change"]
    assert [t.name for t in snapshots[1].header.tools or ()] == ["note"]
    assert [r.name for r in results(log)] == ["note", "t__crash"]  # t__add was no longer offered
    assert processes_marked(mark) == []
    assert_verifies(log, store)


def test_a_call_over_its_time_limit_is_cancelled_at_the_server(mark: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    server = tool_server(mark, env={"TOOL_SERVER_JOURNAL": str(journal)}, tool_timeout_s=0.5)
    tools = Toolset()
    tools.include(server)
    agent, log, store = agent_for(tools, [[("t__slow", {"seconds": 30})]])

    async def main() -> None:
        async with agent:
            await agent.run_turn("go")
            for _ in range(100):  # the server hears the cancellation and stops the handler
                if "stop 30.0" in journal.read_text():
                    break
                await asyncio.sleep(0.1)

    asyncio.run(main())
    [slow] = results(log)
    assert slow.is_error
    assert "within its limit of 0.5 s" in text_of(slow)
    assert journal.read_text().split("\n")[:2] == ["start 30.0", "stop 30.0"]
    assert_verifies(log, store)


def test_garbage_from_a_server_is_an_error_result_and_the_session_stays_valid(
    mark: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = MCPServer(
        "g",
        command=sys.executable,
        args=["-m", "tests.mcp_servers.garbage_server"],
        env={"FOLDLINE_TEST_MARK": mark, "PYTHONPATH": str(REPO)},
        tool_timeout_s=1.0,
    )
    tools = Toolset()
    tools.include(server)
    agent, log, store = agent_for(tools, [[("g__ok", {"x": 1}), ("g__mute", {}), ("g__ok", {"x": "one"})]])

    async def main() -> list[str]:
        with caplog.at_level(logging.WARNING, "foldline.mcp"):
            async with agent:
                names = [s.name for s in tools.specs()]
                await agent.run_turn("go")
                return names

    names = asyncio.run(main())
    assert names == ["g__ok", "g__two_names", "g__mute"]  # an invalid schema and a taken name are left out
    assert "'badschema' is left out: the input schema is not valid JSON Schema" in caplog.text
    assert "'two_names' is left out: its name 'g__two_names' is taken" in caplog.text
    garbage, mute, wrong = results(log)
    assert garbage.is_error
    assert "something that is not MCP" in text_of(garbage)
    assert mute.is_error
    assert "within its limit of 1 s" in text_of(mute)
    assert wrong.is_error
    assert "argument `x`: 'one' is not of type 'integer'" in text_of(wrong)
    assert processes_marked(mark) == []
    assert_verifies(log, store)


def test_a_tool_list_the_sdk_refuses_is_a_typed_error_and_nothing_is_left_running(mark: str) -> None:
    server = MCPServer(
        "g",
        command=sys.executable,
        args=["-m", "tests.mcp_servers.garbage_server", "--not-object"],
        env={"FOLDLINE_TEST_MARK": mark, "PYTHONPATH": str(REPO)},
    )
    tools = Toolset()
    tools.include(server)
    agent, log, _ = agent_for(tools, [])

    async def main() -> None:
        async with agent:
            pass

    with pytest.raises(ToolServerError, match="answered tools/list with something that is not MCP"):
        asyncio.run(main())
    assert processes_marked(mark) == []
    assert log.read("s") == []


def test_a_server_that_cannot_start_is_a_typed_error(tmp_path: Path) -> None:
    tools = Toolset()
    tools.include(MCPServer("x", command=str(tmp_path / "no-such-server"), timeout_s=10))

    async def main() -> None:
        async with tools:
            pass

    with pytest.raises(ToolServerUnavailable, match="MCP server 'x': could not be started or reached"):
        asyncio.run(main())


def test_names_never_collide(mark: str, caplog: pytest.LogCaptureFixture) -> None:
    assert model_tool_name("files__", "read.file") == "files__read_file"
    long = model_tool_name("p__", "x" * 80)
    assert len(long) == 64
    assert long.startswith("p__xxx")
    assert long != model_tool_name("p__", "x" * 81)
    tools = Toolset()

    @tools.tool
    def add(a: int, b: int) -> str:
        """Our own add."""
        return "ours"

    tools.include(tool_server(mark, prefix=""))
    with pytest.raises(ConfigError, match="named 't' is included already"):
        tools.include(tool_server(mark))

    async def main() -> str:
        with caplog.at_level(logging.WARNING, "foldline.tools"):
            async with tools:
                names = [s.name for s in tools.specs()]
                assert names.count("add") == 1
                assert "slow" in names
                out = await tools.call("add", '{"a": 1, "b": 2}')
                return "".join(p.text for p in out.parts() if isinstance(p, TextBlock))

    assert asyncio.run(main()) == "ours"
    assert "tool 'add' of t is left out: the name is taken by this agent's own tools" in caplog.text


def test_an_agent_with_a_server_must_be_entered(mark: str) -> None:
    tools = Toolset()
    tools.include(tool_server(mark))
    agent, _, _ = agent_for(tools, [])
    with pytest.raises(ConfigError, match="use `async with agent:`"):
        asyncio.run(agent.run_turn("go"))
    assert processes_marked(mark) == []


def test_a_turn_that_fails_inside_the_block_still_stops_the_server(mark: str) -> None:
    tools = Toolset()
    tools.include(tool_server(mark))
    agent, _, _ = agent_for(tools, [])

    async def main() -> None:
        async with agent:
            assert processes_marked(mark)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(main())
    deadline = time.monotonic() + 5
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_marked(mark) == []
    assert os.environ.get("FOLDLINE_TEST_MARK") != mark


def test_a_servers_tools_wait_for_approval_as_its_policy_says(mark: str) -> None:
    from foldline.core.events import ApprovalRequest
    from foldline.loop.approvals import decide

    asked: list[tuple[str, dict[str, Any]]] = []

    def policy(name: str, args: dict[str, Any]) -> bool:
        asked.append((name, args))
        return name == "t__add" and int(args.get("a", 0)) > 100

    tools = Toolset()
    tools.include(tool_server(mark, approval=policy))
    agent, log, store = agent_for(tools, [[("t__add", {"a": 1, "b": 2}), ("t__add", {"a": 500, "b": 1})]])

    async def main() -> None:
        async with agent:
            paused = await agent.run_turn("add twice")
            assert paused.paused
            [held] = paused.pending
            assert results(log) == []  # neither call of the answer ran
            decide(log, "s", held.call_id, allow=False, reason="too large")
            assert (await agent.continue_turn()).reason == "completed"

    asyncio.run(main())
    assert asked == [("t__add", {"a": 1, "b": 2}), ("t__add", {"a": 500, "b": 1})]
    requests = [e.data for e in log.read("s") if isinstance(e.data, ApprovalRequest)]
    assert [r.name for r in requests] == ["t__add"]
    small, large = results(log)
    assert not small.is_error
    assert text_of(small).startswith("3")
    assert large.is_error
    assert "too large" in text_of(large)
    assert_verifies(log, store)
