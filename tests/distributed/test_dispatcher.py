"""The dispatcher in-process: requests built from the fold, checked by the loop against the raw log, sent, answered.

The fold store here is the in-process one, fed by a small projector (the contract suite's ``ProjectingLog``)
that folds each appended batch a little later (on the event loop), so the dispatcher really waits for the
fold. What every StepDispatcher must do is the contract suite's (``tests/contracts/step_dispatch.py``); this
module tests what is the in-process dispatcher's own: its metrics, its body cache, its waits on the stores.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig
from foldline.core.content import ImageBlock, ImageRef, TextBlock, ToolCallBlock, ToolResultBlock
from foldline.core.events import (
    Envelope,
    RequestDispatch,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from foldline.core.fold import decode_message, encode_message, fold_state
from foldline.core.projection import Message, Session
from foldline.dispatcher import Dispatcher, StepHandoff
from foldline.dispatcher.decode import MessageCache, decode_fold_messages
from foldline.errors import (
    FoldTimeout,
    FormatError,
    InvariantViolation,
    StoreUnavailable,
)
from foldline.loop import Agent, AgentOptions
from foldline.loop.pressure import PressurePolicy
from foldline.metrics import DispatcherMetrics, LoopMetrics, new_registry
from foldline.ports.attachments import AttachmentMeta
from foldline.ports.event_log import EventLog, WriterLease
from foldline.ports.fold_store import FoldStore
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, Reply, ScriptedCall, ToolLoopScript
from foldline.replay.verify import rebuild_requests, verify_events
from tests.contracts.step_dispatch import CONFIG, SYSTEM, ProjectingLog, shape, ticking_clock, tools
from tests.factories import LogBuilder, Scripted


def options(dispatcher: Dispatcher | None) -> AgentOptions:
    return AgentOptions(CONFIG, system=SYSTEM, tools=tools(), dispatcher=dispatcher)


async def run_session(log: EventLog, session_id: str, dispatcher: Dispatcher | None, emulator: Emulator) -> None:
    agent = Agent(session_id, log, emulated_provider(emulator=emulator), options(dispatcher), clock=ticking_clock())
    await agent.run_turn(f"[{session_id}] first question")
    await agent.run_turn(f"[{session_id}] second question")


def dispatcher_for(
    folds: FoldStore,
    emulator: Emulator,
    *,
    metrics: DispatcherMetrics | None = None,
    max_concurrency: int = 64,
) -> Dispatcher:
    return Dispatcher(
        folds,
        {"anthropic": emulated_provider(emulator=emulator)},
        fold_timeout_s=2.0,
        metrics=metrics,
        max_concurrency=max_concurrency,
    )


async def case_dispatched_steps_log_exactly_what_a_local_loop_logs() -> None:
    local_log = MemoryEventLog()
    await run_session(local_log, "s-1", None, Emulator(ToolLoopScript(tool_steps=2)))

    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=2))
    metrics = DispatcherMetrics(new_registry(process=False))
    dispatcher = dispatcher_for(folds, emulator, metrics=metrics)
    await run_session(log, "s-1", dispatcher, emulator)
    await dispatcher.aclose()

    events = log.read("s-1")
    assert shape(events) == shape(local_log.read("s-1"))
    dispatches = [e for e in events if isinstance(e.data, RequestDispatch)]
    assert len(dispatches) == dispatcher.dispatched == 6
    assert any(isinstance(e.data, ToolCall) for e in events)
    report = verify_events("s-1", events)
    assert (report.ok, report.checked) == (True, 6)
    labels = {"provider": "anthropic", "model": "claude-emulated"}
    assert metrics.registry.get_sample_value("foldline_dispatch_duration_seconds_count", labels) == 6
    # a step reads and decodes only the fold's messages past what the session's previous step held: each
    # message of the last request was decoded exactly once
    *_, (_, _, last) = rebuild_requests("s-1", events)
    assert (dispatcher.messages.misses, dispatcher.messages.hits) == (len(last.messages), 0)


async def case_a_fold_that_never_arrives_times_out_and_nothing_is_sent() -> None:
    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    log.paused = True  # no projector
    emulator = Emulator()
    metrics = DispatcherMetrics(new_registry(process=False))
    dispatcher = Dispatcher(
        folds, {"anthropic": emulated_provider(emulator=emulator)}, fold_timeout_s=0.2, metrics=metrics
    )
    with pytest.raises(FoldTimeout, match="projector"):
        await run_session(log, "s-t", dispatcher, emulator)
    await dispatcher.aclose()
    assert metrics.registry.get_sample_value("foldline_dispatch_errors_total", {"kind": "FoldTimeout"}) == 1
    events = log.read("s-t")
    # the session's first step needs no fold (nothing is logged before it); the next one waits for the fold of
    # the first step, which never comes: nothing of it is sent
    assert emulator.requests == 1
    assert [(e.data.turn, e.data.step) for e in events if isinstance(e.data, RequestDispatch)] == [(0, 0)]
    assert isinstance(events[-1].data, TurnEnd)
    assert events[-1].data.reason == "error"


class DownAttachmentStore(MemoryAttachmentStore):
    """An attachment store that does not answer its first ``failures`` writes (an S3 outage)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.puts = 0

    def put(
        self, data: bytes, media_type: str, *, width: int | None = None, height: int | None = None
    ) -> AttachmentMeta:
        self.puts += 1
        if self.puts <= self.failures:
            raise StoreUnavailable("attachment store down")
        return super().put(data, media_type, width=width, height=height)


