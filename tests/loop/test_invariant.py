"""The invariant companion at O(new events): it equals a fresh rebuild at every prefix, and each corruption
it exists for — of the loop's cache, of a projected fold, of the store's read path — stops the request
before anything is written or sent."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig, RequestDispatch, TextBlock
from foldline.core.codec import digest_bytes
from foldline.core.events import Envelope, UserMessage
from foldline.core.fold import FoldState, encode_message
from foldline.core.projection import Message, Session
from foldline.core.request import GenerateOptions
from foldline.dispatcher import Dispatcher
from foldline.errors import InvariantViolation
from foldline.loop import Agent, AgentOptions
from foldline.ports.event_log import WriterLease
from foldline.providers.emulated import emulated_provider
from foldline.providers.emulator import Emulator, ToolLoopScript
from foldline.providers.registry import ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1
from foldline.replay.invariant import DEFAULT_FULL_CHECK_EVERY, InvariantCompanion
from foldline.replay.registry import mark_loop_request
from foldline.replay.step import session_request
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider
from tests.strategies import actions_st, build_log

CONFIG = CallConfig("anthropic", "claude-emulated", max_tokens=256)
SYSTEM = "You are a test agent. " * 300


def _fresh(sid: str, events: Sequence[Envelope]) -> GenerateOptions:
    return mark_loop_request(session_request(Session(sid, events)))


@settings(max_examples=60, deadline=None)
@given(actions_st, st.lists(st.integers(0, 3), min_size=1, max_size=40), st.sampled_from([0, 3]))
def test_the_incremental_companion_equals_a_fresh_rebuild_at_every_prefix(
    actions: list[tuple[str, int]], pendings: list[int], full_check_every: int
) -> None:
    """Random sessions with trims, compactions and header changes, checked at every boundary (some with the
    step's last events still pending): the right request and the right body pass, a drifted one fails."""
    events = build_log(actions)
    log = MemoryEventLog()
    companion = InvariantCompanion(log, full_check_every=full_check_every)
    written = 0
    for boundary in range(1, len(events) + 1):
        k = min(pendings[boundary % len(pendings)], boundary - written, boundary - 1)
        durable = boundary - k
        if durable > written:
            log.append("s", written, events[written:durable])
            written = durable
        request = _fresh("s", events[:boundary])
        pending = events[durable:boundary]
        asyncio.run(companion.check("s", boundary, request, pending))
        for serializer in (ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1):
            companion.check_body("s", boundary, digest_bytes(serializer.serialize(request, None)), serializer)
        if boundary % 7 == 0:  # a request the log does not explain is refused at any prefix
            drifted = mark_loop_request(
                GenerateOptions(
                    request.config,
                    request.system,
                    request.tools,
                    (*request.messages, Message("user", (TextBlock("not in the log"),))),
                )
            )
            with pytest.raises(InvariantViolation):
                asyncio.run(companion.check("s", boundary, drifted, pending))
    assert companion.checked >= len(events)


def test_a_step_opening_that_never_reached_the_log_is_not_trusted() -> None:
    """Events folded tentatively (checked before the append) that the store does not hold are dropped."""
    events = build_log([("user", 1), ("assistant", 2), ("user", 3)])
    log = MemoryEventLog()
    log.append("s", 0, events[:2])
    companion = InvariantCompanion(log, full_check_every=0)
    asyncio.run(companion.check("s", 3, _fresh("s", events[:3]), events[2:3]))  # pending: never appended
    other = Envelope(2, 5, UserMessage("u2", (TextBlock("something else"),)))
    log.append("s", 2, [other])  # the log got another event at that seq
    asyncio.run(
        companion.check("s", 3, _fresh("s", [*events[:2], other]))
    )  # the companion follows the log, not its guess
    with pytest.raises(InvariantViolation):
        asyncio.run(companion.check("s", 3, _fresh("s", events[:3])))


def _agent(
    log: MemoryEventLog, *, full_check_every: int = DEFAULT_FULL_CHECK_EVERY, fresh_growth: float = 2.0
) -> tuple[Agent, CapturingProvider]:
    provider = CapturingProvider(emulated_provider(emulator=Emulator(ToolLoopScript(tool_steps=1))))
    options = AgentOptions(
        config=CONFIG,
        system=SYSTEM,
        invariant_full_check_every=full_check_every,
        invariant_fresh_growth=fresh_growth,
    )
    return Agent("s", log, provider, options), provider


def _nothing_sent_or_written(log: MemoryEventLog, provider: CapturingProvider, sent: int, head: int) -> None:
    assert len(provider.bodies) == sent
    events = log.read("s")
    assert not any(isinstance(e.data, RequestDispatch) for e in events[head:])
    assert verify_events("s", events).ok


def test_a_corrupted_loop_cache_is_caught_before_sending() -> None:
    log = MemoryEventLog()
    agent, provider = _agent(log)
    asyncio.run(agent.run_turn("first"))
    sent, head = len(provider.bodies), log.head("s")
    # the loop's cached projection of the last answer is not what the log holds (a bug in the cache)
    agent.session._messages[-1] = Message("assistant", (TextBlock("forged"),))
    with pytest.raises(InvariantViolation, match="differs from its rebuild") as info:
        asyncio.run(agent.run_turn("second"))
    assert "forged" in info.value.diff
    _nothing_sent_or_written(log, provider, sent, head)


def test_an_old_entry_of_the_loop_cache_changed_in_place_is_caught_by_the_sampled_full_check() -> None:
    """Per step only the new messages are compared; what ships comes from the body cache and is checked by
    digest. A sampled full check compares every message (here: every step)."""
    log = MemoryEventLog()
    agent, provider = _agent(log, full_check_every=1)
    asyncio.run(agent.run_turn("first"))
    sent, head = len(provider.bodies), log.head("s")
    agent.session._messages[0] = Message("user", (TextBlock("rewritten history"),))
    with pytest.raises(InvariantViolation, match="differs from its rebuild"):
        asyncio.run(agent.run_turn("second"))
    _nothing_sent_or_written(log, provider, sent, head)


class _CorruptingLog(MemoryEventLog):
    """A store whose read path returns a wrong event for one seq (the append path is fine)."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.bad_seq = seq

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        out = super().read(session_id, from_seq, to_seq)
        return [
            Envelope(e.seq, e.time, UserMessage(e.data.id, (TextBlock("read back wrong"),), e.data.source))
            if e.seq == self.bad_seq and isinstance(e.data, UserMessage)
            else e
            for e in out
        ]


def test_a_corrupted_store_read_is_caught_before_sending() -> None:
    log = _CorruptingLog(seq=-1)
    agent, provider = _agent(log)
    asyncio.run(agent.run_turn("first"))
    sent, head = len(provider.bodies), log.head("s")
    log.bad_seq = next(e.seq for e in MemoryEventLog.read(log, "s") if isinstance(e.data, UserMessage))
    # the loop's own session is right; the companion reads the log back and the read is wrong
    agent.invariant = InvariantCompanion(log)  # a companion that has not read this session yet
    with pytest.raises(InvariantViolation):
        asyncio.run(agent.run_turn("second"))
    assert len(provider.bodies) == sent
    assert not any(isinstance(e.data, RequestDispatch) for e in MemoryEventLog.read(log, "s")[head:])


class _ProjectingLog(MemoryEventLog):
    """Folds every append into a fold store at once, as a projector would."""

    def __init__(self, folds: MemoryFoldStore) -> None:
        super().__init__()
        self.folds = folds

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        from foldline.core.fold import fold_state

        head = super().append(session_id, expected_seq, events, lease=lease)
        self.folds.put(fold_state(Session(session_id, self.read(session_id)), 0))
        return head


class _TamperingFolds(MemoryFoldStore):
    """A fold store whose newest message is replaced by a forged one (a projector or Redis bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.tamper = False

    def get(self, session_id: str) -> FoldState | None:
        state = super().get(session_id)
        if state is None or not self.tamper or not state.messages:
            return state
        forged = encode_message(Message("user", (TextBlock("forged by the fold"),)))
        return FoldState(
            state.session_id,
            state.applied_seq,
            state.epoch,
            state.generation,
            state.header,
            state.header_seq,
            (*state.messages[:-1], forged),
        )


def test_a_corrupted_fold_is_caught_before_sending() -> None:
    folds = _TamperingFolds()
    log = _ProjectingLog(folds)
    emulator = Emulator(ToolLoopScript(tool_steps=1))
    inner = emulated_provider(emulator=emulator)
    provider = CapturingProvider(inner)
    dispatcher = Dispatcher(folds, {"anthropic": provider}, fold_timeout_s=2.0)
    agent = Agent("s", log, provider, AgentOptions(config=CONFIG, system=SYSTEM, dispatcher=dispatcher))

    async def main() -> None:
        await agent.run_turn("first")
        folds.tamper = True
        # the dispatcher built its body from the forged fold: its digest is not the log's
        with pytest.raises(InvariantViolation, match=r"rebuild from the log serializes to .*it was not sent"):
            await agent.run_turn("second")
        await dispatcher.aclose()

    asyncio.run(main())
    sent = len(provider.bodies)
    assert sent == sum(1 for e in log.read("s") if isinstance(e.data, RequestDispatch))
    assert verify_events("s", log.read("s")).ok


def test_checks_cost_the_new_events_and_fresh_rebuilds_run_where_planned() -> None:
    """A long session: the companion reads each event once, plus the fresh rebuilds at each doubling."""

    class CountingLog(MemoryEventLog):
        def __init__(self) -> None:
            super().__init__()
            self.read_events = 0

        def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
            out = super().read(session_id, from_seq, to_seq)
            self.read_events += len(out)
            return out

    log = CountingLog()
    agent, _ = _agent(log, full_check_every=0)
    boundaries: list[int] = []
    for i in range(40):
        result = asyncio.run(agent.run_turn(f"question {i}"))
        boundaries += [r.dispatch_seq for r in result.steps]
    companion = agent.invariant
    assert companion is not None
    # fresh rebuilds: at the first check (the load), then each time the session had doubled since the last
    expected, last = 0, 0
    for b in boundaries:
        if expected == 0 or b >= 2 * last:
            expected, last = expected + 1, b
    assert companion.full_rebuilds == expected < 10
    reads_before, head_before = log.read_events, log.head("s")
    asyncio.run(agent.run_turn("one more"))
    assert head_before > 250
    assert log.read_events - reads_before <= log.head("s") - head_before  # this turn's events, not the session
