"""The FoldStore contract: every adapter (memory, redis) runs exactly this suite.

Subclass :class:`FoldStoreContract` in a ``Test*`` class and implement ``make_store``.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Iterator

import pytest

from foldline.core import TextBlock
from foldline.core.events import Envelope, ReplaceOp, ToolResult
from foldline.core.fold import FoldDelta, FoldState, fold_delta, fold_state
from foldline.core.projection import Session
from foldline.dispatcher import wait_for_fold, wait_for_fold_tail
from foldline.errors import FoldTimeout
from foldline.ports.fold_store import ERASED, FoldStore
from tests.factories import HEADER, LogBuilder, env, simple_log


def _delta(events: list[Envelope], epoch: int = 1) -> FoldDelta:
    delta = fold_delta(events, epoch)
    assert delta is not None
    return delta


class FoldStoreContract(abc.ABC):
    @abc.abstractmethod
    def make_store(self) -> FoldStore:
        """A fresh store (or one whose session ids are unique to this test)."""

    @pytest.fixture
    def store(self) -> Iterator[FoldStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def sid(self, request: pytest.FixtureRequest) -> str:
        return f"s-{request.node.name}-{id(request)}"

    def test_unknown_session_has_no_fold(self, store: FoldStore, sid: str) -> None:
        assert store.get(sid) is None
        assert store.applied_seq(sid) == -1

    def test_delta_applied_fold_equals_full_fold_at_every_split(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=3, steps=3)
        for split in range(1, len(log)):
            key = f"{sid}-{split}"
            for part in (log[:split], log[split:]):
                result = store.apply(key, _delta(part))
                assert (result.status, result.applied_seq) == ("applied", part[-1].seq)
            assert store.get(key) == fold_state(Session(key, log), epoch=1)
            assert store.applied_seq(key) == len(log) - 1

    def test_an_erased_fold_holds_no_content_and_takes_none_back(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=2, steps=2)
        store.apply(sid, _delta(log[:5]))
        store.erase(sid)
        erased = store.get(sid)
        assert erased == FoldState(sid, ERASED, ERASED, 0, None, None, ())
        assert store.applied_seq(sid) == ERASED
        # a projector that still holds the key cannot fold the content back, by delta or by rebuild
        assert store.apply(sid, _delta(log[5:])).status == "duplicate"
        assert store.apply(sid, _delta(log, epoch=ERASED + 1)).status == "duplicate"
        assert store.put(fold_state(Session(sid, log), epoch=9)).status == "fenced"
        assert store.get(sid) == erased
        store.erase(sid)  # again: the same tombstone
        assert store.get(sid) == erased
        store.erase(f"{sid}-never")  # a session without a fold gets the tombstone too
        assert store.applied_seq(f"{sid}-never") == ERASED

    def test_redelivery_is_a_no_op(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.apply(sid, _delta(log[:6]))
        before = store.get(sid)
        again = store.apply(sid, _delta(log[:6]))
        assert (again.status, again.applied_seq) == ("duplicate", 5)
        assert store.apply(sid, _delta(log[2:4])).status == "duplicate"
        assert store.get(sid) == before

    def test_overlapping_batch_applies_only_the_new_part(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=3, steps=2)
        store.apply(sid, _delta(log[:7]))
        result = store.apply(sid, _delta(log[3:]))  # seqs 3..6 were applied already
        assert (result.status, result.applied_seq, result.previous_seq) == ("applied", len(log) - 1, 6)
        assert store.get(sid) == fold_state(Session(sid, log), epoch=1)

    def test_gap_is_reported_and_changes_nothing(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.apply(sid, _delta(log[:5]))
        before = store.get(sid)
        result = store.apply(sid, _delta(log[7:]))
        assert (result.status, result.applied_seq, result.expected_seq) == ("gap", 4, 5)
        assert store.get(sid) == before

    def test_missing_fold_reports_a_gap_from_minus_one(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        result = store.apply(sid, _delta(log[3:]))
        assert (result.status, result.applied_seq, result.expected_seq) == ("gap", -1, 0)
        assert store.get(sid) is None

    def test_older_epoch_is_fenced(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.apply(sid, _delta(log[:5], epoch=3))
        before = store.get(sid)
        result = store.apply(sid, _delta(log[5:], epoch=2))
        assert (result.status, result.applied_seq) == ("fenced", 4)
        assert store.get(sid) == before
        newer = store.apply(sid, _delta(log[5:], epoch=4))
        assert newer.status == "applied"
        state = store.get(sid)
        assert state is not None
        assert state.epoch == 4

    def test_raise_epoch_fences_older_writers_from_then_on(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.raise_epoch(sid, 7)  # no fold yet: nothing to raise, nothing created
        assert store.get(sid) is None
        store.apply(sid, _delta(log[:5], epoch=1))
        store.raise_epochs({sid: 3, f"{sid}-none": 9})
        store.raise_epoch(sid, 2)  # never lowers
        state = store.get(sid)
        assert state is not None
        assert (state.epoch, state.applied_seq) == (3, 4)
        assert store.apply(sid, _delta(log[5:], epoch=1)).status == "fenced"
        assert store.apply(sid, _delta(log[5:], epoch=3)).status == "applied"
        assert store.get(f"{sid}-none") is None

    def test_header_is_replaced_only_by_a_newer_one(self, store: FoldStore, sid: str) -> None:
        changed = HEADER.__class__(HEADER.config, "another system prompt", HEADER.tools)
        b = LogBuilder().header().user("hello").header(changed, "change").user("again")
        log = b.events
        store.apply(sid, _delta(log[:3]))
        store.apply(sid, _delta(log[1:]))  # carries the header at seq 0 again (skipped) and nothing newer
        state = store.get(sid)
        assert state is not None
        assert state.decoded_header() == changed
        assert state.header_seq == 2
        assert state == fold_state(Session(sid, log), epoch=1)

    def test_header_only_and_message_free_batches(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=1, steps=1)
        for event in log:  # one event per batch, most of them add no message
            assert store.apply(sid, _delta([event])).status == "applied"
        assert store.get(sid) == fold_state(Session(sid, log), epoch=1)

    def test_apply_many_equals_applying_in_order(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=2, steps=2)
        pairs = [(f"{sid}-a", _delta(log[:4])), (f"{sid}-b", _delta(log)), (f"{sid}-a", _delta(log[4:]))]
        pairs.append((f"{sid}-a", _delta(log[2:6])))  # a duplicate within the same call
        pairs.append((f"{sid}-c", _delta(log[3:])))  # a gap within the same call
        results = store.apply_many(pairs)
        assert [r.status for r in results] == ["applied", "applied", "applied", "duplicate", "gap"]
        assert store.get(f"{sid}-a") == fold_state(Session(f"{sid}-a", log), epoch=1)
        assert store.get(f"{sid}-b") == fold_state(Session(f"{sid}-b", log), epoch=1)
        assert store.apply_many([]) == []

    def test_put_replaces_the_whole_fold(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=2, steps=2)
        store.apply(sid, _delta(log[:5]))
        trimmed = [*log, env(len(log), _trim(log))]
        full = fold_state(Session(sid, trimmed), epoch=2)
        assert full.generation == 1
        result = store.put(full)
        assert (result.status, result.applied_seq) == ("applied", len(trimmed) - 1)
        assert store.get(sid) == full
        # a delta continuing the rebuilt fold applies on top of it
        more = LogBuilder(len(trimmed)).user("after the trim").events
        assert store.apply(sid, _delta(more, epoch=2)).status == "applied"
        assert store.get(sid) == fold_state(Session(sid, trimmed + more), epoch=2)

    def test_put_is_fenced_by_seq_and_epoch(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=2, steps=2)
        store.apply(sid, _delta(log, epoch=5))
        before = store.get(sid)
        stale_seq = fold_state(Session(sid, log[:4]), epoch=5)
        assert store.put(stale_seq).status == "duplicate"
        stale_epoch = fold_state(Session(sid, log), epoch=4)
        assert store.put(stale_epoch).status == "fenced"
        assert store.get(sid) == before
        same = fold_state(Session(sid, log), epoch=5)
        assert store.put(same).status == "applied"  # the same fold again is accepted (idempotent)
        assert store.get(sid) == same

    def test_put_of_an_empty_or_headerless_fold(self, store: FoldStore, sid: str) -> None:
        state = FoldState(sid, 0, 0, 0, None, None, ())
        assert store.put(state).status == "applied"
        assert store.get(sid) == state

    def test_delete_forgets_the_fold(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.apply(sid, _delta(log))
        store.delete(sid)
        assert store.get(sid) is None
        assert store.applied_seq(sid) == -1
        assert store.apply(sid, _delta(log)).status == "applied"
        assert store.get(sid) == fold_state(Session(sid, log), epoch=1)
        store.delete(f"{sid}-never-existed")

    def test_bytes_round_trip_exactly(self, store: FoldStore, sid: str) -> None:
        texts = ["plain", "ünïcödé ✓ 🧪", 'quotes " and \\ backslashes', "new\nlines\r\n\ttabs", "x" * 70_000]
        b = LogBuilder().header()
        for text in texts:
            b.user(text)
        store.apply(sid, _delta(b.events))
        assert store.get(sid) == fold_state(Session(sid, b.events), epoch=1)

    def test_many_messages_in_one_batch(self, store: FoldStore, sid: str) -> None:
        b = LogBuilder().header()
        for i in range(9_001):
            b.user(f"m{i}")
        store.apply(sid, _delta(b.events[:10]))
        store.apply(sid, _delta(b.events[5:]))
        state = store.get(sid)
        assert state is not None
        assert len(state.messages) == 9_001
        assert state == fold_state(Session(sid, b.events), epoch=1)

    def test_session_ids_with_special_characters(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=1)
        for odd in (f"{sid}:{{tag}}", f"{sid} spaced/ü*?[]"):
            store.apply(odd, _delta(log))
            assert store.get(odd) == fold_state(Session(odd, log), epoch=1)

    def test_invalid_delta_cannot_be_made(self, store: FoldStore, sid: str) -> None:
        with pytest.raises(ValueError, match="first"):
            store.apply(sid, FoldDelta(5, 3, 1, (), None))
        assert store.get(sid) is None

    def test_wait_for_returns_once_the_seq_is_applied(self, store: FoldStore, sid: str) -> None:
        log = simple_log()

        def later() -> None:
            time.sleep(0.05)
            store.apply(sid, _delta(log))

        thread = threading.Thread(target=later)
        thread.start()
        try:
            state = wait_for_fold(store, sid, len(log) - 1, timeout_s=5.0)
        finally:
            thread.join()
        assert state.applied_seq == len(log) - 1

    def test_wait_for_times_out_with_a_typed_error(self, store: FoldStore, sid: str) -> None:
        store.apply(sid, _delta(simple_log()[:3]))
        started = time.monotonic()
        with pytest.raises(FoldTimeout, match="applied seq 2, not 10"):
            wait_for_fold(store, sid, 10, timeout_s=0.1)
        assert time.monotonic() - started < 5.0

    def test_tail_answers_only_the_messages_past_what_the_caller_holds(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=3, steps=2)
        store.apply(sid, _delta(log[:9]))
        first = store.get(sid)
        assert first is not None
        store.apply(sid, _delta(log[9:]))
        full = store.get(sid)
        assert full is not None
        known = len(first.messages)
        tail = store.tail(sid, generation=first.generation, known=known)
        assert tail is not None
        assert (tail.offset, tail.messages) == (known, full.messages[known:])
        assert (tail.applied_seq, tail.epoch, tail.generation) == (full.applied_seq, full.epoch, full.generation)
        assert (tail.header, tail.header_seq) == (full.header, full.header_seq)
        for generation, held in ((first.generation + 1, known), (first.generation, len(full.messages) + 1)):
            whole = store.tail(sid, generation=generation, known=held)  # not the fold the caller holds
            assert whole is not None
            assert (whole.offset, whole.messages) == (0, full.messages)
        assert store.tail(f"{sid}-none", generation=0, known=0) is None

    def test_tail_after_a_surface_replace_answers_every_message(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=2, steps=2)
        store.apply(sid, _delta(log))
        before = store.get(sid)
        assert before is not None
        replaced = [*log, env(len(log), _trim(log))]
        store.put(fold_state(Session(sid, replaced), epoch=1))
        after = store.get(sid)
        assert after is not None
        assert after.generation == before.generation + 1
        tail = store.tail(sid, generation=before.generation, known=len(before.messages))
        assert tail is not None
        assert (tail.offset, tail.messages) == (0, after.messages)

    def test_wait_for_tail_returns_once_the_seq_is_applied(self, store: FoldStore, sid: str) -> None:
        log = simple_log()
        store.apply(sid, _delta(log[:4]))
        held = store.get(sid)
        assert held is not None

        def later() -> None:
            time.sleep(0.05)
            store.apply(sid, _delta(log[4:]))

        thread = threading.Thread(target=later)
        thread.start()
        try:
            tail = wait_for_fold_tail(
                store, sid, len(log) - 1, 5.0, generation=held.generation, known=len(held.messages)
            )
        finally:
            thread.join()
        full = store.get(sid)
        assert full is not None
        assert tail.applied_seq == len(log) - 1
        assert (*held.messages, *tail.messages) == full.messages

    def test_concurrent_appliers_never_double_apply(self, store: FoldStore, sid: str) -> None:
        log = simple_log(turns=6, steps=3)
        batches = [log[i : i + 3] for i in range(0, len(log), 3)]
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                for batch in batches:
                    store.apply(sid, _delta(batch))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert store.get(sid) == fold_state(Session(sid, log), epoch=1)


def _trim(log: list[Envelope]) -> ToolResult:
    """A single-entry replace of the log's first tool result (content only)."""
    for e in log:
        if isinstance(e.data, ToolResult):
            session = Session("t", log)
            pos = next(i for i, n in enumerate(session.rules.surface) if n.seq == e.seq)
            return ToolResult(
                e.data.call_id,
                e.data.name,
                (TextBlock("[trimmed]"),),
                surface_op=ReplaceOp(pos, pos),
                source_event_seqs=(e.seq,),
            )
    raise AssertionError("the log has no tool result to trim")