async def case_an_archive_store_outage_is_waited_out() -> None:
    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=1))
    store = DownAttachmentStore(failures=3)
    dispatcher = Dispatcher(
        folds, {"anthropic": emulated_provider(emulator=emulator)}, attachments=store, fold_timeout_s=2.0, outage_s=30
    )
    options = AgentOptions(CONFIG, system=SYSTEM, tools=tools(), dispatcher=dispatcher, archive_requests=True)
    agent = Agent("s-a", log, emulated_provider(emulator=emulator), options, clock=ticking_clock())
    await agent.run_turn("[s-a] a question while the store is down")
    await dispatcher.aclose()
    events = log.read("s-a")
    dispatches = [e.data for e in events if isinstance(e.data, RequestDispatch)]
    assert len(dispatches) == emulator.requests == 2
    assert store.puts == 3 + 2  # three writes unanswered, then one per step
    for d in dispatches:  # every body is archived under its digest
        assert store.get(d.digest).startswith(b"{")
    assert verify_events("s-a", events).ok


async def case_an_archive_store_outage_longer_than_the_limit_fails_the_step_before_sending() -> None:
    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    emulator = Emulator()
    dispatcher = Dispatcher(
        folds,
        {"anthropic": emulated_provider(emulator=emulator)},
        attachments=DownAttachmentStore(failures=1_000),
        fold_timeout_s=2.0,
        outage_s=0.3,
    )
    options = AgentOptions(CONFIG, system=SYSTEM, tools=tools(), dispatcher=dispatcher, archive_requests=True)
    agent = Agent("s-d", log, emulated_provider(emulator=emulator), options, clock=ticking_clock())
    with pytest.raises(StoreUnavailable, match="attachment store down"):
        await agent.run_turn("[s-d] a question while the store stays down")
    await dispatcher.aclose()
    assert emulator.requests == 0
    assert not any(isinstance(e.data, RequestDispatch) for e in log.read("s-d"))


class TamperingLog(ProjectingLog):
    """Projects like :class:`ProjectingLog`, then (once ``forging``) forges the fold's last message: a fold the
    log contradicts."""

    forging = False

    def project(self, session_id: str) -> None:
        super().project(session_id)
        if not self.forging:
            return
        state = self.folds.get(session_id)
        assert state is not None
        forged = encode_message(Message("user", (TextBlock("a message the log never held"),)))
        self.folds.put(dataclasses.replace(state, messages=(*state.messages[:-1], forged)))


async def case_a_fold_that_differs_from_the_log_is_refused_before_sending() -> None:
    folds = MemoryFoldStore()
    log = TamperingLog(folds)
    emulator = Emulator()
    loop_metrics = LoopMetrics(new_registry(process=False))
    dispatcher = dispatcher_for(folds, emulator)
    options = AgentOptions(CONFIG, system=SYSTEM, on_invariant_violation=loop_metrics.invariant_violation)
    agent = Agent("s-x", log, emulated_provider(emulator=emulator), options)
    agent.options.dispatcher = dispatcher
    await agent.run_turn("hello")  # a first turn the fold folds as logged
    log.forging = True
    with pytest.raises(InvariantViolation, match="the rebuild from the log serializes to"):
        await agent.run_turn("hello again")  # the loop's companion refuses the digest the forged fold built
    await dispatcher.aclose()
    assert emulator.requests == 1
    assert [e.data.turn for e in log.read("s-x") if isinstance(e.data, RequestDispatch)] == [0]
    assert loop_metrics.registry.get_sample_value("foldline_invariant_violations_total") == 1


