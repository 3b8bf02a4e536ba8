"""BatchProjector, the runtime-independent half of the projector, on the in-process log and fold store.

Every case ends with the same check: each session's fold equals a fresh fold of its log.
"""

from __future__ import annotations

from foldline.adapters.kafka import ConsumedEvent, ConsumedItem, ConsumedLease, DeadLetter
from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import TextBlock
from foldline.core.events import Envelope, ReplaceOp, ToolResult
from foldline.core.fold import fold_state
from foldline.core.projection import Session
from foldline.errors import FormatError
from foldline.metrics import ProjectorMetrics, new_registry
from foldline.projector import BatchProjector
from tests.factories import env, simple_log


def _consumed(sid: str, events: list[Envelope], epoch: int = 1) -> list[ConsumedItem]:
    return [ConsumedEvent(sid, e, epoch, 0, e.seq) for e in events]


def _setup(*logs: tuple[str, list[Envelope]]) -> tuple[MemoryEventLog, MemoryFoldStore, BatchProjector]:
    log = MemoryEventLog()
    for sid, events in logs:
        log.append(sid, 0, events)
    store = MemoryFoldStore()
    return log, store, BatchProjector(store, log, metrics=ProjectorMetrics(new_registry(process=False)))


def _assert_folds_match(log: MemoryEventLog, store: MemoryFoldStore, epoch: int = 1) -> None:
    for sid in log.sessions():
        assert store.get(sid) == fold_state(Session(sid, log.read(sid)), epoch), sid


def _counter(projector: BatchProjector, name: str) -> float:
    assert projector.metrics is not None
    value = projector.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else value


def test_interleaved_sessions_fold_in_one_batch() -> None:
    a, b = simple_log(turns=3), simple_log(turns=2, steps=3)
    log, store, projector = _setup(("a", a), ("b", b))
    items: list[ConsumedItem] = []
    for i in range(max(len(a), len(b))):  # one partition's interleaving of two sessions
        items += _consumed("a", a[i : i + 1]) + _consumed("b", b[i : i + 1])
    report = projector.project(items)
    assert (report.events, report.applied, report.duplicates, report.rebuilt) == (
        len(a) + len(b),
        len(a) + len(b),
        0,
        [],
    )
    _assert_folds_match(log, store)
    assert _counter(projector, "foldline_projector_events_applied_total") == len(a) + len(b)


def test_redelivered_batches_count_as_duplicates() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    projector.project(_consumed("s", events[:8]))
    report = projector.project(_consumed("s", events[4:]))  # overlaps 4..7
    assert (report.applied, report.duplicates) == (len(events) - 8, 4)
    again = projector.project(_consumed("s", events))
    assert (again.applied, again.duplicates) == (0, len(events))
    _assert_folds_match(log, store)
    assert _counter(projector, "foldline_projector_duplicate_events_total") == 4 + len(events)


def test_a_gap_is_counted_reported_and_repaired_from_the_log() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    projector.project(_consumed("s", events[:4]))
    report = projector.project(_consumed("s", events[7:]))  # 4..6 never arrived
    assert [(g.session_id, g.expected_seq, g.first_seq) for g in report.gaps] == [("s", 4, 7)]
    assert report.rebuilt == ["s"]
    _assert_folds_match(log, store)
    assert _counter(projector, "foldline_projector_seq_gaps_total") == 1
    assert _counter(projector, "foldline_projector_fold_rebuilds_total") == 1


def test_a_missing_fold_is_rebuilt_without_counting_a_gap() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    report = projector.project(_consumed("s", events[5:]))  # e.g. Redis was flushed
    assert report.gaps == []
    assert report.rebuilt == ["s"]
    _assert_folds_match(log, store)


def test_a_surface_replace_rebuilds_the_session() -> None:
    events = simple_log(turns=2, steps=2)
    result = next(e for e in events if isinstance(e.data, ToolResult))
    assert isinstance(result.data, ToolResult)
    pos = next(i for i, n in enumerate(Session("s", events).rules.surface) if n.seq == result.seq)
    trim = env(
        len(events),
        ToolResult(
            result.data.call_id,
            result.data.name,
            (TextBlock("[trimmed]"),),
            surface_op=ReplaceOp(pos, pos),
            source_event_seqs=(result.seq,),
        ),
    )
    log, store, projector = _setup(("s", [*events, trim]), ("t", events))
    projector.project(_consumed("s", events) + _consumed("t", events))
    report = projector.project(_consumed("s", [trim]))
    assert report.rebuilt == ["s"]
    state = store.get("s")
    assert state is not None
    assert state.generation == 1
    _assert_folds_match(log, store)


def test_stale_epoch_events_are_fenced_and_reported() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    projector.project(_consumed("s", events[:6], epoch=2))
    report = projector.project(_consumed("s", events[6:], epoch=1))
    assert [c.event.seq for c in report.fenced] == [e.seq for e in events[6:]]
    assert store.applied_seq("s") == 5
    assert _counter(projector, "foldline_projector_fenced_writes_total") == 1
    # the newer writer's events still apply
    projector.project(_consumed("s", events[6:], epoch=2))
    _assert_folds_match(log, store, epoch=2)


def test_epoch_change_inside_a_batch_splits_runs() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    items = [*_consumed("s", events[:5], epoch=1), ConsumedLease("s", 2, 0, 99), *_consumed("s", events[5:], epoch=2)]
    report = projector.project(items)
    assert (report.applied, report.leases, report.fenced) == (len(events), 1, [])
    _assert_folds_match(log, store, epoch=2)


def test_dead_letters_are_counted_not_applied() -> None:
    events = simple_log()
    log, store, projector = _setup(("s", events))
    items = [*_consumed("s", events), DeadLetter("s", FormatError("avro", "garbage"), 0, 500)]
    report = projector.project(items)
    assert (report.dead_letters, report.events) == (1, len(events))
    _assert_folds_match(log, store)


def test_rebuild_on_demand_keeps_the_fold_epoch() -> None:
    events = simple_log()
    log, store, projector = _setup(("s", events))
    projector.project(_consumed("s", events[:3], epoch=3))
    result = projector.rebuild("s")
    assert (result.status, result.applied_seq) == ("applied", len(events) - 1)
    _assert_folds_match(log, store, epoch=3)


def test_a_lease_fences_older_epochs_in_later_batches() -> None:
    events = simple_log(turns=2)
    log, store, projector = _setup(("s", events))
    projector.project(_consumed("s", events[:6], epoch=1))
    report = projector.project([ConsumedLease("s", 2, 0, 50)])  # a new writer took the session over
    assert report.leases == 1
    state = store.get("s")
    assert state is not None
    assert state.epoch == 2
    # a projector that restarted after the lease no longer knows it; the store does
    stale = projector.project(_consumed("s", events[6:], epoch=1))
    assert [c.event.seq for c in stale.fenced] == [e.seq for e in events[6:]]
    projector.project(_consumed("s", events[6:], epoch=2))
    _assert_folds_match(log, store, epoch=2)
