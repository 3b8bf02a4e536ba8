"""Accounting for every object of an archive: what each manifest names, and what nothing names.

:func:`audit_archive` lists the store once and reads every manifest. It reports:

* **orphans** — objects under ``sessions/`` that no manifest names (neither a segment nor the pending
  one), including objects in a session directory without a manifest. The append protocol never leaves
  one (docs/RETENTION.md); an orphan is an object copied in by hand or left by a failed tool, and is
  safe to delete once reported;
* **missing** — segments a manifest lists that the store does not have;
* **pending** — segments announced but not committed (an archiver is writing them, or stopped before it
  finished: the next append to the session completes them);
* with ``verify``, **corrupt** — segments whose bytes fail their digest, metadata or seq checks.

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
    orphans: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.corrupt)


def audit_archive(store: ArchiveStore, *, verify: bool = False) -> ArchiveAudit:
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
        named = {ref.key for ref in manifest.segments}
        for ref in manifest.segments:
            report.segments += 1
            report.events += ref.events
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
        report.orphans.extend(directory + n for n in sorted(names - named - {MANIFEST_NAME}))
    return report