async def case_a_repeated_prepare_keeps_one_body_and_sends_it_once() -> None:
    folds = MemoryFoldStore()
    builder = LogBuilder().header()
    for turn in range(3):
        builder.turn(turn, f"question {turn}")
    builder.add(TurnStart(3))
    builder.add(StepStart(3, 0))
    builder.user("the pending question")
    folds.put(fold_state(Session("s-r", builder.events), 0))
    emulator = Emulator()
    dispatcher = dispatcher_for(folds, emulator)
    handoff = StepHandoff("s-r", builder.seq, 3, 0, 1)
    first = await dispatcher.prepare(handoff)
    again = await dispatcher.prepare(handoff)  # a redelivered hand-over: the held body is replaced, not doubled
    assert (again.digest, again.bytes) == (first.digest, first.bytes)
    answer = await dispatcher.send(handoff, first)
    await dispatcher.aclose()
    assert answer.content
    assert (emulator.requests, dispatcher.rebuilt_for_send, dispatcher.dispatched) == (1, 0, 1)


class WritesLog(ProjectingLog):
    """A projecting log that keeps the types of each append's events, one list per write."""

    def __init__(self, folds: FoldStore) -> None:
        super().__init__(folds)
        self.writes: list[list[str]] = []

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        head = super().append(session_id, expected_seq, events, lease=lease)
        self.writes.append([type(e.data).__name__ for e in events])
        return head


async def case_a_step_is_two_writes_its_closing_going_with_the_next_opening() -> None:
    folds = MemoryFoldStore()
    log = WritesLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=2))
    dispatcher = dispatcher_for(folds, emulator)
    agent = Agent("s-w", log, emulated_provider(emulator=emulator), options(dispatcher), clock=ticking_clock())
    reported: list[tuple[int, bool]] = []
    # a step is reported once its closing is in the log
    agent.step_listeners.append(
        lambda r: reported.append((r.step, any(e.data == StepEnd(r.turn, r.step) for e in log.read("s-w"))))
    )
    result = await agent.run_turn("three steps: two with a tool call, then the answer")
    await dispatcher.aclose()
    assert len(result.steps) == 3
    assert reported == [(0, True), (1, True), (2, True)]
    # each step: its opening (after the previous step's closing, or the turn's start) with its request/dispatch,
    # then its answer; the last answer is written with its step/end and the turn's end — 6 writes, not 13
    assert log.writes == [
        ["TurnStart", "StepStart", "UserMessage", "RequestHeader", "RequestDispatch"],
        ["AssistantMessage", "ToolCall"],
        ["ToolResult", "StepEnd", "StepStart", "RequestDispatch"],
        ["AssistantMessage", "ToolCall"],
        ["ToolResult", "StepEnd", "StepStart", "RequestDispatch"],
        ["AssistantMessage", "StepEnd", "TurnEnd"],
    ]
    report = verify_events("s-w", log.read("s-w"))
    assert (report.ok, report.checked) == (True, 3)


async def case_a_failure_while_a_closing_is_held_writes_it_before_the_turn_ends() -> None:
    folds = MemoryFoldStore()
    log = WritesLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=2))
    dispatcher = dispatcher_for(folds, emulator)
    agent = Agent("s-f", log, emulated_provider(emulator=emulator), options(dispatcher), clock=ticking_clock())
    renders = []

    @agent.on_request
    def second_render_fails(config: CallConfig) -> CallConfig:
        renders.append(config)
        if len(renders) == 2:  # step 1's opening, while step 0's closing is held
            raise RuntimeError("a request hook broke")
        return config

    with pytest.raises(RuntimeError, match="a request hook broke"):
        await agent.run_turn("a tool call, then a broken hook")
    await dispatcher.aclose()
    events = log.read("s-f")
    results = [e.data for e in events if isinstance(e.data, ToolResult)]
    # the tool ran and its result is logged as it ran — not answered as interrupted by the turn's closing
    assert [(r.is_error, r.content) for r in results] == [(False, results[0].content)]
    assert "interrupted" not in str(results[0].content)
    assert log.writes[-2:] == [["ToolResult", "StepEnd"], ["TurnEnd"]]
    assert events[-1].data == TurnEnd(0, "error")
    assert verify_events("s-f", events).ok


