"""The archiver's engine: which sessions to archive and when, and writing their segments.

:class:`Archiver` is fed the events a source reads (:meth:`Archiver.offer`: a Kafka consumer-group member
or a poller of the embedded log) and buffers them per session. :meth:`Archiver.step` starts a segment for
every session that is due under the :class:`ArchivePolicy`:

* ``segment_events`` events are waiting (continuous archiving of busy sessions);
* the session's last event is a ``turn/end`` — or an ``approval/request``: the turn paused on approvals, quiet
  until someone decides — and it has been idle ``idle_s`` since;
* its oldest unarchived event is half ``max_delay_s`` old (so every event is archived within
  ``max_delay_s`` while an archiver runs — the bound the topic check holds the retention to);
* the buffers together hold ``max_buffered_events`` (the sessions with most events go first).

Segments are written on a thread pool (S3 waits, not CPU): each flush asks the source which of the
buffered records are the log's (the Kafka index; a foreign record is never archived), fills in whatever
the buffer lacks from the source, and appends one segment from the session's archive watermark through
:class:`~foldline.adapters.archive.ArchiveAppender` (intent, object, commit). Only the engine's own thread
changes the buffers: a finished flush drops the records below the new watermark.

After its append, a flush merges the session's segments while it has more than ``max_segments``
(:class:`~foldline.adapters.archive.MergePolicy`; a merge that fails leaves the session as it was, every
event archived, and is tried again at the session's next flush), and deletes the segments merges replaced
once ``grace_s`` has passed. Those deletions are scheduled: a session that gets no new events has its
retired segments deleted by a job of their own when they are due (an archiver that restarts forgets the
schedule; the session's next flush, or ``foldline doctor --audit`` naming them, catches up).

:meth:`Archiver.safe_offsets` is what a Kafka source may commit: per partition, the offset of the oldest
buffered record not yet archived (or, with none, the end of what was read). A restarted archiver
therefore reads again every record that is not in the archive — the half of the watermark argument
that lives here (docs/RETENTION.md).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from ..adapters.archive import ArchiveAppender, MergePolicy, build_segment
from ..backoff import Backoff
from ..errors import EventsExpired, FoldlineError
from ..metrics import ArchiverMetrics
from ..ports.archive import RawEvent

__all__ = ["ArchivePolicy", "ArchiveSource", "Archiver", "FlushOutcome"]

_LOG = logging.getLogger("foldline.archiver")
_RETRY = Backoff(initial_s=0.5, cap_s=30.0)  # a session whose flush failed is tried again after this
#: Event types after which a session is quiet until someone acts: a turn that ended, one paused on approvals.
_QUIET_AFTER = frozenset({"turn/end", "approval/request"})


@dataclass(frozen=True, slots=True)
class ArchivePolicy:
    """Which sessions are archived, and when (see the module docstring)."""

    sessions: tuple[str, ...] = ("*",)  # fnmatch patterns of session ids
    idle_s: float = 60.0
    max_delay_s: float = 3600.0
    segment_events: int = 10_000
    max_segment_events: int = 100_000
    max_buffered_events: int = 2_000_000
    max_segments: int = 4  # per session; more are merged (MergePolicy)
    grace_s: float = 3600.0  # a segment a merge replaced is deleted this long after it

    def __post_init__(self) -> None:
        if not self.sessions:
            raise ValueError("the archive policy names no sessions (use '*' for all)")
        if self.idle_s < 0 or self.max_delay_s <= 0 or self.grace_s < 0:
            raise ValueError("idle_s and grace_s must be >= 0 and max_delay_s > 0")
        if not 1 <= self.segment_events <= self.max_segment_events:
            raise ValueError("segment_events must be between 1 and max_segment_events")
        MergePolicy(self.max_segments)  # checks it

    @property
    def merges(self) -> MergePolicy:
        return MergePolicy(self.max_segments)

    @property
    def all_sessions(self) -> bool:
        return "*" in self.sessions

    def archives(self, session_id: str) -> bool:
        return self.all_sessions or any(fnmatch.fnmatchcase(session_id, p) for p in self.sessions)


class ArchiveSource(Protocol):
    """What the engine asks of the log it archives."""

    def offsets(self, session_ids: Sequence[str]) -> Mapping[str, Sequence[int]] | None:
        """Each session's record offsets by seq (which records are the log's); ``None``: every record is."""

    def fetch(self, session_id: str, from_seq: int, to_seq: int) -> list[RawEvent]:
        """The session's events ``from_seq`` up to ``to_seq``, from the log itself."""


