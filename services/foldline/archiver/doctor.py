"""``foldline doctor``: can this deployment lose the log? Every check an operator needs, answered.

:func:`run_checks` asks, for the configured backend:

* **kafka** — the log's topics exist with the configured partition count, and every setting that could
  delete or lose events is safe (:mod:`foldline.adapters.kafka.retention`: cleanup policy, retention by
  time and size against the archive's maximum delay, replication, ``min.insync.replicas``, unclean
  leader election);
* **archive** — the archive store answers where it is configured (a check never creates it: a directory
  that is not there is a failure, not an empty archive); on Kafka, how far the archivers' consumer group
  got in every partition, and whether Kafka deleted records the group never archived (a failure: those
  events are neither in Kafka nor in the archive); on the embedded log, whether every session the archive
  takes is archived up to the events older than the maximum delay (a failure names the sessions that are
  not); and which build of the Avro decoder reads segments (a warning when it is the interpreted one:
  :mod:`foldline.adapters.avro.decoding`);
* **audit** (``audit=True``) — every archive object is accounted for (no orphan, no missing or corrupt
  segment, merged ones included — each read back and checked; :func:`~foldline.adapters.archive.audit_archive`),
  how many segments each session has against ``FOLDLINE_ARCHIVE_MAX_SEGMENTS`` and the bytes per event they
  take, merges announced and not committed, segments merges replaced and whether any is past its grace
  period, and no archived session is ahead of the log (a log rebuilt without ``foldline restore``).

Each answer is a :class:`Check`: ``ok``, ``warn`` (works, but read it) or ``fail``. Nothing here writes: the
log is opened read-only (topics that are missing are reported, never created) and so is the archive.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..config import Config
from ..config.factories import archive_store, check_kafka, sqlite_log, topic_policy
from ..errors import FoldlineError
from ..ports.archive import ArchiveStore
from ..ports.event_log import EventLog

if TYPE_CHECKING:
    from ..adapters.archive import ArchiveAudit
    from ..adapters.archive.reader import SessionArchive

__all__ = ["Check", "Status", "run_checks"]

Status = Literal["ok", "warn", "fail"]
_LISTED = 10  # objects named per failed audit check


@dataclass(frozen=True, slots=True)
class Check:
    area: str  # kafka | archive | audit | log
    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"area": self.area, "name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def run_checks(config: Config, *, audit: bool = False) -> list[Check]:
    """Every check for ``config`` (see the module docstring); a server that does not answer is a failed check."""
    checks: list[Check] = []
    store: ArchiveStore | None = None
    try:
        store = archive_store(config, create=False)  # a check never creates what it checks
    except FoldlineError as exc:
        checks.append(Check("archive", "store", "fail", f"{type(exc).__name__}: {exc}"))
    try:
        if config.backend == "embedded":
            checks += _embedded(config)
        else:
            checks += _kafka(config, archived=store is not None)
        if store is not None:
            checks += _archive(config, store)
            if config.backend == "embedded":
                checks.append(_embedded_coverage(config, store))
            checks.append(_decoder())
            if audit:
                checks += _audit(config, store)
        elif audit:
            checks.append(Check("audit", "archive", "warn", "no archive is configured (FOLDLINE_ARCHIVE=off)"))
    finally:
        if store is not None:
            store.close()
    return checks


def _decoder() -> Check:
    """Which build of the Avro decoder reads the archive: the compiled one, or why not (about half the speed)."""
    from ..adapters.avro import decoding

    if decoding.DECODER != "interpreted":
        return Check("archive", "decoder", "ok", f"segments decode through the {decoding.DECODER} decoder")
    return Check(
        "archive",
        "decoder",
        "warn",
        f"segments decode through the interpreted decoder, about half the compiled one's speed: "
        f"{decoding.why_interpreted}",
        "reinstall foldline where a C compiler is found (the build compiles the decoder with mypyc)",
    )


def _embedded(config: Config) -> list[Check]:
    try:
        with sqlite_log(config, read_only=True) as log:  # an audit never creates a data directory
            count = len(log.sessions())
    except FoldlineError as exc:
        return [Check("log", "embedded log", "fail", f"{type(exc).__name__}: {exc}")]
    return [Check("log", "embedded log", "ok", f"{config.data_dir}: {count} session(s); SQLite keeps every event")]


def _kafka(config: Config, *, archived: bool) -> list[Check]:
    from ..adapters.kafka import KafkaClients, archive_progress, inspect_topics

    k = config.kafka
    try:
        check_kafka(k)
        clients = KafkaClients(k.bootstrap, timeout_s=k.timeout_s, client_config=k.librdkafka())
        topic_checks = inspect_topics(clients, k.topic, partitions=k.partitions, policy=topic_policy(config))
    except FoldlineError as exc:
        return [Check("kafka", f"broker {k.bootstrap}", "fail", f"{type(exc).__name__}: {exc}")]
    out = [
        Check("kafka", f"{c.topic} {c.setting}", "ok" if c.ok else "fail", f"{c.value}: {c.detail}", c.fix)
        for c in topic_checks
    ]
    if not archived or any(c.setting == "exists" for c in topic_checks if not c.ok):
        return out
    group = config.archive.group_for(k.topic)
    try:
        progress = archive_progress(clients, group, k.topic, k.partitions)
    except FoldlineError as exc:
        return [*out, Check("archive", f"group {group}", "fail", f"{type(exc).__name__}: {exc}")]
    lost = [p for p in progress if p.deleted_unarchived]
    for p in lost:
        out.append(
            Check(
                "archive",
                f"{k.topic}[{p.partition}]",
                "fail",
                f"Kafka deleted offsets {p.committed}..{p.low - 1} before the archivers' group {group} archived them: "
                "events there are neither in Kafka nor in the archive",
                "see docs/RETENTION.md, 'When the archiver falls behind'",
            )
        )
    committed = [p for p in progress if p.committed is not None]
    holding = [p for p in progress if p.high > p.low]
    if not committed and holding:
        finite = any(c.setting == "retention.ms" and c.value not in ("-1", "") for c in topic_checks)
        out.append(
            Check(
                "archive",
                f"group {group}",
                "fail" if finite else "warn",
                "no archiver has committed on any partition while the topic holds events"
                + ("; its retention will delete them unarchived" if finite else ""),
                "fix: run `foldline archiver` (the chart's archiver deployment)",
            )
        )
    elif not lost:
        behind = sum(p.behind for p in progress)
        out.append(
            Check(
                "archive",
                f"group {group}",
                "ok",
                f"committed on {len(committed)}/{len(progress)} partitions, {behind} offsets not yet past; "
                "nothing deleted unarchived",
            )
        )
    return out


def _archive(config: Config, store: ArchiveStore) -> list[Check]:
    from ..adapters.archive.layout import SESSIONS_PREFIX

    where = store.where(SESSIONS_PREFIX)
    try:
        list(itertools.islice(store.keys(SESSIONS_PREFIX), 1))
    except FoldlineError as exc:
        return [Check("archive", "store", "fail", f"{where}: {type(exc).__name__}: {exc}")]
    return [
        Check(
            "archive",
            "store",
            "ok",
            f"{where} answers; every event archived within {config.archive.max_delay_s:g}s of being written "
            f"(sessions {config.archive.sessions})",
        )
    ]


def _embedded_coverage(config: Config, store: ArchiveStore, *, now_ms: int | None = None) -> Check:
    """Is every session the archive takes archived, up to its events older than the maximum delay?

    An event written more than ``FOLDLINE_ARCHIVE_MAX_DELAY`` ago and not archived means no archiver has been
    archiving this log into this archive (or one fell behind): the promise of the archive does not hold.
    """
    from ..adapters.archive.layout import SESSIONS_PREFIX
    from ..adapters.archive.reader import SessionArchive
    from ..archiver.factory import archive_policy

    policy = archive_policy(config)
    archive: SessionArchive = SessionArchive(store, cache_events=0)
    oldest_allowed = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) - int(policy.max_delay_s * 1000)
    taken = current = 0
    late: list[tuple[str, int, int]] = []
    try:
        with _log_of(config) as log:
            for sid in log.sessions():
                if not policy.archives(sid):
                    continue
                taken += 1
                head, mark = log.head(sid), archive.watermark(sid)
                if mark >= head:
                    current += 1
                    continue
                first = log.read_stored(sid, mark, mark + 1)
                if first and first[0].time < oldest_allowed:
                    late.append((sid, mark, head))
    except FoldlineError as exc:
        return Check("archive", "sessions archived", "fail", f"{type(exc).__name__}: {exc}")
    if late:
        listed = ", ".join(f"{sid!r} (archived {mark} of {head})" for sid, mark, head in late[:_LISTED])
        more = f" and {len(late) - _LISTED} more" if len(late) > _LISTED else ""
        return Check(
            "archive",
            "sessions archived",
            "fail",
            f"{len(late)} of the {taken} session(s) the archive takes hold events older than "
            f"{policy.max_delay_s:g}s that {store.where(SESSIONS_PREFIX)} lacks: {listed}{more}",
            "run `foldline archiver` on this log with this archive (is FOLDLINE_ARCHIVE_DIR the one it writes?)",
        )
    if not taken:
        return Check("archive", "sessions archived", "ok", "the log holds no session the archive takes yet")
    return Check(
        "archive",
        "sessions archived",
        "ok",
        f"{current} of {taken} session(s) archived to their head, the others within {policy.max_delay_s:g}s",
    )


def _segments_per_session(config: Config, report: ArchiveAudit) -> Check:
    """How many segments a cold read of each session costs, against the merge threshold."""
    counts = sorted(report.per_session.values())
    limit = config.archive.max_segments
    if not counts:
        return Check("audit", "segments per session", "ok", "no archived session")
    over = [(sid, n) for sid, n in sorted(report.per_session.items()) if n > limit]
    detail = (
        f"median {counts[len(counts) // 2]}, max {counts[-1]} (merged while over {limit}); "
        f"{report.bytes_per_event:.1f} bytes per event in {report.segments} segment(s)"
    )
    if not over:
        return Check("audit", "segments per session", "ok", detail)
    listed = ", ".join(f"{sid!r} ({n})" for sid, n in over[:_LISTED])
    more = f" and {len(over) - _LISTED} more" if len(over) > _LISTED else ""
    return Check(
        "audit",
        "segments per session",
        "warn",
        f"{detail}; {len(over)} session(s) have more than {limit}: {listed}{more}",
        "the archiver merges them at each session's next archive; if it runs, its log says why a merge failed",
    )


def _log_of(config: Config) -> EventLog:
    from ..config.factories import kafka_log

    if config.backend == "embedded":
        return sqlite_log(config, read_only=True)
    return kafka_log(config, archive=False, create_topics=False)  # an audit never creates the topics


def _audit(config: Config, store: ArchiveStore) -> list[Check]:
    from ..adapters.archive import SessionArchive, audit_archive

    grace_ms = int(config.archive.grace_s * 1000)
    try:
        report = audit_archive(store, verify=True, grace_ms=grace_ms, now_ms=int(time.time() * 1000))
    except FoldlineError as exc:
        return [Check("audit", "archive", "fail", f"{type(exc).__name__}: {exc}")]

    def named(keys: list[str]) -> str:
        more = f" and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
        return ", ".join(store.where(k) for k in keys[:_LISTED]) + more

    out = [
        Check(
            "audit",
            "objects",
            "ok" if report.clean else "fail",
            f"{report.sessions} session(s), {report.segments} segment(s), {report.events} event(s)"
            + ("" if report.clean else "; see the lines below"),
        )
    ]
    for what, keys, fix in (
        ("orphans", report.orphans, "no manifest names them: delete them once you know where they came from"),
        ("missing", report.missing, "restore them from a copy of the archive"),
        ("corrupt", report.corrupt, "restore them from a copy of the archive"),
    ):
        if keys:
            out.append(Check("audit", what, "fail", f"{len(keys)}: {named(keys)}", fix))
    out.append(_segments_per_session(config, report))
    if report.pending:
        out.append(
            Check(
                "audit",
                "pending",
                "warn",
                f"{len(report.pending)} segment(s) announced, not committed yet: {named(report.pending)}",
                "the next append to each session completes it",
            )
        )
    if report.merging:
        out.append(
            Check(
                "audit",
                "merging",
                "warn",
                f"{len(report.merging)} merge(s) announced, not committed yet: {named(report.merging)}",
                "the archiver's next merge of each session completes it",
            )
        )
    if report.overdue:
        out.append(
            Check(
                "audit",
                "retired",
                "warn",
                f"{len(report.overdue)} segment(s) merges replaced are past the {config.archive.grace_s:g}s grace "
                f"period and still stored (of {len(report.retired)} kept for readers of older manifests): "
                f"{named(report.overdue)}",
                "the archiver deletes them when it next archives or merges each session (a restarted archiver "
                "forgets its schedule)",
            )
        )
    elif report.retired:
        out.append(
            Check(
                "audit",
                "retired",
                "ok",
                f"{len(report.retired)} segment(s) merges replaced, kept for readers of older manifests for "
                f"{config.archive.grace_s:g}s, then deleted",
            )
        )
    try:
        archive = SessionArchive(store, cache_events=0)
        with _log_of(config) as log:
            ahead = [(sid, w, h) for sid in archive.sessions() if (w := archive.watermark(sid)) > (h := log.head(sid))]
    except FoldlineError as exc:
        return [*out, Check("audit", "archive against the log", "fail", f"{type(exc).__name__}: {exc}")]
    if ahead:
        listed = ", ".join(f"{sid!r} (archived {w}, log {h})" for sid, w, h in ahead[:_LISTED])
        out.append(
            Check(
                "audit",
                "archive against the log",
                "fail",
                f"{len(ahead)} session(s) hold more events in the archive than in the log: {listed}",
                "fix: foldline restore (the log was rebuilt without its archive)",
            )
        )
    else:
        out.append(Check("audit", "archive against the log", "ok", "no archived session is ahead of the log"))
    return out