def test_dispatched_steps_log_exactly_what_a_local_loop_logs() -> None:
    asyncio.run(case_dispatched_steps_log_exactly_what_a_local_loop_logs())


async def case_a_refusal_reset_is_written_before_the_hand_over() -> None:
    folds = MemoryFoldStore()
    log = WritesLog(folds)
    script = Scripted(
        Reply(None, (ScriptedCall("echo", {"text": "a"}),)),
        Reply("I can't help with that.", stop="refusal"),
        Reply("Sure."),
    )
    emulator = Emulator(script)
    dispatcher = dispatcher_for(folds, emulator)
    agent = Agent("s-r", log, emulated_provider(emulator=emulator), options(dispatcher), clock=ticking_clock())
    assert (await agent.run_turn("Do the bad thing.")).reason == "refusal"
    assert (await agent.run_turn("Something else then.")).reason == "completed"
    await dispatcher.aclose()
    # the next opening replaces the refused turn on the surface, which a fold delta cannot carry: it is written
    # before the hand-over (the fold then holds it), and request/dispatch alone after it
    assert log.writes[-3:] == [
        ["TurnStart", "StepStart", "UserMessage", "UserMessage"],
        ["RequestDispatch"],
        ["AssistantMessage", "StepEnd", "TurnEnd"],
    ]
    events = log.read("s-r")
    assert [u.data.source for u in events if isinstance(u.data, UserMessage)][-2:] == ["refusal-reset", "user"]
    report = verify_events("s-r", events)
    assert (report.ok, report.checked) == (True, 3)


class DownLog(WritesLog):
    """A projecting log whose appends fail while ``down`` (an outage longer than the loop waits)."""

    down = False

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if self.down:
            raise StoreUnavailable("the log is down (test)")
        return super().append(session_id, expected_seq, events, lease=lease)


async def case_an_opening_that_could_not_be_written_goes_back_to_the_inbox() -> None:
    folds = MemoryFoldStore()
    log = DownLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=0))
    dispatcher = dispatcher_for(folds, emulator)
    opts = dataclasses.replace(options(dispatcher), outage_s=0.05)
    agent = Agent("s-d", log, emulated_provider(emulator=emulator), opts, clock=ticking_clock())
    await agent.run_turn("the first question")
    log.down = True
    with pytest.raises(StoreUnavailable):
        await agent.run_turn("a question while the log is down")
    assert emulator.requests == 1  # prepared, never sent: its opening and request/dispatch were not written
    log.down = False
    result = await agent.run_turn("a question once it is back")
    await dispatcher.aclose()
    assert result.reason == "completed"
    events = log.read("s-d")
    # the held opening was given up: its claimed question went back to the inbox and enters with the next one
    asked = [
        b.text for e in events if isinstance(e.data, UserMessage) for b in e.data.content if isinstance(b, TextBlock)
    ]
    assert asked == ["the first question", "a question while the log is down", "a question once it is back"]
    assert [e.data.turn for e in events if isinstance(e.data, TurnStart)] == [0, 1]  # the unwritten one took none
    report = verify_events("s-d", events)
    assert (report.ok, report.checked) == (True, 2)


def test_a_step_is_two_writes_its_closing_going_with_the_next_opening() -> None:
    asyncio.run(case_a_step_is_two_writes_its_closing_going_with_the_next_opening())


def test_an_opening_that_could_not_be_written_goes_back_to_the_inbox() -> None:
    asyncio.run(case_an_opening_that_could_not_be_written_goes_back_to_the_inbox())


def test_a_refusal_reset_is_written_before_the_hand_over() -> None:
    asyncio.run(case_a_refusal_reset_is_written_before_the_hand_over())


def test_a_failure_while_a_closing_is_held_writes_it_before_the_turn_ends() -> None:
    asyncio.run(case_a_failure_while_a_closing_is_held_writes_it_before_the_turn_ends())


def test_a_fold_that_never_arrives_times_out_and_nothing_is_sent() -> None:
    asyncio.run(case_a_fold_that_never_arrives_times_out_and_nothing_is_sent())


def test_an_archive_store_outage_is_waited_out() -> None:
    asyncio.run(case_an_archive_store_outage_is_waited_out())


def test_an_archive_store_outage_longer_than_the_limit_fails_the_step_before_sending() -> None:
    asyncio.run(case_an_archive_store_outage_longer_than_the_limit_fails_the_step_before_sending())