@dataclass(slots=True)
class _Buffer:
    """One session's events read and not yet archived, in arrival order (a session is on one partition)."""

    events: list[RawEvent] = field(default_factory=list)
    last_time_ms: int = 0
    last_kind: str = ""
    oldest_ms: int = 0
    first_offset: int = -1  # the lowest offset among ``events`` (-1: none, or a source without offsets)
    partition: int = -1
    retry_at: float = 0.0
    failures: int = 0

    def keep(self, events: list[RawEvent]) -> int:
        """Keep only ``events`` (a subset); how many were dropped."""
        dropped = len(self.events) - len(events)
        self.events = events
        if events:
            self.oldest_ms = min(e.time_ms for e in events)
            self.first_offset = min(e.offset for e in events)
        return dropped


@dataclass(frozen=True, slots=True)
class FlushOutcome:
    """What one flush did: the session's watermark after it (-1: unknown), and records that are not the
    log's; then its merges (committed, the events they hold, the segments left), the retired segments it
    deleted and when the next may be (epoch ms)."""

    session_id: str
    watermark: int
    events: int
    seconds: float
    foreign: frozenset[int] = frozenset()
    error: FoldlineError | None = None
    merges: int = 0
    merged_events: int = 0
    segments: int = -1
    deleted: int = 0
    tidy_at_ms: int | None = None


