"""The agent loop against the emulator through the real adapters."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig, RequestDispatch, RequestHeader, TextBlock, ToolResult, TurnEnd
from foldline.core.codec import digest_bytes
from foldline.core.events import Envelope, StepStart, UserMessage
from foldline.core.header import EpochHeader
from foldline.core.request import GenerateOptions
from foldline.core.wire import encode_event
from foldline.errors import ConfigError, InvariantViolation, ProviderError, RequestTooLarge
from foldline.loop import Agent, AgentOptions, Enter, PreStepContext, Reject, ToolOutput, Toolset
from foldline.ports.event_log import EventLog
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Conversation, Emulator, Reply, ScriptedCall, ToolLoopScript
from foldline.providers.streaming import AnswerProgress
from foldline.replay import is_loop_request
from foldline.replay.invariant import InvariantCompanion
from foldline.replay.verify import rebuild_requests, verify_events
from tests.factories import CapturingProvider

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a test agent. " * 300  # above the emulator's 1024-token cache minimum


def toolset() -> Toolset:
    tools = Toolset()

    @tools.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @tools.tool
    def explode(reason: str) -> str:
        """Always fails, to show errors reach the model."""
        raise RuntimeError(f"exploded: {reason}")

    @tools.tool
    def hint(topic: str) -> ToolOutput:
        """Answer and leave extra context for a later step."""
        return ToolOutput(f"hint about {topic}", additional_context=f"context for {topic}")

    return tools


def make_agent(
    log: EventLog,
    sid: str = "s",
    system: str | Callable[[], str] = SYSTEM,
    tool_steps: int = 2,
    *,
    archive_requests: bool = False,
) -> tuple[Agent, CapturingProvider]:
    provider = CapturingProvider(emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=tool_steps))))
    options = AgentOptions(config=CONFIG, system=system, tools=toolset(), archive_requests=archive_requests)
    return Agent(sid, log, provider, options), provider


def headers(log: EventLog, sid: str = "s") -> list[tuple[str, EpochHeader]]:
    return [(e.data.reason, e.data.header) for e in log.read(sid) if isinstance(e.data, RequestHeader)]


def test_turn_with_tools_is_logged_and_verifies() -> None:
    log = MemoryEventLog()
    agent, provider = make_agent(log)
    result = asyncio.run(agent.run_turn("hello"))
    assert result.reason == "completed"
    assert len(result.steps) == 3  # two tool rounds, then the answer
    events = log.read("s")
    types = [e.type for e in events]
    assert types[:4] == ["turn/start", "step/start", "user/message", "request/header"]
    assert types[-1] == "turn/end"
    dispatches = [e.data for e in events if isinstance(e.data, RequestDispatch)]
    assert [d.digest for d in dispatches] == [digest_bytes(b) for b in provider.bodies]
    report = verify_events("s", events)
    assert (report.checked, report.matched, report.ok) == (3, 3, True)


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["turn", "inject", "prompt-change", "new-instance"]), min_size=1, max_size=6))
def test_reconstruction_theorem_over_random_sessions(script: list[str]) -> None:
    """Every body the adapter sent equals the serialization of the rebuild from the log prefix."""
    log = MemoryEventLog()
    system = [SYSTEM]
    agent, provider = make_agent(log, system=lambda: system[0])
    sent: list[bytes] = []
    for i, action in enumerate(script):
        if action == "inject":
            agent.inject(f"note {i}")
        elif action == "prompt-change":
            system[0] = SYSTEM + f" Version {i}."
        elif action == "new-instance":
            sent += provider.bodies
            agent, provider = make_agent(log, system=lambda: system[0])
        asyncio.run(agent.run_turn(f"question {i}"))
    sent += provider.bodies
    rebuilt = [provider.serializer.serialize(req, None) for req in _rebuilt(log)]
    assert rebuilt == sent
    assert verify_events("s", log.read("s")).ok


def _rebuilt(log: EventLog) -> list[GenerateOptions]:
    return [req for _, _, req in rebuild_requests("s", log.read("s"))]


def test_append_extension_bytes_while_header_unchanged() -> None:
    log = MemoryEventLog()
    agent, provider = make_agent(log)
    asyncio.run(agent.run_turn("first"))
    asyncio.run(agent.run_turn("second"))
    bodies = provider.bodies
    assert len(bodies) == 6
    for prev, nxt in itertools.pairwise(bodies):
        # the previous body's message list, up to where it closes, is a byte prefix of the next body
        start = prev.index(b'"messages":[')
        close = prev.index(b'],"model"')
        assert nxt[:close] == prev[:close], "messages must extend byte for byte"
        assert nxt.index(b'"messages":[') == start


def test_cache_reads_after_first_request() -> None:
    log = MemoryEventLog()
    agent, _ = make_agent(log)
    r1 = asyncio.run(agent.run_turn("first"))
    r2 = asyncio.run(agent.run_turn("second"))
    usages = [s.usage for s in (*r1.steps, *r2.steps)]
    assert usages[0].cache_read == 0
    assert all(u.cache_read > 0 for u in usages[1:])
    ratio = sum(u.cache_read for u in usages[1:]) / sum(u.prompt_tokens for u in usages[1:])
    assert ratio > 0.9


def test_prompt_change_writes_change_snapshot_and_new_instance_writes_resume(tmp_path: Path) -> None:
    system = [SYSTEM]
    with SqliteEventLog(tmp_path) as log:
        agent, _ = make_agent(log, system=lambda: system[0])
        asyncio.run(agent.run_turn("one"))
        system[0] = SYSTEM + " Now be terse."
        asyncio.run(agent.run_turn("two"))
    with SqliteEventLog(tmp_path) as log:
        agent, _ = make_agent(log, system=lambda: system[0])
        asyncio.run(agent.run_turn("three"))
        reasons = [r for r, _ in headers(log)]
        assert reasons == ["initial", "change", "resume"]
        hs = [h for _, h in headers(log)]
        assert hs[1].system is not None
        assert hs[1].system.endswith("terse.")
        assert hs[2] == hs[1]  # no drift: the resume snapshot equals the last one
        assert verify_events("s", log.read("s")).ok


def test_request_hook_changes_only_config_and_inject_joins_next_request() -> None:
    log = MemoryEventLog()
    agent, provider = make_agent(log, tool_steps=0)
    seen: list[CallConfig] = []

    @agent.on_request
    def hook(seed: CallConfig) -> CallConfig:
        seen.append(seed)
        agent.inject("injected during agent/request")  # after the claim: must join a later request
        return seed.with_overrides(temperature=0.25)

    asyncio.run(agent.run_turn("hi"))
    first = provider.bodies[0]
    assert b"injected during agent/request" not in first
    assert b'"temperature":0.25' in first
    agent._request_hooks.clear()
    asyncio.run(agent.run_turn("again"))
    assert b"injected during agent/request" in provider.bodies[1]
    users = [e.data for e in log.read("s") if isinstance(e.data, UserMessage)]
    assert [u.source for u in users] == ["user", "inject", "user"]
    reasons = [r for r, _ in headers(log)]
    assert reasons == ["initial"]  # the hook's config is folded; the same config next time is no change


def test_a_config_assigned_on_the_options_takes_effect_as_a_logged_change() -> None:
    """`agent.options.config = ...` after the first request is no longer ignored: the next request starts
    from it, and the log holds a `change` snapshot that explains the new model; the one after is unchanged."""
    log = MemoryEventLog()
    agent, provider = make_agent(log, tool_steps=0)
    asyncio.run(agent.run_turn("one"))
    agent.options.config = CONFIG.with_overrides(model="claude-other", max_tokens=128)
    asyncio.run(agent.run_turn("two"))
    asyncio.run(agent.run_turn("three"))
    assert [(r, h.config.model, h.config.max_tokens) for r, h in headers(log)] == [
        ("initial", "claude-emulated", 256),
        ("change", "claude-other", 128),
    ]
    assert [b'"model":"claude-other"' in b for b in provider.bodies] == [False, True, True]
    assert verify_events("s", log.read("s")).ok


def test_options_read_once_refuse_a_later_assignment_and_so_does_a_new_options_object() -> None:
    log = MemoryEventLog()
    agent, _ = make_agent(log, tool_steps=0)
    for name, value in (("invariant", False), ("sender", None), ("invariant_full_check_every", 0)):
        with pytest.raises(ConfigError, match=f"AgentOptions.{name} is read when the Agent is built"):
            setattr(agent.options, name, value)
    assert agent.options.invariant is True
    with pytest.raises(ConfigError, match="keeps the AgentOptions it was built with"):
        agent.options = AgentOptions(CONFIG)
    agent.options.max_steps_per_turn = 3  # read at every step: assigning it is fine
    fresh = AgentOptions(CONFIG)
    fresh.invariant = False  # options no Agent has read yet are plain values
    assert fresh.invariant is False


def test_a_config_naming_another_provider_than_the_adapter_is_refused() -> None:
    """An OpenAI call config on the Anthropic adapter was accepted: the Anthropic body went out and the log
    said openai. It is refused, at construction or when a hook proposes it, and nothing is sent."""
    log = MemoryEventLog()
    anthropic = emulated_provider("anthropic")
    with pytest.raises(ConfigError, match="names provider 'openai', but this loop sends through the 'anthropic'"):
        Agent("s", log, anthropic, AgentOptions(CallConfig("openai", "gpt-emulated")))
    agent, provider = make_agent(log, "t", tool_steps=0)
    agent.on_request(lambda seed: seed.with_overrides(provider="openai"))
    with pytest.raises(ConfigError, match="names provider 'openai'"):
        asyncio.run(agent.run_turn("hi"))
    assert provider.bodies == []
    assert not any(isinstance(e.data, RequestDispatch) for e in log.read("t"))
    agent, provider = make_agent(log, "u", tool_steps=0)
    asyncio.run(agent.run_turn("hi"))
    agent.options.config = CallConfig("openai", "gpt-emulated")
    for _ in range(2):  # refused each time, never quietly dropped for the folded config
        with pytest.raises(ConfigError, match="names provider 'openai'"):
            asyncio.run(agent.run_turn("again"))
    assert len(provider.bodies) == 1


def test_pre_step_reject_opens_no_step_and_enter_adds_messages() -> None:
    log = MemoryEventLog()
    agent, provider = make_agent(log, tool_steps=0)
    decisions: list[Enter | Reject] = [Reject("busy"), Enter()]

    @agent.on_pre_step
    def gate(ctx: PreStepContext) -> Enter | Reject:
        decision = decisions.pop(0) if decisions else Enter()
        if isinstance(decision, Enter) and ctx.batch:
            from foldline.loop import InboxItem

            return Enter((InboxItem((TextBlock("from the pre-step hook"),), "pre-step"),))
        return decision

    r1 = asyncio.run(agent.run_turn("first try"))
    assert r1.reason == "blocked"
    assert provider.bodies == []
    assert "step/start" not in [e.type for e in log.read("s")]
    r2 = asyncio.run(agent.run_turn())
    assert r2.reason == "completed"
    users = [e.data for e in log.read("s") if isinstance(e.data, UserMessage)]
    assert [(u.source, u.content) for u in users] == [
        ("user", (TextBlock("first try"),)),
        ("pre-step", (TextBlock("from the pre-step hook"),)),
    ]


class CallInOrder:
    """A script that makes one scripted tool call per step, in order, then answers."""

    def __init__(self, *calls: ScriptedCall) -> None:
        self.calls = calls

    def reply(self, conversation: Conversation) -> Reply:
        done = sum(1 for turn in conversation.turns if turn.role == "assistant")
        if done < len(self.calls):
            return Reply(f"calling {self.calls[done].name}", (self.calls[done],))
        return Reply("done")


def test_tool_errors_and_additional_context() -> None:
    tools = toolset()
    res = asyncio.run(tools.call("explode", '{"reason": "x"}'))
    assert res.is_error
    assert "exploded: x" in str(res.content)
    assert asyncio.run(tools.call("echo", "not json")).is_error
    assert asyncio.run(tools.call("echo", '{"wrong": 1}')).is_error
    assert asyncio.run(tools.call("missing", "{}")).is_error
    log = MemoryEventLog()
    script = CallInOrder(ScriptedCall("explode", {"reason": "x"}), ScriptedCall("hint", {"topic": "caching"}))
    provider = CapturingProvider(emulated_provider(emulator=Emulator(script)))
    agent = Agent("s", log, provider, AgentOptions(config=CONFIG, system=SYSTEM, tools=toolset()))
    result = asyncio.run(agent.run_turn("go"))
    assert (result.reason, len(result.steps)) == ("completed", 3)
    events = log.read("s")
    results = [(e.seq, e.data) for e in events if isinstance(e.data, ToolResult)]
    assert [(r.name, r.is_error, r.content) for _, r in results] == [
        ("explode", True, (TextBlock("RuntimeError: exploded: x"),)),
        ("hint", False, (TextBlock("hint about caching"),)),
    ]
    # the hint's additional context is claimed by the next step, as a user/message of its own source
    users = [(e.seq, e.data) for e in events if isinstance(e.data, UserMessage)]
    assert [(u.source, u.content) for _, u in users] == [
        ("user", (TextBlock("go"),)),
        ("tool-context", (TextBlock("context for caching"),)),
    ]
    context_seq = users[1][0]
    hint_seq = results[1][0]
    opened = [e.data for e in events if isinstance(e.data, StepStart) and hint_seq < e.seq < context_seq]
    assert opened == [StepStart(0, 2)]
    assert b"context for caching" not in provider.bodies[1]
    assert b"context for caching" in provider.bodies[2]
    assert verify_events("s", events).ok


class FailingProvider(Provider):
    def __init__(self, inner: Provider) -> None:
        self.name, self.serializer = inner.name, inner.serializer

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        raise ProviderError("provider returned 529 overloaded")


def test_provider_error_ends_turn_with_error_and_log_stays_valid() -> None:
    log = MemoryEventLog()
    agent, _ = make_agent(log)
    agent.provider = FailingProvider(agent.provider)
    with pytest.raises(ProviderError):
        asyncio.run(agent.run_turn("hi"))
    events = log.read("s")
    assert events[-1].data == TurnEnd(0, "error")
    assert events[-2].type == "step/end"
    agent2, _ = make_agent(log)  # a new instance resumes on the consistent log
    assert asyncio.run(agent2.run_turn("again")).reason == "completed"
    assert verify_events("s", log.read("s")).ok


def test_cancellation_aborts_turn() -> None:
    log = MemoryEventLog()
    agent, _ = make_agent(log)

    class Slow(Provider):
        name, serializer = agent.provider.name, agent.provider.serializer

        async def send(
            self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
        ) -> ProviderResponse:
            await asyncio.sleep(10)
            raise AssertionError("unreachable")

    agent.provider = Slow()

    async def main() -> None:
        task = asyncio.create_task(agent.run_turn("hi"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log.read("s")[-1].data == TurnEnd(0, "aborted")
    assert verify_events("s", log.read("s")).ok


def test_invariant_refuses_a_request_that_differs_from_the_log() -> None:
    log = MemoryEventLog()
    agent, _ = make_agent(log)
    asyncio.run(agent.run_turn("hi"))
    companion = InvariantCompanion(log)
    good = agent.last_request
    assert good is not None
    assert is_loop_request(good)
    # a request built from a cache that drifted from the log: one extra message the log never saw
    from foldline.core.projection import Message
    from foldline.replay.registry import mark_loop_request

    drifted = mark_loop_request(
        GenerateOptions(good.config, good.system, good.tools, (*good.messages, Message("user", (TextBlock("x"),))))
    )
    upto = max(e.seq for e in log.read("s") if isinstance(e.data, RequestDispatch))
    asyncio.run(companion.check("s", upto, good))  # the real request equals its rebuild
    with pytest.raises(InvariantViolation) as info:
        asyncio.run(companion.check("s", upto, drifted))
    assert "rebuilt-from-log" in info.value.diff
    assert '+          "text": "x",' in info.value.diff
    # a one-shot of any shape is outside the invariant
    asyncio.run(companion.check("s", upto, GenerateOptions(good.config, good.system, good.tools, drifted.messages)))


def test_stale_writer_is_fenced(tmp_path: Path) -> None:
    from foldline.errors import FencedError

    with SqliteEventLog(tmp_path) as log:
        old, _ = make_agent(log)
        asyncio.run(old.run_turn("one"))
        new, _ = make_agent(log)
        with pytest.raises(FencedError):
            asyncio.run(old.run_turn("stale"))
        assert asyncio.run(new.run_turn("two")).reason == "completed"
        assert verify_events("s", log.read("s")).ok


def test_archived_bodies_give_the_first_differing_offset(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    log = MemoryEventLog()
    agent, _ = make_agent(log, archive_requests=True)
    agent.attachments = store
    asyncio.run(agent.run_turn("hi"))
    events = log.read("s")
    # tamper: rewrite the first user message in a copy of the log
    tampered = [
        Envelope(e.seq, e.time, UserMessage(e.data.id, (TextBlock("HI"),), e.data.source))
        if isinstance(e.data, UserMessage)
        else e
        for e in events
    ]
    report = verify_events("s", tampered, store)
    assert not report.ok
    first = report.mismatched[0]
    assert first.first_diff_offset is not None
    original = store.get(first.recorded)
    assert original[first.first_diff_offset : first.first_diff_offset + 2] == b"hi"


def test_a_request_body_over_the_limit_is_neither_logged_nor_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The body the loop would send is checked against MAX_REQUEST_BODY_BYTES (32 MiB; lowered here so the
    test needs no 32 MiB session): over it, RequestTooLarge, no request/dispatch, nothing sent, the turn ends
    with an error and the log still verifies."""
    from foldline.core import limits

    log = MemoryEventLog()
    agent, provider = make_agent(log, tool_steps=0)
    asyncio.run(agent.run_turn("a first, small turn"))
    monkeypatch.setattr(limits, "MAX_REQUEST_BODY_BYTES", len(provider.bodies[0]) + 1000)
    with pytest.raises(RequestTooLarge, match=r"over the [0-9,]+-byte limit of one request"):
        asyncio.run(agent.run_turn("x" * 2000))
    assert len(provider.bodies) == 1
    events = log.read("s")
    assert sum(isinstance(e.data, RequestDispatch) for e in events) == 1
    assert [e.data.reason for e in events if isinstance(e.data, TurnEnd)] == ["completed", "error"]
    assert verify_events("s", events).ok


