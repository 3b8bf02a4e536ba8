"""The EventLog contract: every adapter (memory, sqlite, kafka) runs exactly this suite.

Subclass :class:`EventLogContract` in a ``Test*`` class and implement ``make_log``.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterator

import pytest

from foldline.core import AssistantMessage, TextBlock, ToolCallBlock, TurnStart, Usage, UserMessage
from foldline.core.events import MAX_INT, MAX_TIME_MS, Envelope, ReplaceOp, RequestHeader, ToolCall, ToolResult
from foldline.core.limits import MAX_EVENT_BYTES
from foldline.errors import ConflictError, EventTooLarge, FencedError, ValidationError
from foldline.ports.event_log import EventLog
from tests.factories import HEADER, LogBuilder, env, event_of_size, simple_log


class EventLogContract(abc.ABC):
    @abc.abstractmethod
    def make_log(self) -> EventLog:
        """A fresh, empty log (or one whose session ids are unique to this test)."""

    @pytest.fixture
    def log(self) -> Iterator[EventLog]:
        log = self.make_log()
        try:
            yield log
        finally:
            log.close()

    @pytest.fixture
    def sid(self, request: pytest.FixtureRequest) -> str:
        return f"s-{request.node.name}-{id(request)}"

    def test_empty_session_reads_empty(self, log: EventLog, sid: str) -> None:
        assert log.read(sid) == []
        assert log.head(sid) == 0
        assert sid not in log.sessions()

    def test_append_then_read_round_trips(self, log: EventLog, sid: str) -> None:
        events = simple_log()
        assert log.append(sid, 0, events[:5]) == 5
        assert log.append(sid, 5, events[5:]) == len(events)
        assert log.read(sid) == events
        assert log.head(sid) == len(events)
        assert sid in log.sessions()

    def test_read_range(self, log: EventLog, sid: str) -> None:
        events = simple_log()
        log.append(sid, 0, events)
        assert log.read(sid, 3) == events[3:]
        assert log.read(sid, 2, 6) == events[2:6]
        assert log.read(sid, len(events)) == []

    def test_stale_expected_seq_conflicts_and_writes_nothing(self, log: EventLog, sid: str) -> None:
        events = simple_log()
        log.append(sid, 0, events[:4])
        with pytest.raises(ConflictError) as info:
            log.append(sid, 2, [env(2, UserMessage("x", (TextBlock("late"),)))])
        assert info.value.expected_seq == 2
        assert info.value.actual_seq == 4
        assert log.read(sid) == events[:4]

    def test_invalid_batch_is_all_or_nothing(self, log: EventLog, sid: str) -> None:
        events = simple_log()
        log.append(sid, 0, events[:3])
        good = events[3]
        bad_gap = env(good.seq + 2, UserMessage("x", (TextBlock("gap"),)))
        with pytest.raises(ValidationError) as info:
            log.append(sid, 3, [good, bad_gap])
        assert info.value.rule == "seq-gapless"
        assert info.value.seq == good.seq + 2
        assert log.read(sid) == events[:3]
        assert log.head(sid) == 3
        # the log still accepts the correct continuation afterwards
        assert log.append(sid, 3, events[3:]) == len(events)

    def test_replace_must_list_hidden_nodes(self, log: EventLog, sid: str) -> None:
        b = LogBuilder().header().user("one").user("two")
        log.append(sid, 0, b.events)
        bad = env(b.seq, UserMessage("s", (TextBlock("summary"),), "user", ReplaceOp(0, 1), (1,)))
        with pytest.raises(ValidationError) as info:
            log.append(sid, b.seq, [bad])
        assert info.value.rule == "replace-lists-hidden"
        assert log.head(sid) == b.seq

    def test_tool_result_trim_keeps_call_id(self, log: EventLog, sid: str) -> None:
        b = LogBuilder().header().user("go")
        b.tool_round(0, 0, result="a long result " * 20)
        log.append(sid, 0, b.events)
        wrong = env(b.seq, ToolResult("other", "read", (TextBlock("short"),), False, ReplaceOp(2, 2), (b.seq - 1,)))
        with pytest.raises(ValidationError):
            log.append(sid, b.seq, [wrong])
        right = env(b.seq, ToolResult("call-0", "read", (TextBlock("short"),), False, ReplaceOp(2, 2), (b.seq - 1,)))
        assert log.append(sid, b.seq, [right]) == b.seq + 1
        assert log.read(sid)[-1] == right

    def test_a_tool_call_must_repeat_the_block_of_the_answer_it_came_from(self, log: EventLog, sid: str) -> None:
        """A tool/call carries the id, name and arguments of a tool-call block of the assistant/message just
        before it; a call the answer does not hold, or holds otherwise, is refused and nothing is written."""
        b = LogBuilder().header().user("go")
        answer = AssistantMessage("a2", (ToolCallBlock("c1", "read", '{"path":"x"}'),), Usage(), "tool_use")
        b.add(answer)
        log.append(sid, 0, b.events)
        for bad in (
            ToolCall(0, 0, "c1", "read", '{"path":"/etc/shadow"}'),  # other arguments
            ToolCall(0, 0, "c1", "write", '{"path":"x"}'),  # another tool
            ToolCall(0, 0, "c2", "read", '{"path":"x"}'),  # a call the answer does not make
        ):
            with pytest.raises(ValidationError) as info:
                log.append(sid, b.seq, [env(b.seq, bad)])
            assert info.value.rule == "tool-call-block"
            assert info.value.seq == b.seq
        assert log.head(sid) == b.seq
        later = AssistantMessage("a3", (TextBlock("no tools this time"),), Usage(), "end_turn")
        with pytest.raises(ValidationError) as info:  # only the latest answer's calls may follow
            log.append(sid, b.seq, [env(b.seq, later), env(b.seq + 1, ToolCall(0, 0, "c1", "read", '{"path":"x"}'))])
        assert info.value.rule == "tool-call-block"
        assert log.append(sid, b.seq, [env(b.seq, ToolCall(0, 0, "c1", "read", '{"path":"x"}'))]) == b.seq + 1

    def test_an_event_over_the_size_limit_is_refused_and_one_at_it_is_kept(self, log: EventLog, sid: str) -> None:
        """Every log holds an event of MAX_EVENT_BYTES (canonical JSON) and refuses a byte more, typed, with
        nothing of the batch written — the same limit in memory, SQLite and Kafka (records, fetches)."""
        head = [env(0, RequestHeader(HEADER, "initial"))]
        log.append(sid, 0, head)
        with pytest.raises(EventTooLarge) as info:
            log.append(sid, 1, [env(1, TurnStart(0)), event_of_size(2, MAX_EVENT_BYTES + 1)])
        assert (info.value.rule, info.value.seq, info.value.size) == ("event-size", 2, MAX_EVENT_BYTES + 1)
        assert log.read(sid) == head
        with pytest.raises(EventTooLarge):
            log.create(sid + "-new", iter([*head, event_of_size(1, MAX_EVENT_BYTES + 1)]))
        assert log.head(sid + "-new") == 0
        largest = event_of_size(1, MAX_EVENT_BYTES)
        assert log.append(sid, 1, [largest]) == 2
        assert log.read(sid, 1) == [largest]

    def test_header_reason_rules(self, log: EventLog, sid: str) -> None:
        with pytest.raises(ValidationError) as info:
            log.append(sid, 0, [env(0, RequestHeader(HEADER, "change"))])
        assert info.value.rule == "header-reason"
        log.append(sid, 0, [env(0, RequestHeader(HEADER, "initial"))])
        with pytest.raises(ValidationError):
            log.append(sid, 1, [env(1, RequestHeader(HEADER, "initial"))])
        assert log.append(sid, 1, [env(1, RequestHeader(HEADER, "resume"))]) == 2

    def test_validation_state_survives_across_appends(self, log: EventLog, sid: str) -> None:
        events = simple_log(turns=3)
        for i, e in enumerate(events):
            assert log.append(sid, i, [e]) == i + 1
        assert log.read(sid) == events

    def test_sessions_are_independent(self, log: EventLog, sid: str) -> None:
        a, b = sid + "-a", sid + "-b"
        log.append(a, 0, simple_log(1, 1))
        log.append(b, 0, simple_log(2, 2))
        assert log.read(a) == simple_log(1, 1)
        assert log.read(b) == simple_log(2, 2)
        assert {a, b} <= set(log.sessions())

    def test_heads_name_every_session_with_its_head(self, log: EventLog, sid: str) -> None:
        a, b, empty = sid + "-a", sid + "-b", sid + "-empty"
        two_turns = simple_log(2, 1)
        first_turn = next(i for i, e in enumerate(two_turns) if i and isinstance(e.data, TurnStart) and e.data.turn)
        log.append(a, 0, two_turns[:first_turn])
        log.append(b, 0, simple_log(2, 2))
        log.acquire(empty)  # a lease alone is no event: not a session
        heads = log.heads()
        assert heads[a] == log.head(a) == first_turn
        assert heads[b] == log.head(b) == len(simple_log(2, 2))
        assert empty not in heads
        assert set(heads) == set(log.sessions())
        log.append(a, first_turn, two_turns[first_turn:])  # an append moves its session's head, and only it
        moved = log.heads()
        assert moved[a] == len(two_turns) == log.head(a)
        assert moved[b] == heads[b]

    def test_lease_fences_stale_writer(self, log: EventLog, sid: str) -> None:
        events = simple_log()
        first = log.acquire(sid)
        log.append(sid, 0, events[:2], lease=first)
        second = log.acquire(sid)
        assert second.epoch > first.epoch
        with pytest.raises(FencedError) as info:
            log.append(sid, 2, events[2:4], lease=first)
        assert info.value.current_epoch == second.epoch
        assert log.read(sid) == events[:2]
        assert log.append(sid, 2, events[2:4], lease=second) == 4
        assert log.read(sid) == events[:4]

    def test_acquire_and_read_is_a_lease_plus_every_event(self, log: EventLog, sid: str) -> None:
        lease, events = log.acquire_and_read(sid)
        assert events == []
        written = simple_log()
        log.append(sid, 0, written[:5], lease=lease)
        assert log.read(sid, 1, 4) == written[1:4]  # a range the writer itself appended
        newer, again = log.acquire_and_read(sid)
        assert newer.epoch > lease.epoch
        assert again == written[:5]
        with pytest.raises(FencedError):
            log.append(sid, 5, written[5:6], lease=lease)
        assert log.append(sid, 5, written[5:6], lease=newer) == 6
        assert log.read(sid) == written[:6]

    def test_many_new_sessions_each_get_their_own_lease(self, log: EventLog, sid: str) -> None:
        events = simple_log()[:3]
        leases = [log.acquire(f"{sid}-{i}") for i in range(20)]
        for i, lease in enumerate(leases):
            assert log.append(f"{sid}-{i}", 0, events, lease=lease) == 3
        assert all(log.read(f"{sid}-{i}") == events for i in range(20))
        assert {f"{sid}-{i}" for i in range(20)} <= set(log.sessions())

    def test_the_async_calls_behave_as_the_sync_ones(self, log: EventLog, sid: str) -> None:
        written = simple_log()

        async def one(session: str) -> None:
            lease, events = await log.acquire_and_read_async(session)
            assert events == []
            head = 0
            for i in range(0, len(written), 2):
                head = await log.append_async(session, head, written[i : i + 2], lease=lease)
                assert await log.read_async(session, i, head) == written[i:head]
            with pytest.raises(ConflictError):
                await log.append_async(session, 0, written[:1], lease=lease)
            newer, again = await log.acquire_and_read_async(session)
            assert again == written
            with pytest.raises(FencedError):
                await log.append_async(session, head, [env(head, UserMessage("late", (TextBlock("x"),)))], lease=lease)
            assert await log.read_async(session) == written
            assert newer.epoch > lease.epoch

        async def main() -> None:
            await asyncio.gather(*(one(f"{sid}-{i}") for i in range(8)))  # many sessions' calls in flight at once

        asyncio.run(main())

    def test_empty_append_is_a_no_op(self, log: EventLog, sid: str) -> None:
        assert log.append(sid, 0, []) == 0
        assert log.read(sid) == []

    def test_an_invalid_session_id_is_refused_and_nothing_is_written(self, log: EventLog, sid: str) -> None:
        for bad in ("", "a\nb", "nul\x00", "esc\x1b[2J", "rtl\u202e", "x" * 256):
            with pytest.raises(ValidationError) as info:
                log.append(bad, 0, simple_log(1, 1))
            assert info.value.rule == "session-id"
            with pytest.raises(ValidationError):
                log.create(bad, simple_log(1, 1))
            with pytest.raises(ValidationError):
                log.acquire(bad)
            assert log.head(bad) == 0
        assert log.append(sid + "-é [/INST]", 0, simple_log(1, 1)) == len(simple_log(1, 1))

    def test_values_no_backend_could_hold_are_refused(self, log: EventLog, sid: str) -> None:
        """One check for every adapter: what one log accepts, every log (and the Avro records) can hold."""
        head = [env(0, RequestHeader(HEADER, "initial"))]
        log.append(sid, 0, head)
        for bad, rule in (
            (Envelope(1, MAX_TIME_MS + 1, TurnStart(0)), "time"),  # past 9999-12-31
            (Envelope(1, 1 << 63, TurnStart(0)), "time"),
            (env(1, TurnStart(MAX_INT + 1)), "value-range"),
            (env(1, TurnStart(-1)), "value-range"),
            (env(1, AssistantMessage("a", (TextBlock("x"),), Usage(1 << 63, 0, 0, 0))), "value-range"),
            (env(1, UserMessage("id\nwith a newline", (TextBlock("x"),))), "id"),
            (env(1, UserMessage("x" * 1025, (TextBlock("x"),))), "id"),
        ):
            with pytest.raises(ValidationError) as info:
                log.append(sid, 1, [bad])
            assert info.value.rule == rule, bad
        assert log.read(sid) == head
        assert log.append(sid, 1, [Envelope(1, MAX_TIME_MS, TurnStart(MAX_INT))]) == 2  # the limits themselves fit

    def test_create_writes_a_whole_new_session(self, log: EventLog, sid: str) -> None:
        events = simple_log(2, 3)
        assert log.create(sid, iter(events)) == len(events)
        assert log.read(sid) == events
        with pytest.raises(ConflictError):
            log.create(sid, iter(simple_log(1, 1)))
        assert log.read(sid) == events

    def test_create_writes_nothing_when_an_event_or_the_source_fails(self, log: EventLog, sid: str) -> None:
        events = simple_log(2, 2)
        gap = [*events[:5], Envelope(9, 0, TurnStart(9))]
        with pytest.raises(ValidationError) as info:
            log.create(sid, iter(gap))
        assert info.value.seq == 9
        assert log.head(sid) == 0

        class SourceBroke(Exception):
            pass

        def broken() -> Iterator[Envelope]:
            yield from events[:4]
            raise SourceBroke

        with pytest.raises(SourceBroke):
            log.create(sid, broken())
        assert log.head(sid) == 0
        assert sid not in log.sessions()
        assert log.create(sid, iter(events)) == len(events)
