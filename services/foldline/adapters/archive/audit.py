"""Accounting for every object of an archive: what each manifest names, and what nothing names.

:func:`audit_archive` lists the store once and reads every manifest. It reports:

* **orphans** — objects under ``sessions/`` that no manifest names (neither a segment, nor the pending one,
  nor a merge's announced segment, nor a retired one), including objects in a session directory without a
  manifest. The protocols never leave one (docs/RETENTION.md); an orphan is an object copied in by hand or
  left by a failed tool, and is safe to delete once reported;
* **missing** — segments a manifest lists that the store does not have;
* **pending** — segments announced but not committed (an archiver is writing them, or stopped before it
  finished: the next append to the session completes them); **merging** — merges announced and not
  committed (the next merge of the session completes them);
* **retired** — segments merges replaced that are still in the store, kept for readers of older
  manifests; with ``grace_ms`` and ``now_ms``, those past their grace period are listed in ``overdue``
  (the archiver deletes them when it next touches the session);
* with ``verify``, **corrupt** — segments (merged ones included) whose bytes fail their digest, metadata or
  seq checks;
* **segments per session** (``per_session``) and the bytes the live segments take (``bytes``).

A manifest that does not decode is reported as corrupt (its session's objects are then not judged).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ...errors import ArchiveCorrupt, ArchiveError
from ...ports.archive import ArchiveStore
from .layout import MANIFEST_NAME, SESSIONS_PREFIX, decode_manifest, session_of_manifest_key
from .reader import SessionArchive

__all__ = ["ArchiveAudit", "audit_archive"]


@dataclass(slots=True)
class ArchiveAudit:
    sessions: int = 0
    segments: int = 0
    events: int = 0
    bytes: int = 0  # of the live segments
    per_session: dict[str, int] = field(default_factory=dict)  # segments of each session
    orphans: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    merging: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)  # still in the store
    overdue: list[str] = field(default_factory=list)  # retired and past the grace period
    corrupt: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.corrupt)

    @property
    def max_segments(self) -> int:
        """The most segments any one session has (0 with no session)."""
        return max(self.per_session.values(), default=0)

    @property
    def bytes_per_event(self) -> float:
        return self.bytes / self.events if self.events else 0.0


def audit_archive(
    store: ArchiveStore, *, verify: bool = False, grace_ms: int | None = None, now_ms: int | None = None
) -> ArchiveAudit:
    """Audit every session directory of ``store`` (see the module docstring)."""
    by_dir: dict[str, set[str]] = defaultdict(set)
    report = ArchiveAudit()
    for key in store.keys(SESSIONS_PREFIX):
        parts = key.split("/")
        if len(parts) != 4:
            report.orphans.append(key)
            continue
        by_dir["/".join(parts[:3]) + "/"].add(parts[3])
    reader = SessionArchive(store, cache_events=0) if verify else None
    for directory, names in sorted(by_dir.items()):
        session_id = session_of_manifest_key(directory + MANIFEST_NAME)
        if MANIFEST_NAME not in names or session_id is None:
            report.orphans.extend(directory + n for n in sorted(names))
            continue
        stored = store.read(directory + MANIFEST_NAME)
        if stored is None:  # removed while listing
            report.orphans.extend(directory + n for n in sorted(names - {MANIFEST_NAME}))
            continue
        try:
            manifest = decode_manifest(stored.data, session_id, store.where(directory + MANIFEST_NAME))
        except ArchiveCorrupt:
            report.corrupt.append(directory + MANIFEST_NAME)
            continue
        report.sessions += 1
        report.per_session[session_id] = len(manifest.segments)
        named = {ref.key for ref in manifest.segments}
        for ref in manifest.segments:
            report.segments += 1
            report.events += ref.events
            report.bytes += ref.size
            if ref.key not in names:
                report.missing.append(directory + ref.key)
            elif reader is not None:
                try:
                    reader.segment(session_id, ref)
                except ArchiveError:
                    report.corrupt.append(directory + ref.key)
        if manifest.pending is not None:
            named.add(manifest.pending.key)
            report.pending.append(directory + manifest.pending.key)
        if manifest.merging is not None:
            named.add(manifest.merging.segment.key)
            report.merging.append(directory + manifest.merging.segment.key)
        for r in manifest.retired:
            named.add(r.key)
            if r.key in names:  # a tidy may have deleted it already and not yet dropped it
                report.retired.append(directory + r.key)
                if grace_ms is not None and now_ms is not None and r.at_ms + grace_ms <= now_ms:
                    report.overdue.append(directory + r.key)
        report.orphans.extend(directory + n for n in sorted(names - named - {MANIFEST_NAME}))
    return report