def test_a_tool_result_over_the_limit_is_cut_and_kept_whole_in_the_attachment_store(tmp_path: Path) -> None:
    """A tool returning 6 MB of text (quotes and control characters included, which JSON escapes) does not
    make an event over the limit: the result is cut to AgentOptions.max_tool_result_bytes, the whole output
    is in the attachment store under the digest the result names, and every request verifies."""
    big = ('"quoted"\x01\n' * 600_000)[:6_000_000]
    tools = Toolset()

    @tools.tool
    def dump(path: str) -> str:
        """Return a very large file."""
        return big

    store = FilesystemAttachmentStore(tmp_path / "attachments")
    script = ToolLoopScript(tool_steps=1)  # the only tool is called once
    provider = emulated_provider(emulator=Emulator(script))
    with SqliteEventLog(tmp_path) as log:
        agent = Agent("s", log, provider, AgentOptions(CONFIG, tools=tools), attachments=store)
        asyncio.run(agent.run_turn("read it"))
        events = log.read("s")
        (result,) = [e for e in events if isinstance(e.data, ToolResult)]
        assert len(encode_event(result)) <= agent.options.max_tool_result_bytes + 4096
        assert isinstance(result.data, ToolResult)
        *shown, note = result.data.content
        assert isinstance(note, TextBlock)
        assert all(isinstance(p, TextBlock) for p in shown)
        digest = digest_bytes(big.encode())
        assert f"the tool returned {len(big.encode()):,} bytes of text" in note.text
        assert f"The whole output is attachment {digest} (text/plain" in note.text
        assert store.get(digest) == big.encode()
        text = "".join(p.text for p in shown if isinstance(p, TextBlock))
        assert len(text) > 500_000  # ~1 MiB once JSON escapes its quotes and control characters
        assert text == big[: len(text)]
        assert verify_events("s", events, store).ok
    agent = Agent(
        "t", MemoryEventLog(), emulated_provider(emulator=Emulator(script)), AgentOptions(CONFIG, tools=tools)
    )
    asyncio.run(agent.run_turn("read it"))
    (result,) = [e for e in agent.log.read("t") if isinstance(e.data, ToolResult)]
    assert result.data.content[-1].text.endswith("The rest was not kept.]")  # type: ignore[union-attr]
