"""A loop instance that opens a long session reads it once: its open's read feeds its own fold and the
invariant companion's (a fold of its own), its first check reads only what was appended since, and the
validation rules the log keeps for the next append come from the same read."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig
from foldline.core.events import Envelope
from foldline.demo import demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.ports.event_log import EncodedEvent, EventLog, WriterLease
from foldline.ports.inbox import InboxStore
from foldline.providers.emulated import emulated_provider
from foldline.replay.verify import verify_events

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=512)


class CountingLog(EventLog):
    """A log that counts the events each kind of read returns."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        self.read_events = 0
        self.opened_events = 0

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        return self.inner.append(session_id, expected_seq, events, lease=lease)

    def create(self, session_id: str, events: Iterable[Envelope | EncodedEvent]) -> int:
        return self.inner.create(session_id, events)

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        out = self.inner.read(session_id, from_seq, to_seq)
        self.read_events += len(out)
        return out

    def head(self, session_id: str) -> int:
        return self.inner.head(session_id)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def heads(self) -> dict[str, int]:
        return self.inner.heads()

    def acquire(self, session_id: str) -> WriterLease:
        return self.inner.acquire(session_id)

    def acquire_and_read(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        lease, events = self.inner.acquire_and_read(session_id)
        self.opened_events += len(events)
        return lease, events

    def inbox(self) -> InboxStore:
        return self.inner.inbox()


def _grow(log: EventLog, turns: int) -> None:
    async def go() -> None:
        agent = Agent("long", log, emulated_provider(), AgentOptions(config=CONFIG, tools=demo_toolset()))
        for t in range(turns):
            await agent.run_turn(f"turn {t}: what do the notes say?")

    asyncio.run(go())


def test_a_new_instance_reads_the_session_once_and_then_only_what_it_appends() -> None:
    inner = MemoryEventLog()
    _grow(inner, 40)
    before = inner.head("long")
    log = CountingLog(inner)

    async def resume() -> Agent:
        agent = Agent("long", log, emulated_provider(), AgentOptions(config=CONFIG, tools=demo_toolset()))
        await agent.run_turn("one more question")
        return agent

    agent = asyncio.run(resume())
    appended = inner.head("long") - before
    assert log.opened_events == before > 700
    assert log.read_events <= appended  # the companion's catch-ups: what this instance appended, nothing else
    assert agent.invariant is not None
    assert agent.invariant.checked >= 3
    assert agent.invariant.full_rebuilds == 1  # the fold its load built is the first check's fresh rebuild
    report = verify_events("long", inner.read("long"), from_seq=before)
    assert (report.checked, report.matched, report.ok) == (agent.invariant.checked, report.checked, True)


def test_verifying_from_a_seq_checks_only_the_requests_after_it() -> None:
    log = MemoryEventLog()
    _grow(log, 6)
    events = log.read("long")
    whole = verify_events("long", events)
    half = len(events) // 2
    later = verify_events("long", events, from_seq=half)
    dispatches_after = sum(1 for e in events if e.type == "request/dispatch" and e.seq >= half)
    assert whole.ok
    assert later.ok
    assert later.checked == later.matched == dispatches_after < whole.checked