def test_a_fold_that_differs_from_the_log_is_refused_before_sending() -> None:
    asyncio.run(case_a_fold_that_differs_from_the_log_is_refused_before_sending())


def test_a_repeated_prepare_keeps_one_body_and_sends_it_once() -> None:
    asyncio.run(case_a_repeated_prepare_keeps_one_body_and_sends_it_once())


texts = st.text(max_size=20)
text_blocks = texts.map(TextBlock)
image_blocks = st.builds(
    lambda n: ImageBlock(ImageRef("sha256:" + f"{n:064x}", "image/png", 10 + n, 3, 2)), st.integers(0, 99)
)
blocks = st.one_of(
    text_blocks,
    image_blocks,
    st.builds(ToolCallBlock, texts, texts, texts),
    st.builds(
        ToolResultBlock, texts, st.lists(st.one_of(text_blocks, image_blocks), max_size=3).map(tuple), st.booleans()
    ),
)
messages = st.builds(Message, st.sampled_from(["user", "assistant", "tool"]), st.lists(blocks, max_size=4).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, max_size=6))
def test_the_fast_fold_decoder_equals_the_core_decoder(batch: list[Message]) -> None:
    raw = tuple(encode_message(m) for m in batch)
    assert decode_fold_messages(raw) == tuple(decode_message(m) for m in raw) == tuple(batch)
    cache = MessageCache(capacity=3)
    assert cache.decode(raw) == cache.decode(raw) == cache.decode(raw[::-1])[::-1] == tuple(batch)
    assert len(cache._entries) <= 3


def test_a_fold_larger_than_the_message_cache_keeps_its_first_messages_cached() -> None:
    """Ten messages through a cache of six, read whole again and again: the first six stay cached, and each
    read after the first decodes only the other four (an LRU would decode all ten every time)."""
    raw = tuple(encode_message(Message("user", (TextBlock(f"message {i}"),))) for i in range(10))
    cache = MessageCache(capacity=6)
    first = cache.decode(raw)
    assert (cache.hits, cache.misses) == (0, 10)
    for _ in range(3):
        assert cache.decode(raw) == first
    assert (cache.hits, cache.misses) == (18, 22)
    assert list(cache._entries) == list(raw[:6])
    other = tuple(encode_message(Message("user", (TextBlock(f"other {i}"),))) for i in range(3))
    cache.decode(other)  # another session's messages take the room of the least recently used
    assert len(cache._entries) == 6
    assert set(other) <= set(cache._entries)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"role":"user","content":[{"type":"text","text":"x","extra":1}]}',
        b'{"role":"robot","content":[]}',
        b'{"role":"tool","content":[{"type":"tool-result","toolCallId":"c","content":[],"isError":1}]}',
        b'{"role":"user","content":[{"type":"text"',
    ],
)
def test_the_fast_fold_decoder_rejects_what_the_core_rejects(raw: bytes) -> None:
    with pytest.raises((FormatError, ValueError)) as core:
        decode_message(raw)
    with pytest.raises((FormatError, ValueError)) as fast:
        decode_fold_messages((encode_message(Message("user", ())), raw))
    assert (type(fast.value), str(fast.value)) == (type(core.value), str(core.value))


async def case_compaction_replaces_the_fold_and_dispatched_requests_still_verify() -> None:
    folds = MemoryFoldStore()
    log = ProjectingLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=2))
    dispatcher = dispatcher_for(folds, emulator)
    pressure = PressurePolicy(budget_tokens=300, keep_recent_tokens=120, trim_over_tokens=None, summary_max_tokens=64)
    options = AgentOptions(CONFIG, system="Be brief.", tools=tools(), dispatcher=dispatcher, pressure=pressure)
    agent = Agent("s-c", log, emulated_provider(emulator=emulator), options, clock=ticking_clock())
    for i in range(4):
        await agent.run_turn(f"question {i}: " + "tell me about folds " * 10)
    await dispatcher.aclose()
    events = log.read("s-c")
    assert any(e.type == "compaction/start" for e in events)
    state = folds.get("s-c")
    assert state is not None
    assert state.generation > 0  # the replace was folded by a rebuild, and later steps were built from it
    report = verify_events("s-c", events)
    assert report.ok
    assert report.checked == dispatcher.dispatched == sum(isinstance(e.data, RequestDispatch) for e in events)


def test_compaction_replaces_the_fold_and_dispatched_requests_still_verify() -> None:
    asyncio.run(case_compaction_replaces_the_fold_and_dispatched_requests_still_verify())
