"""Replay through the Python API over sessions recorded by real agents against the emulator.

Each recording is made by a real :class:`Agent` (real serializers, the emulator behind the real adapters); the
replay then runs the loop again with the recording as its provider and tools. An unchanged replay must build
every recorded request identically — through trims, compactions, new loop instances, refusals, paused turns,
failed and rejected turns, injected and tool-context messages — and a change must be found where it first
shows, with the cause named when the agent is not deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig
from foldline.core.content import TextBlock
from foldline.core.events import (
    AssistantMessage,
    CompactionStart,
    Envelope,
    RequestDispatch,
    RequestHeader,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from foldline.core.header import ToolSpec
from foldline.errors import InvalidChange, NothingToReplay, NotReplayable, ProviderError
from foldline.loop import Agent, AgentOptions, Enter, PreStepContext, Reject, ToolOutput, Toolset
from foldline.loop.pressure import PressurePolicy
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Conversation, Emulator, Reply, ToolLoopScript
from foldline.providers.emulator.faults import Fault, FaultPlan
from foldline.providers.streaming import AnswerProgress
from foldline.replay.verify import verify_events
from foldline.replayer import Change, Recording, SessionReplay, replay_recording, replay_sessions
from tests.factories import LogBuilder

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a replay test agent. " * 200


def tools() -> Toolset:
    out = Toolset()

    @out.tool
    def fetch(topic: str) -> str:
        """Fetch a long note about a topic."""
        return f"note on {topic}: " + "lorem ipsum dolor sit amet " * 60

    @out.tool
    def hint(topic: str) -> ToolOutput:
        """Answer and leave extra context for a later step."""
        return ToolOutput(f"hint about {topic}", additional_context=f"context for {topic}")

    return out


Setup = Callable[[Agent], None]


def record(
    turns: int,
    *,
    sid: str = "rec",
    system: str | Callable[[], str] = SYSTEM,
    config: CallConfig = CONFIG,
    pressure: PressurePolicy | None = None,
    emulator: Emulator | None = None,
    setup: Setup | None = None,
    log: MemoryEventLog | None = None,
    tool_steps: int = 2,
) -> Recording:
    """A session of ``turns`` turns recorded by a real agent (appended to ``log`` when given)."""
    log = log if log is not None else MemoryEventLog()
    emu = emulator if emulator is not None else Emulator(ToolLoopScript(tool_steps=tool_steps))
    provider = emulated_provider(emulator=emu)
    options = AgentOptions(config=config, system=system, tools=tools(), pressure=pressure)
    agent = Agent(sid, log, provider, options)
    if setup is not None:
        setup(agent)

    async def main() -> None:
        for t in range(turns):
            with contextlib.suppress(ProviderError):  # a turn the provider failed: logged, ended with reason error
                await agent.run_turn(f"question {t} about topic {t % 3}")

    asyncio.run(main())
    events = log.read(sid)
    assert verify_events(sid, events).ok
    return Recording(sid, events)


def replayed(recording: Recording, change: Change | None = None, **kw: object) -> SessionReplay:
    return asyncio.run(replay_recording(recording, change, **kw))  # type: ignore[arg-type]


def dispatches(recording: Recording) -> int:
    return sum(1 for e in recording.events if isinstance(e.data, RequestDispatch))


def assert_identical(recording: Recording) -> None:
    result = replayed(recording)
    assert result.divergence is None, result.summary()
    assert (result.status, result.compared, result.requests) == (
        "identical",
        dispatches(recording),
        dispatches(recording),
    )


def test_an_unchanged_agent_builds_every_recorded_request_through_trims_and_compactions() -> None:
    policy = PressurePolicy(
        900, keep_recent_tokens=300, trim_over_tokens=120, trim_keep_chars=40, summary_max_tokens=64
    )
    recording = record(10, pressure=policy)
    types = [e.type for e in recording.events]
    trims = [e for e in recording.events if isinstance(e.data, ToolResult) and e.data.surface_op != "append"]
    assert trims, "the recording should trim tool results"
    assert "compaction/start" in types, "the recording should compact"
    assert_identical(recording)
    # the agent's own policy, the same as the recording's, makes the same trims and compactions
    assert replayed(recording, Change(pressure=policy)).status == "identical"


def test_a_different_pressure_policy_is_found_at_the_first_request_it_changes() -> None:
    recording = record(6)
    result = replayed(recording, Change(pressure=PressurePolicy(700, keep_recent_tokens=200, trim_over_tokens=100)))
    d = result.divergence
    assert d is not None
    assert d.kind in ("messages", "sequence")
    if d.kind == "messages":  # a trim: the message it cut is named with its first differing field
        assert d.message_index is not None
        assert d.fields[0].path.startswith(f"messages[{d.message_index}].content[0].content")
        assert d.byte is not None
    else:  # a compaction where the recording had none
        assert d.note is not None
        assert "compacted" in d.note


def test_a_trim_that_differs_names_the_message_and_its_field() -> None:
    trim = PressurePolicy(900, keep_recent_tokens=300, trim_over_tokens=120, trim_keep_chars=40)
    recording = record(6, pressure=trim)
    first_trim = next(
        e.seq for e in recording.events if isinstance(e.data, ToolResult) and e.data.surface_op != "append"
    )
    # the same policy keeping more characters of each trimmed result: the messages differ, nothing else
    result = replayed(recording, Change(pressure=replace(trim, trim_keep_chars=80)))
    d = result.divergence
    assert d is not None
    assert d.kind == "messages", d.summary()
    assert d.seq > first_trim
    assert d.fields[0].path == f"messages[{d.message_index}].content[0].content[0].text"
    assert d.cost is not None
    assert d.cost.prefix.stops_at == f"messages[{d.message_index}]"
    assert 0 < d.cost.prefix.share < 1


def test_new_loop_instances_and_a_model_switch_replay_identically() -> None:
    log = MemoryEventLog()
    record(2, log=log)
    record(2, log=log, config=CONFIG.with_overrides(model="claude-emulated-2"))  # a new instance: a resume snapshot
    recording = record(1, log=log)
    reasons = [e.data.reason for e in recording.events if isinstance(e.data, RequestHeader)]
    assert reasons == ["initial", "resume", "resume"]
    assert_identical(recording)
    changed = replayed(recording, Change(model="claude-emulated-9"))
    assert changed.divergence is not None
    assert [f.path for f in changed.divergence.fields] == ["config.model"]


class Scripted(ToolLoopScript):
    """The tool loop, except: a refusal on the second turn, a paused answer on the fourth."""

    def reply(self, conversation: Conversation) -> Reply:
        last = next(t for t in reversed(conversation.turns) if t.role == "user")
        text = " ".join(getattr(p, "text", "") for p in last.parts)
        if "question 1 " in text:
            return Reply("I will not answer that.", stop="refusal")
        if "question 3 " in text and not any(t.role == "assistant" for t in conversation.turns[-1:]):
            return Reply("Working on it…", stop="pause_turn")
        return super().reply(conversation)


def test_refusals_paused_turns_and_failed_requests_replay_identically() -> None:
    emulator = Emulator(Scripted(), faults=FaultPlan({7: Fault("status", 400, message="bad request")}))
    recording = record(6, emulator=emulator)
    ends = [e.data.reason for e in recording.events if isinstance(e.data, TurnEnd)]
    assert "refusal" in ends
    assert "error" in ends
    resets = [e for e in recording.events if isinstance(e.data, UserMessage) and e.data.source == "refusal-reset"]
    assert resets, "the next turn should open with the refused turn removed"
    stops = {e.data.stop_reason for e in recording.events if isinstance(e.data, AssistantMessage)}
    assert "pause_turn" in stops
    assert_identical(recording)


def test_rejected_steps_injected_messages_and_tool_context_replay_identically() -> None:
    counter = itertools.count()

    def setup(agent: Agent) -> None:
        def gate(ctx: PreStepContext) -> Enter | Reject:
            n = next(counter)
            if n == 3:
                return Reject("not now")
            if n == 5:
                return Enter((agent.inbox.claim() or ()) + ())
            return Enter()

        agent.on_pre_step(gate)
        agent.inject("a note injected before the first turn")

    recording = record(6, setup=setup)
    sources = {e.data.source for e in recording.events if isinstance(e.data, UserMessage)}
    assert {"user", "inject", "tool-context"} <= sources
    assert "blocked" in [e.data.reason for e in recording.events if isinstance(e.data, TurnEnd)]
    assert_identical(recording)


def test_a_cancelled_turn_replays_identically() -> None:
    log = MemoryEventLog()
    record(1, log=log)
    inner = emulated_provider()

    class Slow(Provider):  # the model never answers: the turn is cancelled while it waits
        name, serializer = inner.name, inner.serializer

        async def send(
            self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
        ) -> ProviderResponse:
            await asyncio.sleep(10)
            raise AssertionError("unreachable")

    agent = Agent("rec", log, Slow(), AgentOptions(config=CONFIG, system=SYSTEM, tools=tools()))

    async def cancelled() -> None:
        task = asyncio.create_task(agent.run_turn("question 9"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    record(1, log=log)
    recording = Recording("rec", log.read("rec"))
    assert "aborted" in [e.data.reason for e in recording.events if isinstance(e.data, TurnEnd)]
    assert_identical(recording)


def test_a_change_late_in_the_session_is_found_at_that_request() -> None:
    steps = itertools.count()
    early = SYSTEM
    late = SYSTEM + " From now on, answer in French."

    def system() -> str:  # the recorded agent's prompt changed after its 7th request
        return early if next(steps) < 7 else late

    recording = record(4, system=system)
    assert [e.data.reason for e in recording.events if isinstance(e.data, RequestHeader)] == ["initial", "change"]
    assert_identical(recording)  # the recorded prompt is followed step by step
    result = replayed(recording, Change(system=early))  # the agent keeps the early prompt
    d = result.divergence
    assert d is not None
    assert (d.request, d.kind, [f.path for f in d.fields]) == (7, "header", ["system"])
    assert result.compared == 7
    assert d.cause == "change"
    assert d.unstable == ()
    assert d.system_diff[-1] == "+" + late or any(line.startswith("-") for line in d.system_diff)


def test_a_nondeterministic_system_prompt_hook_is_named_as_the_cause() -> None:
    recording = record(2)
    result = replayed(recording, Change(system=lambda: f"{SYSTEM} It is {time.time_ns()} ns now."))
    d = result.divergence
    assert d is not None
    assert d.cause == "nondeterministic"
    assert [f.path for f in d.unstable] == ["system"]
    assert "NOT DETERMINISTIC" in d.summary()
    # without the second run the cause is not looked for
    assert replayed(
        recording, Change(system=lambda: f"{time.time_ns()}"), check_determinism=False
    ).divergence.cause == (  # type: ignore[union-attr]
        "change"
    )


def test_a_random_id_in_a_tool_schema_is_named_as_the_cause() -> None:
    recording = record(2)

    def random_tools() -> Toolset:
        base = tools()
        out = Toolset()
        for spec in base.specs():
            schema = {**spec.input_schema, "$id": uuid.uuid4().hex} if spec.name == "hint" else spec.input_schema
            out.add(lambda **kw: "", ToolSpec(spec.name, spec.description, schema))
        return out

    d = replayed(recording, Change(tools=random_tools)).divergence
    assert d is not None
    assert d.cause == "nondeterministic"
    assert [f.path for f in d.unstable] == ["tools[1].inputSchema.$id"]
    assert [f.path for f in d.fields] == ["tools[1].inputSchema.$id"]


def test_a_deterministic_change_is_not_blamed_on_nondeterminism() -> None:
    recording = record(2)
    d = replayed(recording, Change(config={"temperature": 0.25, "maxTokens": 100})).divergence
    assert d is not None
    assert d.cause == "change"
    assert [f.path for f in d.fields] == ["config.maxTokens", "config.temperature"]
    assert d.fields[1].old is None
    assert d.fields[1].new == 0.25


def test_a_session_without_dispatch_records_and_a_cancelled_answer_are_typed_errors() -> None:
    with pytest.raises(NothingToReplay, match="no request/dispatch"):
        replayed(Recording("plain", LogBuilder().header().turn(0, "hi").events))
    events = list(record(1).events)
    last = events[-1]
    events.append(Envelope(last.seq + 1, last.time, UserMessage(f"u{last.seq + 1}", (TextBlock("x"),), "user")))
    with pytest.raises(NotReplayable, match="outside a step's opening"):  # after the turn: no loop writes it
        replayed(Recording("odd", events))


def test_an_answer_cut_by_a_cancelled_stream_is_not_replayable() -> None:
    recording = record(1)
    events = list(recording.events)
    at = next(i for i, e in enumerate(events) if isinstance(e.data, AssistantMessage))
    data = events[at].data
    assert isinstance(data, AssistantMessage)
    events[at] = Envelope(events[at].seq, events[at].time, msgspec.structs.replace(data, stop_reason="interrupted"))
    with pytest.raises(NotReplayable, match="cancelled"):
        replayed(Recording("rec", events))


def test_a_recording_that_does_not_rebuild_to_its_digest_is_not_replayable() -> None:
    recording = record(1)
    events = list(recording.events)
    at = next(i for i, e in enumerate(events) if isinstance(e.data, RequestDispatch))
    data = events[at].data
    assert isinstance(data, RequestDispatch)
    events[at] = Envelope(events[at].seq, events[at].time, msgspec.structs.replace(data, digest="sha256:" + "0" * 64))
    with pytest.raises(NotReplayable, match="does not rebuild to its logged digest"):
        replayed(Recording("rec", events))


def test_bad_changes_are_typed_errors() -> None:
    with pytest.raises(InvalidChange, match="unknown call-config field"):
        Change(config={"max_tokens": 5})
    with pytest.raises(InvalidChange, match="temperature"):
        Change(config={"temperature": 9.0})
    with pytest.raises(InvalidChange, match="model"):
        Change(model="  ")


def test_replay_sessions_reports_every_session_and_the_cost_over_them() -> None:
    emulator = Emulator(ToolLoopScript(tool_steps=1))  # one account: later sessions read the agent's prefix
    log = MemoryEventLog()
    recordings = [record(2, sid=f"s{i}", emulator=emulator, log=log) for i in range(3)]
    report = replay_sessions(recordings, Change(system="Be brief."), check_determinism=False)
    assert report.status == "diverged"
    assert report.exit_code == 1
    assert [s.divergence.request for s in report.sessions if s.divergence] == [0, 0, 0]
    costs = [s.divergence.cost for s in report.sessions if s.divergence]
    assert all(c is not None and c.measured for c in costs)
    # the first session wrote the agent's prefix; the others read it, and the new prompt makes them write it
    assert costs[0] is not None
    assert costs[0].cache_read_tokens == 0
    assert all(c is not None and c.cache_read_tokens > 0 and c.cache_write_tokens > 0 for c in costs[1:])
    total = sum(c.cache_write_tokens for c in costs if c is not None)
    assert report.cost.cache_write_tokens == total
    assert report.cost.per_1000_sessions == pytest.approx(total / 3 * 1000)
    # the emulator's model is priced as Claude Sonnet 4.5: each token written again costs 3.75 - 0.30 per million
    assert report.cost.money == total * (Decimal("3.75") - Decimal("0.30")) / 1_000_000
    assert replay_sessions(recordings).status == "identical"


def test_a_compaction_the_change_makes_differently_is_reported_in_the_summarize_call() -> None:
    policy = PressurePolicy(900, keep_recent_tokens=300, trim_over_tokens=None, summary_max_tokens=64)
    recording = record(8, pressure=policy)
    assert any(isinstance(e.data, CompactionStart) for e in recording.events)
    # a policy that summarizes with fewer tokens: the same compaction, another summarize request
    result = replayed(recording, Change(pressure=replace(policy, summary_max_tokens=48)))
    d = result.divergence
    assert d is not None
    assert d.kind == "compaction", d.summary()
    assert [f.path for f in d.fields] == ["max_tokens"]
    assert (d.fields[0].old, d.fields[0].new) == (64, 48)
    assert d.byte is not None


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.sampled_from(["turn", "inject", "prompt-change", "new-instance", "fail"]), min_size=1, max_size=7),
    st.booleans(),
)
def test_any_recorded_session_replays_identically_unchanged_and_diverges_first_in_system(
    script: list[str], under_pressure: bool
) -> None:
    """Random sessions — injected messages, prompt changes, new loop instances, failed requests, trims and
    compactions — replay identically through the unchanged agent; a new prompt diverges at the first request."""
    log = MemoryEventLog()
    system = [SYSTEM]
    policy = (
        PressurePolicy(900, keep_recent_tokens=300, trim_over_tokens=150, trim_keep_chars=30, summary_max_tokens=64)
        if under_pressure
        else None
    )
    faults = FaultPlan({i: Fault("status", 400) for i, action in enumerate(script) if action == "fail"})

    def agent() -> Agent:
        provider = emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=2), faults=faults))
        options = AgentOptions(config=CONFIG, system=lambda: system[0], tools=tools(), pressure=policy)
        return Agent("rnd", log, provider, options)

    current = agent()
    for i, action in enumerate(script):
        if action == "inject":
            current.inject(f"note {i}")
        elif action == "prompt-change":
            system[0] = SYSTEM + f" Version {i}."
        elif action == "new-instance":
            current = agent()
        with contextlib.suppress(ProviderError):
            asyncio.run(current.run_turn(f"question {i} on topic {i % 3}"))
    recording = Recording("rnd", log.read("rnd"))
    if not any(isinstance(e.data, RequestDispatch) for e in recording.events):
        return
    assert_identical(recording)
    d = replayed(recording, Change(system="A different agent."), check_determinism=False).divergence
    assert d is not None
    assert (d.request, [f.path for f in d.fields]) == (0, ["system"])


def test_a_compaction_whose_summarize_call_failed_replays_identically() -> None:
    policy = PressurePolicy(900, keep_recent_tokens=300, trim_over_tokens=None, summary_max_tokens=64)
    first = record(8, pressure=policy)
    calls = [e for e in first.events if isinstance(e.data, RequestDispatch | CompactionStart)]
    index = next(i for i, e in enumerate(calls) if isinstance(e.data, CompactionStart))  # the emulator's request index
    emulator = Emulator(ToolLoopScript(tool_steps=2), faults=FaultPlan({index: Fault("status", 400)}))
    recording = record(8, pressure=policy, emulator=emulator)
    types = [e.type for e in recording.events]
    start = types.index("compaction/start")
    assert types[start + 1] == "compaction/end", "the summarize call should have failed"
    assert_identical(recording)
