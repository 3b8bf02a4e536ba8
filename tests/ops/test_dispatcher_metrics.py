"""The loop counts every step it logs, dispatched or not; a dispatcher counts only its latencies and failures."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.metered_log import MeteredEventLog
from foldline.core import CallConfig
from foldline.core.content import ImageBlock, TextBlock
from foldline.core.drops import DROP_CAUSES, classify_session, session_drops
from foldline.core.events import AttachmentQuarantine, Envelope, RequestHeader
from foldline.core.fold import fold_delta, fold_state
from foldline.core.projection import Session
from foldline.core.request import build_request
from foldline.demo import demo_png
from foldline.dispatcher import Dispatcher
from foldline.errors import AttachmentNotFound, FencedError, InvariantViolation
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.metrics import DispatcherMetrics, LoopMetrics, new_registry
from foldline.ports.event_log import WriterLease
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.replay.registry import mark_loop_request
from tests.factories import simple_log

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)


class FoldingLog(MemoryEventLog):
    """An in-memory log that folds every append into a fold store right away, as a projector would."""

    def __init__(self, folds: MemoryFoldStore) -> None:
        super().__init__()
        self.folds = folds

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        head = super().append(session_id, expected_seq, events, lease=lease)
        delta = fold_delta(self.read(session_id, self.folds.applied_seq(session_id) + 1), 0)
        if delta is None:
            self.folds.put(fold_state(Session(session_id, self.read(session_id)), 0))
        else:
            assert self.folds.apply(session_id, delta).status == "applied"
        return head


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_dispatcher_and_loop_metrics_split_the_log_between_them() -> None:
    folds = MemoryFoldStore()
    log = FoldingLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=2))
    dispatcher_metrics = DispatcherMetrics(new_registry(process=False))
    loop_registry = new_registry(process=False)
    loop_log = MeteredEventLog(log, LoopMetrics(loop_registry))
    prompts = iter(["You are careful. " * 400, "You are careful. " * 400, "You are terse. " * 400])
    system = {"text": next(prompts)}
    toolset = Toolset()

    @toolset.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    async def main() -> None:
        dispatcher = Dispatcher(folds, {"anthropic": emulated_provider(emulator=emulator)}, metrics=dispatcher_metrics)
        options = AgentOptions(CONFIG, system=lambda: system["text"], tools=toolset, dispatcher=dispatcher)
        agent = Agent("s-1", loop_log, emulated_provider(emulator=emulator), options)
        for i in range(3):
            await agent.run_turn(f"question {i}")
            system["text"] = next(prompts, system["text"])  # the third turn renders another system prompt
        await dispatcher.aclose()

    asyncio.run(main())
    events = log.read("s-1")
    verdicts = classify_session("s-1", events)
    assert len(verdicts) == 9
    d, lp = dispatcher_metrics.registry, loop_registry
    pm = {"provider": "anthropic", "model": "claude-emulated"}
    # the loop logged every step, so the loop counts them, their tokens, drops and headers
    assert value(lp, "foldline_steps_total", **pm) == 9
    assert value(lp, "foldline_step_cache_read_tokens_total", **pm) == sum(v.step.usage.cache_read for v in verdicts)
    assert value(lp, "foldline_step_cache_write_tokens_total", **pm) == sum(v.step.usage.cache_write for v in verdicts)
    drops = Counter(drop.cause for drop in session_drops("s-1", events))
    assert drops["header-change"] == 1  # the new system prompt
    for cause in DROP_CAUSES:
        assert value(lp, "foldline_cache_read_drops_total", cause=cause) == drops[cause], cause
    headers = Counter(e.data.reason for e in events if isinstance(e.data, RequestHeader))
    assert headers == {"initial": 1, "change": 1}
    for reason, n in headers.items():
        assert value(lp, "foldline_request_header_snapshots_total", reason=reason) == n
    # the dispatcher times what it served and appends (so counts) nothing of the log's
    assert value(d, "foldline_dispatch_duration_seconds_count", **pm) == 9
    assert value(d, "foldline_dispatcher_fold_wait_seconds_count") == 9
    assert value(d, "foldline_steps_total", **pm) == 0
    assert d.get_sample_value("foldline_steps_total", pm) is None


def test_an_attachment_failure_is_counted_once(tmp_path: Path) -> None:
    """The dispatcher fails the prepare, the loop logs the quarantine: the quarantine in the log is what the
    loop counts, the failed prepare what the dispatcher counts."""
    folds = MemoryFoldStore()
    log = FoldingLog(folds)
    attachments = FilesystemAttachmentStore(tmp_path / "attachments")
    emulator = Emulator(ToolLoopScript(tool_steps=0))
    metrics = DispatcherMetrics(new_registry(process=False))
    loop_metrics = LoopMetrics(new_registry(process=False))

    async def main() -> None:
        dispatcher = Dispatcher(
            folds, {"anthropic": emulated_provider(emulator=emulator)}, attachments=attachments, metrics=metrics
        )
        options = AgentOptions(CONFIG, system="You look at images. " * 100, dispatcher=dispatcher)
        metered = MeteredEventLog(log, loop_metrics)
        agent = Agent("s-2", metered, emulated_provider(emulator=emulator), options, attachments=attachments)
        meta = attachments.put(demo_png(16, 16, 3), "image/png")
        await agent.run_turn([TextBlock("What is this?"), ImageBlock(meta.image_ref())])
        for path in (tmp_path / "attachments").rglob("*"):
            if path.is_file() and meta.attachment_id.split(":")[1] in path.name and not path.name.endswith(".json"):
                path.unlink()
        with pytest.raises(AttachmentNotFound):
            await agent.run_turn("And now?")
        await dispatcher.aclose()

    asyncio.run(main())
    assert [e.data.failure.split(":")[0] for e in log.read("s-2") if isinstance(e.data, AttachmentQuarantine)] == [
        "AttachmentNotFound"
    ]
    lp = loop_metrics.registry
    assert value(lp, "foldline_attachment_errors_total", kind="AttachmentNotFound") == 1
    assert value(lp, "foldline_steps_total", provider="anthropic", model="claude-emulated") == 1
    assert value(metrics.registry, "foldline_dispatch_errors_total", kind="AttachmentNotFound") == 1


def test_a_fenced_append_is_counted() -> None:
    log = MemoryEventLog()
    registry = new_registry(process=False)
    metered = MeteredEventLog(log, LoopMetrics(registry))
    old = metered.acquire("s-4")
    metered.append("s-4", 0, simple_log(turns=1, steps=1), lease=old)
    metered.acquire("s-4")  # a newer writer
    with pytest.raises(FencedError):
        metered.append("s-4", log.head("s-4") + 1, simple_log(turns=1, steps=1)[:1], lease=old)
    assert value(registry, "foldline_loop_fenced_writes_total") == 1


def test_an_instrumented_agent_counts_its_invariant_violations() -> None:
    """A request that differs from its rebuild is refused and counted through the companion's hook."""
    log = MemoryEventLog()
    log.append("s-3", 0, simple_log(turns=2, steps=2))
    registry = new_registry(process=False)
    metrics = LoopMetrics(registry)
    options = AgentOptions(CONFIG, on_invariant_violation=metrics.invariant_violation)
    agent = Agent("s-3", log, emulated_provider(emulator=Emulator()), options)
    assert agent.invariant is not None
    session = Session("s-3", log.read("s-3"))
    header = session.header()
    assert header is not None
    request = mark_loop_request(build_request(session.derive_messages(), header))
    companion = agent.invariant
    asyncio.run(companion.check("s-3", session.next_seq, request))  # equal to its rebuild: passes, nothing counted
    assert value(registry, "foldline_invariant_violations_total") == 0
    with pytest.raises(InvariantViolation, match="differs from its rebuild"):
        # a shorter prefix rebuilds another request
        asyncio.run(companion.check("s-3", session.next_seq - 3, request))
    assert value(registry, "foldline_invariant_violations_total") == 1
