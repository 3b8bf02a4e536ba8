"""Session archives: segments of events as Avro container files, manifests, and reading and appending them.

=============  ==========================================================================================
module         holds
=============  ==========================================================================================
``layout``     where a session's objects live in a store (keys), and the manifest's JSON
``segments``   a segment's bytes (fastavro container file, deflate) from Avro bodies, its events back, merges
``reader``     :class:`SessionArchive`, the ``ArchiveReader`` of a store: manifests, digest-checked segments
``merging``    :class:`MergePolicy`: which run of a session's segments is merged next (pure)
``writer``     :class:`ArchiveAppender`: appends, merges, tidies — each intent, object, commit
``audit``      :func:`audit_archive`: every object accounted for; orphans, overlaps and missing segments named
=============  ==========================================================================================

The stores themselves are :class:`foldline.adapters.s3_archive.S3ArchiveStore` and
:class:`foldline.adapters.dir_archive.DirectoryArchiveStore`. docs/RETENTION.md has the whole model.
"""

from __future__ import annotations

from .audit import ArchiveAudit, audit_archive
from .layout import manifest_key, segment_key, session_dir
from .merging import MergePolicy
from .reader import SessionArchive
from .segments import SegmentEncoder, body_of, build_segment, merge_segments, read_segment
from .writer import ArchiveAppender, MergeOutcome, SegmentSource

__all__ = [
    "ArchiveAppender",
    "ArchiveAudit",
    "MergeOutcome",
    "MergePolicy",
    "SegmentEncoder",
    "SegmentSource",
    "SessionArchive",
    "audit_archive",
    "body_of",
    "build_segment",
    "manifest_key",
    "merge_segments",
    "read_segment",
    "segment_key",
    "session_dir",
]
