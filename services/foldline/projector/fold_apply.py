"""Folding consumed session events into a fold store, independent of the consumer runtime.

:class:`BatchProjector` takes a batch of typed consumer items (:mod:`foldline.adapters.kafka.records`:
events, leases, dead letters) from any runtime — the confluent-kafka worker, the faust app, a test —
and applies it to a :class:`~foldline.ports.fold_store.FoldStore` in one batched call:

1. Events are grouped per session into *runs*: contiguous seqs of one writer epoch, in arrival order.
2. Each run becomes a :class:`~foldline.core.fold.FoldDelta`; a run holding a surface replace
   (compaction, trim) cannot be a delta, so its session is rebuilt from the log instead.
3. All deltas go to :meth:`FoldStore.apply_many` (one round trip). Per result:

   * ``applied`` — events past the store's previous seq were new, the rest are counted as duplicates;
   * ``duplicate`` — a redelivery, counted and skipped;
   * ``gap`` — the store is missing events before the run: counted as a seq gap and reported, and the
     session is rebuilt from the log (a fold that does not exist at all — Redis flushed or restarted —
     is simply rebuilt);
   * ``fenced`` — the run's writer epoch is older than the fold's: the events are stale and returned in
     :attr:`BatchReport.fenced` so the runtime dead-letters them.

4. Writer leases in the batch raise the fold's epoch (:meth:`FoldStore.raise_epochs`), so an event of
   an older epoch met later — even by a projector that restarted after the lease — is ``fenced``.
5. Rebuilds read the whole session through the event log, fold it with
   :func:`~foldline.core.fold.fold_state` and :meth:`FoldStore.put` it (fenced by seq and epoch, so a
   slower concurrent projector can never roll it back).
6. A session whose events come sealed — its key was destroyed (docs/ERASURE.md) — is not folded: its fold is
   replaced by the erased tombstone (:meth:`FoldStore.erase`), which refuses every later apply.

When :meth:`BatchProjector.project` returns, everything in the batch is in the store (or dead-lettered):
the runtime may acknowledge the batch's offsets. When it raises, nothing may be acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..adapters.kafka.records import ConsumedEvent, ConsumedItem, ConsumedLease, DeadLetter
from ..core.fold import FoldDelta, fold_delta, fold_state
from ..core.projection import Session
from ..errors import ContentErased, SessionNotFound, StoreUnavailable
from ..ports.event_log import EventLog
from ..ports.fold_store import ApplyResult, FoldStore
from ..tracing import record_apply

if TYPE_CHECKING:
    from ..metrics import ProjectorMetrics

__all__ = ["BatchProjector", "BatchReport", "SeqGap"]

_LOG = logging.getLogger("foldline.projector")


@dataclass(frozen=True, slots=True)
class SeqGap:
    """The store needed ``expected_seq`` next but the consumed run started at ``first_seq``."""

    session_id: str
    expected_seq: int
    first_seq: int


@dataclass(slots=True)
class BatchReport:
    """What one :meth:`BatchProjector.project` call did."""

    events: int = 0  # events in the batch
    applied: int = 0  # events newly folded by deltas
    duplicates: int = 0  # redelivered events skipped
    dead_letters: int = 0  # records the consumer dead-lettered
    leases: int = 0
    gaps: list[SeqGap] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)
    erased: list[str] = field(default_factory=list)  # sessions met erased: their folds are tombstones now
    fenced: list[ConsumedEvent] = field(default_factory=list)
    apply_seconds: float = 0.0

    def merge(self, other: BatchReport) -> None:
        self.events += other.events
        self.applied += other.applied
        self.duplicates += other.duplicates
        self.dead_letters += other.dead_letters
        self.leases += other.leases
        self.gaps.extend(other.gaps)
        self.rebuilt.extend(other.rebuilt)
        self.erased.extend(other.erased)
        self.fenced.extend(other.fenced)
        self.apply_seconds += other.apply_seconds


@dataclass(slots=True)
class _Run:
    session_id: str
    epoch: int
    events: list[ConsumedEvent]


class BatchProjector:
    """Apply batches of consumed items to ``store``; rebuild sessions from ``log`` when a delta cannot apply."""

    def __init__(self, store: FoldStore, log: EventLog, *, metrics: ProjectorMetrics | None = None) -> None:
        self.store = store
        self.log = log
        self.metrics = metrics

    def project(self, items: Iterable[ConsumedItem]) -> BatchReport:
        report = BatchReport()
        runs: list[_Run] = []
        last_run: dict[str, _Run] = {}
        epochs: dict[str, int] = {}
        leases: dict[str, int] = {}  # writer leases seen: fence older epochs in the store from now on
        for item in items:
            if isinstance(item, DeadLetter):
                report.dead_letters += 1
                continue
            if isinstance(item, ConsumedLease):
                report.leases += 1
                leases[item.session_id] = max(leases.get(item.session_id, 0), item.epoch)
                epochs[item.session_id] = max(epochs.get(item.session_id, 0), item.epoch)
                continue
            report.events += 1
            sid = item.session_id
            epochs[sid] = max(epochs.get(sid, 0), item.epoch)
            run = last_run.get(sid)
            if run is None or run.epoch != item.epoch or run.events[-1].event.seq + 1 != item.event.seq:
                run = _Run(sid, item.epoch, [item])
                runs.append(run)
                last_run[sid] = run
            else:
                run.events.append(item)
        if not runs:
            if leases:
                self.store.raise_epochs(leases)
            return report

        rebuild: dict[str, None] = {}  # ordered set
        deltas: list[tuple[str, FoldDelta]] = []
        delta_runs: list[_Run] = []
        erased = {r.session_id: None for r in runs if any(c.event.sealed is not None for c in r.events)}
        for sid in erased:  # its key was destroyed: its content is never folded again
            self.store.erase(sid)
            report.erased.append(sid)
        for run in runs:
            if run.session_id in rebuild or run.session_id in erased:
                continue
            delta = fold_delta([c.event for c in run.events], run.epoch)
            if delta is None:  # a surface replace: positions depend on the whole surface
                rebuild[run.session_id] = None
                continue
            deltas.append((run.session_id, delta))
            delta_runs.append(run)

        started = time.perf_counter()
        results = self.store.apply_many(deltas)
        for run, result in zip(delta_runs, results, strict=True):
            self._account(run, result, report, rebuild)
        if leases:  # after the deltas: the batch's events older than a lease precede it in the log
            self.store.raise_epochs(leases)
        for sid in rebuild:
            self.rebuild(sid, epoch=epochs.get(sid, 0))
            report.rebuilt.append(sid)
        report.apply_seconds = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.projector_applied(report.applied, report.apply_seconds)
            if report.duplicates:
                self.metrics.duplicate(report.duplicates)
        record_apply(report.events, report.applied, report.duplicates, len(last_run), report.apply_seconds)
        return report

    def _account(self, run: _Run, result: ApplyResult, report: BatchReport, rebuild: dict[str, None]) -> None:
        first = run.events[0].event.seq
        last = run.events[-1].event.seq
        sid = run.session_id
        if result.status == "applied":
            previous = first - 1 if result.previous_seq is None else max(result.previous_seq, first - 1)
            report.applied += last - previous
            report.duplicates += previous - (first - 1)
        elif result.status == "duplicate":
            report.duplicates += len(run.events)
        elif result.status == "gap":
            if sid not in rebuild and result.applied_seq >= 0:
                expected = result.expected_seq if result.expected_seq is not None else result.applied_seq + 1
                gap = SeqGap(sid, expected, first)
                report.gaps.append(gap)
                _LOG.warning(
                    "seq gap in session %r: the fold has applied seq %d but the next consumed event is seq %d; "
                    "rebuilding the session from the log",
                    sid,
                    result.applied_seq,
                    first,
                )
                if self.metrics is not None:
                    self.metrics.seq_gap()
            rebuild[sid] = None
        else:  # fenced
            _LOG.warning(
                "session %r: events %d..%d carry writer epoch %d, older than the fold's; dead-lettering them",
                sid,
                first,
                last,
                run.epoch,
            )
            report.fenced.extend(run.events)
            if self.metrics is not None:
                self.metrics.fenced_write()

    def rebuild(self, session_id: str, *, epoch: int | None = None) -> ApplyResult:
        """Replace the session's fold with a fresh fold of its whole log (``--rebuild``, gaps, replaces).

        The fold keeps the newer of ``epoch`` and the fold's current epoch. Raises
        :class:`~foldline.errors.SessionNotFound` when the log has no events for the session.
        """
        events = self.log.read(session_id)
        if not events:
            raise SessionNotFound(session_id)
        try:
            session = Session(session_id, events)
        except ContentErased:  # erased since: the tombstone, never its content
            self.store.erase(session_id)
            return ApplyResult("duplicate", self.store.applied_seq(session_id))
        result: ApplyResult | None = None
        for _ in range(5):
            current = self.store.get(session_id)
            use = max(current.epoch if current is not None else 0, epoch or 0)
            result = self.store.put(fold_state(session, use))
            if result.status != "fenced":  # fenced: another projector moved the epoch meanwhile; re-read it
                break
        assert result is not None
        if result.status == "fenced":
            raise StoreUnavailable(
                f"session {session_id!r}: the fold's epoch kept moving while it was rebuilt; retry the rebuild"
            )
        if self.metrics is not None:
            self.metrics.fold_rebuilt()
        return result