class Archiver:
    """Buffers events per session and archives them under ``policy``; see the module docstring.

    Not thread-safe: one thread calls :meth:`offer`, :meth:`step`, :meth:`safe_offsets` and
    :meth:`forget_partitions`; flushes run on ``concurrency`` worker threads.
    """

    def __init__(
        self,
        appender: ArchiveAppender,
        source: ArchiveSource,
        policy: ArchivePolicy,
        *,
        concurrency: int = 16,
        metrics: ArchiverMetrics | None = None,
        clock: Callable[[], float] = time.time,
        on_flush: Callable[[FlushOutcome], None] | None = None,
    ) -> None:
        self.appender = appender
        self.source = source
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._on_flush = on_flush
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="foldline-archive")
        self._buffers: dict[str, _Buffer] = {}
        self._in_flight: dict[str, Future[FlushOutcome]] = {}
        self._tidy_at: dict[str, float] = {}  # session -> when its next retired segment may be deleted (epoch s)
        self._read_to: dict[int, int] = {}  # partition -> offset after the last record read
        self._buffered = 0
        self.archived_events = 0
        self.segments = 0
        self.merges = 0
        self.merged_events = 0
        self.deleted = 0

    # -------------------------------------------------------------- feeding

    def offer(self, events: Iterable[RawEvent], read_to: Mapping[int, int] | None = None) -> None:
        """Buffer ``events`` (sessions the policy archives); ``read_to``: per partition, the offset after them."""
        policy = self.policy
        buffers = self._buffers
        added = 0
        for e in events:  # an archiver's hot loop: kept flat
            buf = buffers.get(e.session_id)
            if buf is None:
                if not policy.archives(e.session_id):
                    continue
                buf = buffers[e.session_id] = _Buffer()
            held = buf.events
            time_ms = e.time_ms
            if not held:
                buf.oldest_ms, buf.first_offset, buf.partition = time_ms, e.offset, e.partition
            else:
                buf.oldest_ms = min(buf.oldest_ms, time_ms)
                buf.first_offset = min(buf.first_offset, e.offset)
            held.append(e)
            if time_ms >= buf.last_time_ms:
                buf.last_time_ms, buf.last_kind = time_ms, e.kind
            added += 1
        self._buffered += added
        if read_to:
            for part, off in read_to.items():
                self._read_to[part] = max(off, self._read_to.get(part, 0))

    @property
    def backlog(self) -> int:
        return self._buffered

    @property
    def busy(self) -> bool:
        return bool(self._in_flight)

    @property
    def tidying(self) -> int:
        """Sessions with retired segments scheduled for deletion."""
        return len(self._tidy_at)

    # -------------------------------------------------------------- flushing

    def due(self, now: float | None = None) -> list[str]:
        """Sessions due for a segment now (not counting those already being written)."""
        now_s = self._clock() if now is None else now
        policy = self.policy
        half_delay_ms = policy.max_delay_s * 500.0
        idle_ms = policy.idle_s * 1000.0
        now_ms = now_s * 1000.0
        out: list[str] = []
        for sid, buf in self._buffers.items():
            if sid in self._in_flight or not buf.events or buf.retry_at > now_s:
                continue
            if (
                len(buf.events) >= policy.segment_events
                or (buf.last_kind in _QUIET_AFTER and now_ms - buf.last_time_ms >= idle_ms)
                or now_ms - buf.oldest_ms >= half_delay_ms
            ):
                out.append(sid)
        if self._buffered > policy.max_buffered_events:
            chosen = set(out)
            waiting = sorted(
                (s for s in self._buffers if s not in chosen and s not in self._in_flight),
                key=lambda s: -len(self._buffers[s].events),
            )
            over = self._buffered - policy.max_buffered_events
            for sid in waiting:
                if over <= 0:
                    break
                out.append(sid)
                over -= len(self._buffers[sid].events)
        return out

    def step(self, now: float | None = None, *, everything: bool = False) -> list[FlushOutcome]:
        """Collect finished flushes, then start the due ones (``everything``: every buffered session)."""
        done = self.collect()
        sessions = [s for s in self._buffers if s not in self._in_flight] if everything else self.due(now)
        for sid in sessions:
            snapshot = list(self._buffers[sid].events)
            self._in_flight[sid] = self._pool.submit(self._flush, sid, snapshot)
        if self._tidy_at:
            now_s = self._clock() if now is None else now
            for sid, at in list(self._tidy_at.items()):
                if at <= now_s and sid not in self._in_flight:
                    del self._tidy_at[sid]
                    self._in_flight[sid] = self._pool.submit(self._flush, sid, [])
        self._report_backlog(now)
        return done

    def collect(self, *, wait: bool = False) -> list[FlushOutcome]:
        """Apply finished flushes to the buffers (``wait``: wait for every one in flight first)."""
        out: list[FlushOutcome] = []
        for sid, future in list(self._in_flight.items()):
            if not wait and not future.done():
                continue
            outcome = future.result()
            del self._in_flight[sid]
            self._apply(outcome)
            out.append(outcome)
        return out

    def drain(self, timeout_s: float = 60.0) -> None:
        """Archive everything buffered (a clean stop or a test): flush every session until none is left."""
        deadline = time.monotonic() + timeout_s
        while self._buffers or self._in_flight:
            self.step(everything=True)
            self.collect(wait=True)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the archiver did not drain {self._buffered} buffered events in {timeout_s:g}s")
            if self._buffers and all(b.retry_at > self._clock() for b in self._buffers.values()):
                time.sleep(min(b.retry_at for b in self._buffers.values()) - self._clock())

    def _apply(self, outcome: FlushOutcome) -> None:
        buf = self._buffers.get(outcome.session_id)
        if self._on_flush is not None:
            self._on_flush(outcome)
        if outcome.tidy_at_ms is not None:
            self._tidy_at[outcome.session_id] = outcome.tidy_at_ms / 1000.0
        if outcome.merges or outcome.deleted:
            self.merges += outcome.merges
            self.merged_events += outcome.merged_events
            self.deleted += outcome.deleted
            if self.metrics is not None:
                self.metrics.merged(outcome.merges, outcome.merged_events)
                self.metrics.retired_deleted.inc(outcome.deleted)
        if buf is None:  # its partition was revoked meanwhile (or a tidy of a session with nothing buffered)
            return
        if outcome.error is not None:
            buf.failures += 1
            buf.retry_at = self._clock() + _RETRY.pause(buf.failures)
            if isinstance(outcome.error, EventsExpired):
                _LOG.error("session %r cannot be archived: %s", outcome.session_id, outcome.error)
            else:
                _LOG.warning("archiving session %r failed (retrying): %s", outcome.session_id, outcome.error)
            if self.metrics is not None:
                self.metrics.archive_error(type(outcome.error).__name__)
            return
        buf.failures = 0
        buf.retry_at = 0.0
        self._buffered -= buf.keep(
            [e for e in buf.events if e.seq >= outcome.watermark and e.offset not in outcome.foreign]
        )
        if not buf.events:
            del self._buffers[outcome.session_id]
        if outcome.events:
            self.archived_events += outcome.events
            self.segments += 1
            if self.metrics is not None:
                self.metrics.segment_written(outcome.events, outcome.seconds)

    def _flush(self, session_id: str, snapshot: list[RawEvent]) -> FlushOutcome:
        """Runs on a worker: archive the session up to the last of the log's records in ``snapshot``, then
        merge its segments and delete what is due (an empty ``snapshot``: only the latter)."""
        started = time.perf_counter()
        try:
            archived = self._archive(session_id, snapshot, started) if snapshot else None
        except EventsExpired as exc:
            if self.metrics is not None:
                self.metrics.expired(1)
            return FlushOutcome(session_id, -1, 0, time.perf_counter() - started, error=exc)
        except FoldlineError as exc:
            return FlushOutcome(session_id, -1, 0, time.perf_counter() - started, error=exc)
        if archived is None:
            archived = FlushOutcome(session_id, -1, 0, 0.0)
        if archived.watermark == -1 and snapshot:  # nothing of the log's was in it
            return archived
        return self._compact(archived)

    def _compact(self, archived: FlushOutcome) -> FlushOutcome:
        """Merge the session's segments as the policy asks and delete retired ones that are due; a failure
        here is logged and counted, and leaves every event archived (the next flush tries again)."""
        sid = archived.session_id
        grace_ms = int(self.policy.grace_s * 1000)
        now_ms = int(self._clock() * 1000)
        try:
            merged = self.appender.merge(sid, self.policy.merges, now_ms=now_ms, grace_ms=grace_ms)
            deleted, tidy_at = 0, merged.tidy_at_ms
            if tidy_at is not None and tidy_at <= now_ms:
                deleted, tidy_at = self.appender.tidy(sid, now_ms=now_ms, grace_ms=grace_ms)
        except FoldlineError as exc:
            _LOG.warning("merging the archive of session %r failed (tried again at its next flush): %s", sid, exc)
            if self.metrics is not None:
                self.metrics.archive_error(type(exc).__name__)
            return archived
        return dataclasses.replace(
            archived,
            merges=merged.merges,
            merged_events=merged.events,
            segments=merged.segments,
            deleted=deleted,
            tidy_at_ms=tidy_at,
        )

    def _archive(self, session_id: str, snapshot: list[RawEvent], started: float) -> FlushOutcome:
        known = self.source.offsets([session_id])
        offsets = None if known is None else known.get(session_id, ())
        bodies: dict[int, RawEvent] = {}
        foreign: set[int] = set()
        for e in snapshot:
            if offsets is not None and (e.seq >= len(offsets) or offsets[e.seq] != e.offset):
                foreign.add(e.offset)
                continue
            bodies[e.seq] = e
        if not bodies:  # nothing of the log's: the records were foreign
            return FlushOutcome(session_id, -1, 0, time.perf_counter() - started, frozenset(foreign))
        end = max(bodies) + 1
        fingerprint = next(iter(bodies.values())).fingerprint

        def segment_for(first: int, stop: int) -> bytes:
            missing = [q for q in range(first, stop) if q not in bodies]
            if missing:  # not met in the stream (read before a restart, or before the policy named it)
                for e in self.source.fetch(session_id, missing[0], missing[-1] + 1):
                    bodies.setdefault(e.seq, e)
            return build_segment(session_id, first, [bodies[q].body for q in range(first, stop)], fingerprint)

        cached = self.appender.archive.cached(session_id)
        watermark = 0 if cached is None or cached[0] is None else cached[0].next_seq
        new = cached is None and 0 in bodies  # met from seq 0, never archived by this process: no manifest read
        limit = self.policy.max_segment_events
        archived = 0
        while watermark < end:
            manifest, written = self.appender.append_counted(
                session_id, min(end, watermark + limit), segment_for, new=new
            )
            new = False
            archived += written
            watermark = manifest.next_seq
        return FlushOutcome(session_id, watermark, archived, time.perf_counter() - started, frozenset(foreign))

    # -------------------------------------------------------------- positions

    def safe_offsets(self) -> dict[int, int]:
        """Per partition read so far, the offset a restart must read from so that nothing unarchived is skipped."""
        oldest: dict[int, int] = {}
        for buf in self._buffers.values():
            part = buf.partition
            if buf.events and part >= 0 and (part not in oldest or buf.first_offset < oldest[part]):
                oldest[part] = buf.first_offset
        return {p: min(end, oldest.get(p, end)) for p, end in self._read_to.items()}

    def forget_partitions(self, partitions: set[int]) -> None:
        """Drop what was buffered from ``partitions`` (revoked: their next owner reads them again)."""
        for sid, buf in list(self._buffers.items()):
            if buf.partition in partitions:
                self._buffered -= len(buf.events)
                del self._buffers[sid]
        for p in partitions:
            self._read_to.pop(p, None)

    def _report_backlog(self, now: float | None) -> None:
        if self.metrics is None:
            return
        now_ms = (self._clock() if now is None else now) * 1000.0
        oldest = min((b.oldest_ms for b in self._buffers.values() if b.events), default=None)
        self.metrics.set_backlog(
            events=self._buffered, oldest_seconds=0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000.0)
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)
