"""Adding a segment to a session's archive: the watermark advances only after the segment is durable.

:meth:`ArchiveAppender.append` archives seqs ``[watermark, end)`` of a session as one segment, in three
conditional writes (docs/RETENTION.md, "The watermark argument"):

1. **intent** — the manifest is replaced (compare-and-set on the version read) by one that names the new
   segment as ``pending``: its key, range and sha256. Readers ignore a pending segment;
2. **segment** — the segment object is created (create-only). If the key is taken already (another
   archiver, or this one before a crash, wrote it), the object there must have the same sha256;
3. **commit** — the manifest is replaced (compare-and-set on the intent's version) by one that lists
   the segment and has no pending one: the watermark moves to ``end``.

A crash between any two steps leaves a manifest whose watermark is unchanged and which names exactly the
segment that may exist: whoever appends to the session next completes that pending segment first (the
object exists: check its digest and commit; it does not: write it, then commit). So no segment object is
ever left unnamed by its manifest, no seq is archived twice and none is skipped. A lost compare-and-set
(another archiver appended meanwhile) re-reads the manifest and starts over from what it says.

The bytes of a segment are a function of its events (:func:`~.segments.build_segment`), so two archivers
completing the same pending segment write identical objects.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from ...errors import ArchiveConflict, ArchiveCorrupt
from ...ports.archive import Manifest, SegmentRef
from .layout import encode_manifest, manifest_key, segment_key, segment_name
from .reader import SessionArchive

__all__ = ["ArchiveAppender", "SegmentSource"]

_LOG = logging.getLogger("foldline.archive")
_MAX_ROUNDS = 16

SegmentSource = Callable[[int, int], bytes]
"""``segment_for(first, end)``: the segment bytes of seqs ``first`` up to ``end`` of the session."""


class ArchiveAppender:
    """Appends segments to sessions' archives in ``archive``'s store (see the module docstring). Thread-safe
    for different sessions; appends to one session from many threads or processes are serialized by the
    manifest's compare-and-set."""

    def __init__(self, archive: SessionArchive) -> None:
        self.archive = archive
        self.store = archive.store

    def append(self, session_id: str, end: int, segment_for: SegmentSource, *, new: bool = False) -> Manifest:
        """Archive the session up to ``end`` (one segment from the watermark); the manifest afterwards.

        Returns at once when the watermark is at or past ``end`` already. ``new``: the caller believes the
        session has no archive yet (it met its seq 0), so a manifest it does not know of is not read first
        — a wrong guess costs one refused write. Raises :class:`~foldline.errors.ArchiveConflict` only when
        other archivers kept winning for many rounds.
        """
        return self.append_counted(session_id, end, segment_for, new=new)[0]

    def append_counted(
        self, session_id: str, end: int, segment_for: SegmentSource, *, new: bool = False
    ) -> tuple[Manifest, int]:
        """:meth:`append`, and how many events the segment this call committed holds (0: none)."""
        key = manifest_key(session_id)
        guess = new and self.archive.cached(session_id) is None
        for _ in range(_MAX_ROUNDS):
            if guess:
                manifest, version, guess = Manifest(session_id), None, False
            else:
                found, version = self.archive.versioned(session_id)
                manifest = found if found is not None else Manifest(session_id)
            try:
                if manifest.pending is not None:
                    self._complete(session_id, manifest, version, segment_for)
                    continue
                if manifest.next_seq >= end:
                    return manifest, 0
                first = manifest.next_seq
                data = segment_for(first, end)
                ref = SegmentRef(segment_name(first, end), first, end, hashlib.sha256(data).hexdigest(), len(data))
                intent = Manifest(session_id, manifest.segments, ref)
                version = self.store.replace(key, encode_manifest(intent), version)
                self.archive.remember(session_id, intent, version)
                self._write_segment(session_id, ref, data)
                return self._commit(session_id, intent, version), ref.events
            except ArchiveConflict:
                self.archive.forget(session_id)  # another archiver moved it: read it again
        raise ArchiveConflict(
            self.store.where(key), f"other archivers changed it {_MAX_ROUNDS} times while this one tried to append"
        )

    def _complete(self, session_id: str, manifest: Manifest, version: str | None, segment_for: SegmentSource) -> None:
        """Finish the pending segment a manifest names (written or not), then commit it."""
        ref = manifest.pending
        assert ref is not None
        key = segment_key(session_id, ref)
        stored = self.store.read(key)
        if stored is not None:
            digest = hashlib.sha256(stored.data).hexdigest()
            if digest != ref.sha256:
                raise ArchiveCorrupt(
                    self.store.where(key),
                    f"the manifest of session {session_id!r} announced it with sha256 {ref.sha256}, the object "
                    f"there has {digest}",
                )
        else:
            data = segment_for(ref.first, ref.end)
            digest = hashlib.sha256(data).hexdigest()
            if digest != ref.sha256:  # announced by another build of foldline: announce these bytes instead
                ref = SegmentRef(ref.key, ref.first, ref.end, digest, len(data))
                manifest = Manifest(session_id, manifest.segments, ref)
                version = self.store.replace(manifest_key(session_id), encode_manifest(manifest), version)
            self._write_segment(session_id, ref, data)
        _LOG.info("archive of %r: completed the pending segment %s", session_id, ref.key)
        self._commit(session_id, manifest, version)

    def _write_segment(self, session_id: str, ref: SegmentRef, data: bytes) -> None:
        key = segment_key(session_id, ref)
        if self.store.create(key, data):
            return
        stored = self.store.read(key)
        if stored is None:  # removed between the two calls (an operator cleaning up): write it again
            if self.store.create(key, data):
                return
            stored = self.store.read(key)
        digest = None if stored is None else hashlib.sha256(stored.data).hexdigest()
        if digest != ref.sha256:
            raise ArchiveCorrupt(
                self.store.where(key),
                f"an object is already there with sha256 {digest}; segment {ref.key} of session {session_id!r} "
                f"has {ref.sha256}",
            )

    def _commit(self, session_id: str, intent: Manifest, version: str | None) -> Manifest:
        ref = intent.pending
        assert ref is not None
        done = Manifest(session_id, (*intent.segments, ref), None)
        new_version = self.store.replace(manifest_key(session_id), encode_manifest(done), version)
        self.archive.remember(session_id, done, new_version)
        return done
