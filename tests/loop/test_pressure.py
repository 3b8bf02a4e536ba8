"""Compaction, tool-result trimming, resume, fork and images in the loop, against the emulator."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig, TextBlock
from foldline.core.compaction import SUMMARY_HEADING, TRIM_MARKER, estimate_tokens
from foldline.core.content import ImageBlock, Usage
from foldline.core.diff import snapshot_diffs
from foldline.core.events import (
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    ToolResult,
    TurnEnd,
    UserMessage,
)
from foldline.core.projection import Session
from foldline.demo import demo_png
from foldline.errors import AttachmentCorrupt, AttachmentNotFound, ValidationError
from foldline.loop import Agent, AgentOptions, ToolOutput, Toolset
from foldline.loop.fork import fork_session
from foldline.loop.pressure import PressurePolicy, relieve_pressure
from foldline.ports.attachments import AttachmentStore
from foldline.ports.event_log import EventLog
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replay import is_loop_request
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a test agent. " * 300  # above the emulator's 1024-token cache minimum


FIXED_CLOCK = 1_700_000_000.0


def big_tools(store: AttachmentStore | None = None) -> Toolset:
    tools = Toolset()

    @tools.tool
    def dump(topic: str) -> str:
        """Return a long report about a topic (its size depends on the topic)."""
        size = 200 + hashlib.sha256(topic.encode()).digest()[0] * 12
        return (f"{topic}: " + "lorem ipsum dolor sit amet " * 200)[:size]

    @tools.tool
    def note(topic: str) -> str:
        """Return a short note."""
        return f"note on {topic}"

    if store is not None:

        @tools.tool
        def swatch(color: str) -> ToolOutput:
            """Return a small image swatch for a colour."""
            meta = store.put(demo_png(8, 8, len(color)), "image/png")
            return ToolOutput((TextBlock(f"swatch {color}"), ImageBlock(meta.image_ref())))

    return tools


def make(
    log: EventLog,
    emulator: Emulator,
    *,
    sid: str = "s",
    pressure: PressurePolicy | None = None,
    store: AttachmentStore | None = None,
    config: CallConfig = CONFIG,
) -> tuple[Agent, CapturingProvider]:
    provider = CapturingProvider(emulated_provider(emulator=emulator))
    options = AgentOptions(config=config, system=SYSTEM, tools=big_tools(store), pressure=pressure)
    return Agent(sid, log, provider, options, attachments=store), provider


def fixed_emulator(tool_steps: int = 2) -> Emulator:
    return Emulator(ToolLoopScript(tool_steps=tool_steps), clock=lambda: FIXED_CLOCK)


def run_turns(agent: Agent, prompts: Sequence[str]) -> None:
    for p in prompts:
        asyncio.run(agent.run_turn(p))


# ---------------------------------------------------------------------------- compaction


def test_compaction_is_logged_replayable_and_costs_one_cache_drop() -> None:
    log = MemoryEventLog()
    policy = PressurePolicy(budget_tokens=900, keep_recent_tokens=300, trim_over_tokens=None)
    agent, provider = make(log, fixed_emulator(), pressure=policy)
    run_turns(agent, [f"question {i}" for i in range(6)])
    events = log.read("s")
    starts = [(e.seq, e.data) for e in events if isinstance(e.data, CompactionStart)]
    assert starts, "the budget must have forced at least one compaction"
    for seq, start in starts:
        summary, replacing, end = events[seq + 1], events[seq + 2], events[seq + 3]
        assert isinstance(summary.data, CompactionSummary)
        assert (summary.data.provider, summary.data.model, summary.data.max_tokens) == (
            "anthropic",
            "claude-emulated",
            policy.summary_max_tokens,
        )
        assert summary.data.usage is not None
        assert summary.data.usage.output > 0
        assert isinstance(replacing.data, UserMessage)
        assert replacing.data.source == "compaction"
        assert replacing.data.surface_op == ReplaceOp(start.start, start.end)
        assert isinstance(replacing.data.content[0], TextBlock)
        assert replacing.data.content[0].text.startswith(SUMMARY_HEADING)
        assert isinstance(end.data, CompactionEnd)
        # the hidden nodes are exactly the replaced surface entries, listed
        before = Session("x", events[:seq])
        hidden = tuple(n.seq for n in before.rules.surface[start.start : start.end + 1])
        assert replacing.data.source_event_seqs == hidden
        assert start.estimated_tokens == estimate_tokens(before.derive_messages())
    # the theorem: every loop request verifies, the compactions recheck
    report = verify_events("s", events)
    assert report.ok
    assert report.checked == len(provider.bodies) - len(starts)
    # the summarize calls went through the same provider but are not loop requests: one extra body each
    dispatched = {e.data.digest for e in events if isinstance(e.data, RequestDispatch)}
    one_shots = [b for b in provider.bodies if hashlib.sha256(b).hexdigest() not in {d[7:] for d in dispatched}]
    assert len(one_shots) == len(starts)
    assert all(b'"tools"' not in b for b in one_shots)
    # after compaction the context is back under budget
    assert estimate_tokens(agent.session.derive_messages()) < 900 + 400
    # the first request after each compaction is the only cache-read drop
    firsts = {next(d for d, _ in _answered(events) if d > seq) for seq, _ in starts}
    assert set(_drop_dispatches(events)) == firsts


def _answered(events: Sequence[Envelope]) -> list[tuple[int, Usage]]:
    """(seq of each request/dispatch, usage of the answer to it)."""
    out = []
    for i, e in enumerate(events):
        if isinstance(e.data, RequestDispatch):
            usage = next(
                a.data.usage for a in events[i:] if isinstance(a.data, AssistantMessage) and a.data.usage is not None
            )
            out.append((e.seq, usage))
    return out


def _drop_dispatches(events: Sequence[Envelope]) -> list[int]:
    """Requests that read less from the cache than the whole prompt of the request before them."""
    answered = _answered(events)
    return [d for (_, prev), (d, u) in itertools.pairwise(answered) if u.cache_read < prev.prompt_tokens]


def test_summarize_request_is_not_a_loop_request() -> None:
    log = MemoryEventLog()
    agent, _ = make(log, fixed_emulator(), pressure=None)
    run_turns(agent, ["one", "two", "three"])
    action = asyncio.run(relieve_pressure(agent.context, PressurePolicy(budget_tokens=50, keep_recent_tokens=10)))
    assert action is not None
    assert action.kind == "compaction"
    assert action.summarize_request is not None
    assert not is_loop_request(action.summarize_request)
    assert agent.last_request is not None
    assert is_loop_request(agent.last_request)
    # the companion skips one-shots whatever they look like
    assert agent.invariant is not None
    asyncio.run(agent.invariant.check("s", 0, action.summarize_request))


def test_verify_flags_a_forged_compaction_replacement() -> None:
    log = MemoryEventLog()
    agent, _ = make(log, fixed_emulator(), pressure=PressurePolicy(budget_tokens=600, keep_recent_tokens=200))
    run_turns(agent, [f"q{i}" for i in range(4)])
    events = log.read("s")
    forged = [_forge(e) if isinstance(e.data, UserMessage) and e.data.source == "compaction" else e for e in events]
    assert forged != events
    report = verify_events("s", forged)
    assert not report.ok
    assert any(
        "not the content derived from the logged compaction/summary" in u.reason for u in report.unreconstructable
    )


def test_verify_proves_the_summarize_body_by_its_logged_digest() -> None:
    log = MemoryEventLog()
    agent, provider = make(log, fixed_emulator(), pressure=PressurePolicy(budget_tokens=600, keep_recent_tokens=200))
    run_turns(agent, [f"q{i}" for i in range(4)])
    events = log.read("s")
    summaries = [e for e in events if isinstance(e.data, CompactionSummary)]
    assert summaries
    sent = {"sha256:" + hashlib.sha256(b).hexdigest() for b in provider.bodies}
    for e in summaries:
        assert isinstance(e.data, CompactionSummary)
        assert (e.data.serializer, e.data.serializer_version) == ("anthropic-messages", 5)
        assert e.data.prompt_version == 1
        assert e.data.input_digest in sent
    target = summaries[0].seq
    other = "sha256:" + "0" * 64
    forged = [
        Envelope(e.seq, e.time, msgspec.structs.replace(e.data, input_digest=other))
        if e.seq == target and isinstance(e.data, CompactionSummary)
        else e
        for e in events
    ]
    report = verify_events("s", forged)
    assert not report.ok
    assert any("the rebuilt summarize body has digest" in u.reason for u in report.unreconstructable)


def _forge(e: Envelope) -> Envelope:
    assert isinstance(e.data, UserMessage)
    d = e.data
    forged = UserMessage(d.id, (TextBlock("made up"),), d.source, d.surface_op, d.source_event_seqs)
    return Envelope(e.seq, e.time, forged)


def test_replace_hiding_a_node_without_listing_it_is_rejected() -> None:
    log = MemoryEventLog()
    agent, _ = make(log, fixed_emulator())
    run_turns(agent, ["hello"])
    session = agent.session
    nodes = session.rules.surface
    seq = session.next_seq
    bad = [
        Envelope(seq, 0, CompactionStart(0, 1, 10)),
        Envelope(seq + 1, 0, CompactionSummary("s", "anthropic", "claude-emulated", 64)),
        Envelope(seq + 2, 0, UserMessage("u", (TextBlock("s"),), "compaction", ReplaceOp(0, 1), (nodes[0].seq,))),
    ]
    with pytest.raises(ValidationError) as info:
        log.append("s", seq, bad)
    assert info.value.rule == "replace-lists-hidden"
    assert str(nodes[1].seq) in str(info.value)
    assert log.head("s") == seq  # nothing written


# ---------------------------------------------------------------------------- trimming


def test_trims_are_batched_into_one_logged_replace_run_and_one_drop() -> None:
    log = MemoryEventLog()
    emulator = fixed_emulator()
    agent, provider = make(log, emulator)
    run_turns(agent, [f"topic {i}" for i in range(4)])
    before = len(log.read("s"))
    # a budget that trims can satisfy, so no compaction
    estimate = estimate_tokens(agent.session.derive_messages())
    policy = PressurePolicy(
        budget_tokens=estimate - 200, keep_recent_tokens=150, trim_over_tokens=100, trim_keep_chars=40
    )
    action = asyncio.run(relieve_pressure(agent.context, policy))
    assert action is not None
    assert action.kind == "trim"
    assert action.trimmed >= 2
    appended = log.read("s", before)
    assert all(isinstance(e.data, ToolResult) and isinstance(e.data.surface_op, ReplaceOp) for e in appended)
    assert len(appended) == action.trimmed
    for e in appended:
        assert isinstance(e.data, ToolResult)
        assert isinstance(e.data.surface_op, ReplaceOp)
        assert e.data.surface_op.start == e.data.surface_op.end
        assert isinstance(e.data.content[0], TextBlock)
        assert TRIM_MARKER in e.data.content[0].text
    # the next turn: its first request is the only cache-read drop
    usages_before = len(provider.bodies)
    run_turns(agent, ["after the trim"])
    steps = [e.data.usage for e in log.read("s", before) if isinstance(e.data, AssistantMessage)]
    assert len(steps) == len(provider.bodies) - usages_before
    assert _drops(steps, previous_prompt=_last_prompt(log.read("s", 0, before))) == [0]
    assert verify_events("s", log.read("s")).ok


def _last_prompt(events: Sequence[Envelope]) -> int:
    usages = [e.data.usage for e in events if isinstance(e.data, AssistantMessage) and e.data.usage]
    return usages[-1].prompt_tokens


def _drops(usages: Sequence[Usage | None], previous_prompt: int) -> list[int]:
    out = []
    prev = previous_prompt
    for i, u in enumerate(usages):
        assert u is not None
        if u.cache_read < prev:
            out.append(i)
        prev = u.prompt_tokens
    return out


# ---------------------------------------------------------------------------- the property


def _explained_between(events: Sequence[Envelope], lo: int, hi: int) -> bool:
    for e in events[lo:hi]:
        d = e.data
        if isinstance(d, CompactionStart | RequestHeader):
            return True
        if isinstance(d, ToolResult) and d.surface_op != "append":
            return True
    return False


@settings(max_examples=10, deadline=None)
@given(
    budget=st.integers(500, 1400),
    keep=st.integers(100, 450),
    trim_over=st.one_of(st.none(), st.integers(60, 400)),
    actions=st.lists(st.sampled_from(["turn", "turn", "turn", "resume", "prompt-change"]), min_size=3, max_size=8),
)
def test_theorem_holds_and_every_cache_drop_is_explained(
    budget: int, keep: int, trim_over: int | None, actions: list[str]
) -> None:
    """Compaction and trims at random positions: every request verifies and every cache-read drop
    coincides with a logged compaction, trim, header change or resume."""
    log = MemoryEventLog()
    emulator = fixed_emulator()
    policy = PressurePolicy(budget_tokens=budget, keep_recent_tokens=min(keep, budget - 1), trim_over_tokens=trim_over)
    system = [SYSTEM]
    agent, _ = make(log, emulator, pressure=policy)
    for i, action in enumerate(actions):
        if action == "resume":
            agent, _ = make(log, emulator, pressure=policy)
        elif action == "prompt-change":
            system[0] = SYSTEM + f" Version {i}."
            agent.options.system = system[0]
        asyncio.run(agent.run_turn(f"question {i}"))
    events = log.read("s")
    report = verify_events("s", events)
    assert report.ok, report.to_json()
    dispatches = [d for d, _ in _answered(events)]
    for d in _drop_dispatches(events):
        d_prev = dispatches[dispatches.index(d) - 1]
        assert _explained_between(events, d_prev, d), f"unexplained cache-read drop at the request of seq {d}"


# ---------------------------------------------------------------------------- images


def test_images_in_user_messages_and_tool_results_serialize_and_verify(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    log = MemoryEventLog()
    agent, provider = make(log, fixed_emulator(tool_steps=3), store=store)
    meta = store.put(demo_png(24, 12, 3), "image/png")
    asyncio.run(agent.run_turn([TextBlock("What is in this picture?"), ImageBlock(meta.image_ref())]))
    asyncio.run(agent.run_turn("And show me some swatches."))
    events = log.read("s")
    assert any(b'"type":"image"' in b for b in provider.bodies)
    image_results = [
        e for e in events if isinstance(e.data, ToolResult) and any(isinstance(p, ImageBlock) for p in e.data.content)
    ]
    assert image_results, "the scripted model should have called the swatch tool"
    report = verify_events("s", events, store)
    assert report.ok
    # the same log re-serialized for OpenAI carries image_url data URIs read through the store
    from foldline.providers.registry import OPENAI_CHAT_V1
    from foldline.replay.verify import rebuild_requests

    last = list(rebuild_requests("s", events))[-1][2]
    assert b"data:image/png;base64," in OPENAI_CHAT_V1.serialize(last, store)


def _corrupt(store: FilesystemAttachmentStore, attachment_id: str) -> None:
    hexd = attachment_id.removeprefix("sha256:")
    path = store.root / "objects" / hexd[:2] / hexd
    path.chmod(0o644)
    path.write_bytes(demo_png(24, 12, 4))  # other bytes, same size class: no longer the digest's


def test_a_missing_image_fails_before_sending_and_is_quarantined(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    log = MemoryEventLog()
    agent, provider = make(log, fixed_emulator(), store=store)
    meta = store.put(demo_png(24, 12, 5), "image/png")
    hexd = meta.attachment_id.removeprefix("sha256:")
    (store.root / "objects" / hexd[:2] / hexd).unlink()
    with pytest.raises(AttachmentNotFound):
        asyncio.run(agent.run_turn([TextBlock("look"), ImageBlock(meta.image_ref())]))
    assert provider.bodies == []
    events = log.read("s")
    [quarantine] = [e.data for e in events if isinstance(e.data, AttachmentQuarantine)]
    assert quarantine.attachment_id == meta.attachment_id
    assert "AttachmentNotFound" in quarantine.failure
    report = verify_events("s", events, store)
    assert report.checked == 1
    [reason] = [u.reason for u in report.unreconstructable]
    assert reason.startswith(f"attachment {meta.attachment_id}")


def test_a_corrupt_image_in_a_compacted_region_fails_the_summarize_call(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    log = MemoryEventLog()
    agent, provider = make(log, fixed_emulator(), store=store)
    meta = store.put(demo_png(24, 12, 6), "image/png")
    asyncio.run(agent.run_turn([TextBlock("look"), ImageBlock(meta.image_ref())]))
    run_turns(agent, ["more", "and more"])
    _corrupt(store, meta.attachment_id)
    sent = len(provider.bodies)
    with pytest.raises(AttachmentCorrupt):
        asyncio.run(relieve_pressure(agent.context, PressurePolicy(budget_tokens=50, keep_recent_tokens=10)))
    assert len(provider.bodies) == sent
    tail = [e.type for e in log.read("s")][-3:]
    assert tail == ["compaction/start", "attachment/quarantine", "compaction/end"]
    assert agent.session.rules.at_batch_boundary()


def test_an_image_whose_bytes_no_longer_match_fails_before_sending_and_is_quarantined(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    log = MemoryEventLog()
    agent, provider = make(log, fixed_emulator(), store=store)
    meta = store.put(demo_png(24, 12, 3), "image/png")
    asyncio.run(agent.run_turn([TextBlock("look"), ImageBlock(meta.image_ref())]))
    assert verify_events("s", log.read("s"), store).ok
    _corrupt(store, meta.attachment_id)
    sent = len(provider.bodies)
    with pytest.raises(AttachmentCorrupt):
        asyncio.run(agent.run_turn("again"))
    assert len(provider.bodies) == sent, "nothing may be sent"
    events = log.read("s")
    quarantines = [e.data for e in events if isinstance(e.data, AttachmentQuarantine)]
    assert [q.attachment_id for q in quarantines] == [meta.attachment_id]
    assert "AttachmentCorrupt" in quarantines[0].failure
    assert "re-upload" in quarantines[0].recovery
    assert isinstance(events[-1].data, TurnEnd)
    assert events[-1].data.reason == "error"
    report = verify_events("s", events, store)
    assert not report.ok
    assert report.matched == 0
    assert all("AttachmentCorrupt" in u.reason or "attachment" in u.reason for u in report.unreconstructable)


# ---------------------------------------------------------------------------- resume and fork


def test_resume_writes_a_snapshot_and_drift_is_attributable() -> None:
    log = MemoryEventLog()
    emulator = fixed_emulator()
    agent, _ = make(log, emulator)
    run_turns(agent, ["one"])
    resumed, _ = make(log, emulator, config=CallConfig("anthropic", "claude-emulated-2", max_tokens=256))
    run_turns(resumed, ["two"])
    diffs = snapshot_diffs(log.read("s"))
    assert [(s.reason, d.config) for s, d in diffs][1] == (
        "resume",
        (("model", "claude-emulated", "claude-emulated-2"),),
    )
    assert verify_events("s", log.read("s")).ok


def test_fork_child_replays_and_verifies_on_its_own() -> None:
    log = MemoryEventLog()
    emulator = fixed_emulator()
    parent, _ = make(log, emulator)
    run_turns(parent, ["one", "two"])
    events = log.read("s")
    cut = next(e.seq for e in events if isinstance(e.data, TurnEnd))
    fork = fork_session(log, "s", cut, "child", system=SYSTEM + " Forked.")
    child_events = log.read("child")
    assert child_events[: cut + 1] == events[: cut + 1]
    assert child_events[cut + 1].data == SessionEndSeed("s", cut + 1)
    assert fork.override_seq == cut + 2
    child, _ = make(log, emulator, sid="child")
    child.options.system = SYSTEM + " Forked."
    run_turns(child, ["three"])
    child_events = log.read("child")
    snaps = snapshot_diffs(child_events)
    assert [s.reason for s, _ in snaps] == ["initial", "resume", "resume"]
    assert snaps[1][1].system
    assert not snaps[2][1].system
    report = verify_events("child", child_events)
    assert report.ok
    assert report.checked == sum(isinstance(e.data, RequestDispatch) for e in child_events)
    assert verify_events("s", log.read("s")).ok  # the parent is untouched
