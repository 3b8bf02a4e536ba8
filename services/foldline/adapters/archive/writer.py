"""Changing a session's archive: appending a segment, merging segments, deleting what merges retired.

Every change is a sequence of conditional writes that leaves a readable session after any prefix of it
(docs/RETENTION.md, "The watermark argument" and "Merging").

**Appending** (:meth:`ArchiveAppender.append`) archives seqs ``[watermark, end)`` as one segment:

1. **intent** — the manifest is replaced (compare-and-set on the version read) by one that names the new
   segment as ``pending``: its key, range and sha256. Readers ignore a pending segment;
2. **segment** — the segment object is created (create-only). If the key is taken already (another
   archiver, or this one before a crash, wrote it), the object there must have the same sha256;
3. **commit** — the manifest is replaced (compare-and-set on the intent's version) by one that lists
   the segment and has no pending one: the watermark moves to ``end``.

A crash between any two steps leaves a manifest whose watermark is unchanged and which names exactly the
segment that may exist: whoever appends to the session next completes that pending segment first (the
object exists: check its digest and commit; it does not: write it, then commit).

**Merging** (:meth:`ArchiveAppender.merge`) replaces a run of adjacent segments with one holding the same
events (:func:`~.segments.merge_segments`, read back before it is announced), when the
:class:`~.merging.MergePolicy` asks for it:

1. **intent** — the manifest gets ``merging``: the new segment (key, range, sha256) and its inputs;
2. **segment** — the merged object is created (create-only; an object already there must have the
   announced sha256);
3. **commit** — the manifest lists the merged segment in place of its inputs, which move to ``retired``
   with the time; ``merging`` is cleared.

Readers ignore ``merging``, and the inputs stay where they are until long after the commit: a crash at any
point leaves every event readable through the manifest as it stands, and whoever merges the session next
completes the announced merge first (its bytes are a function of the inputs' bytes, so a second archiver
writes the same object).

**Tidying** (:meth:`ArchiveAppender.tidy`) deletes retired segments once their grace period is over (longer
than any reader uses an older manifest: :data:`~.reader.MANIFEST_MAX_AGE_S` plus the longest read), then
drops them from the manifest. A crash in between leaves them listed; the next tidy deletes them again (a
no-op) and drops them.

Changes of one session from many threads or processes are serialized by the manifest's compare-and-set: a
lost one re-reads the manifest and starts over from what it says. No segment object is ever left unnamed by
its manifest (pending, merging and retired segments are named), no seq is archived twice and none is
skipped; a retired segment's key never becomes a segment again (merges only remove boundaries between
segments), so deleting one can only affect readers of a manifest older than the grace period.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...errors import ArchiveConflict, ArchiveCorrupt, ArchiveObjectMissing
from ...ports.archive import Manifest, MergeIntent, RetiredSegment, SegmentRef
from .layout import encode_manifest, manifest_key, segment_key, segment_name, session_dir
from .merging import MergePolicy
from .reader import SessionArchive
from .segments import merge_segments

__all__ = ["ArchiveAppender", "MergeOutcome", "SegmentSource"]

_LOG = logging.getLogger("foldline.archive")
_MAX_ROUNDS = 16
_RECENT_BYTES = 64 * 1024 * 1024  # bytes of segments this appender wrote, kept for the merges that follow

SegmentSource = Callable[[int, int], bytes]
"""``segment_for(first, end)``: the segment bytes of seqs ``first`` up to ``end`` of the session."""


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """What :meth:`ArchiveAppender.merge` did: merges committed, the events their segments hold, the
    segments the session has now, and the earliest time (epoch ms) a retired segment may be deleted."""

    merges: int
    events: int
    segments: int
    tidy_at_ms: int | None


class ArchiveAppender:
    """Appends, merges and tidies sessions' archives in ``archive``'s store (see the module docstring).
    Thread-safe for different sessions; changes of one session from many threads or processes are
    serialized by the manifest's compare-and-set."""

    def __init__(self, archive: SessionArchive) -> None:
        self.archive = archive
        self.store = archive.store
        self._recent_lock = threading.Lock()
        self._recent: OrderedDict[tuple[str, str, str], bytes] = OrderedDict()
        self._recent_bytes = 0

    # -------------------------------------------------------------- appending

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
                intent = replace(manifest, pending=ref)
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
            self._keep_recent(session_id, ref, stored.data)
        else:
            data = segment_for(ref.first, ref.end)
            digest = hashlib.sha256(data).hexdigest()
            if digest != ref.sha256:  # announced by another build of foldline: announce these bytes instead
                ref = SegmentRef(ref.key, ref.first, ref.end, digest, len(data))
                manifest = replace(manifest, pending=ref)
                version = self.store.replace(manifest_key(session_id), encode_manifest(manifest), version)
            self._write_segment(session_id, ref, data)
        _LOG.info("archive of %r: completed the pending segment %s", session_id, ref.key)
        self._commit(session_id, manifest, version)

    def _write_segment(self, session_id: str, ref: SegmentRef, data: bytes) -> None:
        key = segment_key(session_id, ref)
        self._keep_recent(session_id, ref, data)
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
        done = replace(intent, segments=(*intent.segments, ref), pending=None)
        new_version = self.store.replace(manifest_key(session_id), encode_manifest(done), version)
        self.archive.remember(session_id, done, new_version)
        return done

    # -------------------------------------------------------------- merging

    def merge(self, session_id: str, policy: MergePolicy, *, now_ms: int, grace_ms: int) -> MergeOutcome:
        """Complete a merge announced earlier, then merge runs of the session's segments while ``policy``
        asks for one (see the module docstring). ``now_ms`` is when the replaced segments are retired;
        ``grace_ms`` how long they are kept for readers of an older manifest."""
        key = manifest_key(session_id)
        merges = events = 0
        missing: set[str] = set()
        for _ in range(_MAX_ROUNDS):
            found, version = self.archive.versioned(session_id)
            if found is None:
                return MergeOutcome(0, 0, 0, None)
            manifest = found
            try:
                if manifest.merging is not None:
                    done = self._complete_merge(session_id, manifest, version, now_ms)
                    merges, events = merges + 1, events + done.events
                    continue
                run = policy.plan(manifest.segments)
                if run is None:
                    tidy_at = min((r.at_ms for r in manifest.retired), default=None)
                    return MergeOutcome(
                        merges, events, len(manifest.segments), None if tidy_at is None else tidy_at + grace_ms
                    )
                inputs = manifest.segments[run[0] : run[1]]
                data = self._merged(session_id, inputs)
                first, end = inputs[0].first, inputs[-1].end
                ref = SegmentRef(segment_name(first, end), first, end, hashlib.sha256(data).hexdigest(), len(data))
                intent = replace(manifest, merging=MergeIntent(ref, inputs))
                version = self.store.replace(key, encode_manifest(intent), version)
                self.archive.remember(session_id, intent, version)
                self._write_segment(session_id, ref, data)
                self._commit_merge(session_id, intent, version, now_ms)
                merges, events = merges + 1, events + ref.events
            except ArchiveConflict:
                self.archive.forget(session_id)  # another archiver changed it: read it again
            except ArchiveObjectMissing as exc:
                # an input another archiver merged away and deleted since this manifest was read: read it again
                # (once per object: one that a fresh manifest still names is really missing)
                if exc.object in missing:
                    raise
                missing.add(exc.object)
                self.archive.forget(session_id)
        raise ArchiveConflict(
            self.store.where(key), f"other archivers changed it {_MAX_ROUNDS} times while this one merged segments"
        )

    def _merged(self, session_id: str, inputs: tuple[SegmentRef, ...]) -> bytes:
        """The merged segment of ``inputs`` (their bytes from what this appender wrote, else the store)."""
        parts = []
        for ref in inputs:
            data = self._recent_bytes_of(session_id, ref)
            if data is None:
                data = self.archive.segment_bytes(session_id, ref)
            parts.append((ref.first, ref.end, data, self.store.where(segment_key(session_id, ref))))
        return merge_segments(session_id, parts)

    def _complete_merge(self, session_id: str, manifest: Manifest, version: str | None, now_ms: int) -> SegmentRef:
        """Finish the merge a manifest announces (its object written or not), then commit it."""
        merge = manifest.merging
        assert merge is not None
        ref = merge.segment
        key = segment_key(session_id, ref)
        stored = self.store.read(key)
        if stored is not None:
            digest = hashlib.sha256(stored.data).hexdigest()
            if digest != ref.sha256:
                raise ArchiveCorrupt(
                    self.store.where(key),
                    f"the manifest of session {session_id!r} announced this merge with sha256 {ref.sha256}, the "
                    f"object there has {digest}",
                )
            self._keep_recent(session_id, ref, stored.data)
        else:
            data = self._merged(session_id, merge.inputs)
            digest = hashlib.sha256(data).hexdigest()
            if digest != ref.sha256:  # announced by another build of foldline: announce these bytes instead
                ref = SegmentRef(ref.key, ref.first, ref.end, digest, len(data))
                manifest = replace(manifest, merging=MergeIntent(ref, merge.inputs))
                version = self.store.replace(manifest_key(session_id), encode_manifest(manifest), version)
            self._write_segment(session_id, ref, data)
        _LOG.info("archive of %r: completed the announced merge into %s", session_id, ref.key)
        self._commit_merge(session_id, manifest, version, now_ms)
        return ref

    def _commit_merge(self, session_id: str, intent: Manifest, version: str | None, now_ms: int) -> Manifest:
        merge = intent.merging
        assert merge is not None
        at = intent.segments.index(merge.inputs[0])
        segments = (*intent.segments[:at], merge.segment, *intent.segments[at + len(merge.inputs) :])
        retired = (*intent.retired, *(RetiredSegment(r.key, now_ms) for r in merge.inputs))
        done = replace(intent, segments=segments, merging=None, retired=retired)
        new_version = self.store.replace(manifest_key(session_id), encode_manifest(done), version)
        self.archive.remember(session_id, done, new_version)
        with self._recent_lock:
            for r in merge.inputs:  # retired: no merge reads them again
                dropped = self._recent.pop((session_id, r.key, r.sha256), None)
                if dropped is not None:
                    self._recent_bytes -= len(dropped)
        return done

    # -------------------------------------------------------------- tidying

    def tidy(self, session_id: str, *, now_ms: int, grace_ms: int) -> tuple[int, int | None]:
        """Delete the session's retired segments whose grace period is over, then drop them from the
        manifest: how many were deleted, and when (epoch ms) the next one may be (``None``: none left)."""
        key = manifest_key(session_id)
        for _ in range(_MAX_ROUNDS):
            found, version = self.archive.versioned(session_id)
            if found is None or not found.retired:
                return 0, None
            due = [r for r in found.retired if r.at_ms + grace_ms <= now_ms]
            later = tuple(r for r in found.retired if r.at_ms + grace_ms > now_ms)
            next_at = min((r.at_ms + grace_ms for r in later), default=None)
            if not due:
                return 0, next_at
            for r in due:  # deleted first: a crash before the manifest below leaves them listed, deleted again
                self.store.delete(session_dir(session_id) + r.key)
            try:
                done = replace(found, retired=later)
                self.archive.remember(session_id, done, self.store.replace(key, encode_manifest(done), version))
                return len(due), next_at
            except ArchiveConflict:
                self.archive.forget(session_id)
        raise ArchiveConflict(
            self.store.where(key), f"other archivers changed it {_MAX_ROUNDS} times while this one tidied it"
        )

    # -------------------------------------------------------------- bytes this appender wrote

    def _keep_recent(self, session_id: str, ref: SegmentRef, data: bytes) -> None:
        if len(data) > _RECENT_BYTES // 4:
            return
        cache_key = (session_id, ref.key, ref.sha256)
        with self._recent_lock:
            if cache_key in self._recent:
                self._recent.move_to_end(cache_key)
                return
            self._recent[cache_key] = data
            self._recent_bytes += len(data)
            while self._recent_bytes > _RECENT_BYTES:
                self._recent_bytes -= len(self._recent.popitem(last=False)[1])

    def _recent_bytes_of(self, session_id: str, ref: SegmentRef) -> bytes | None:
        with self._recent_lock:
            return self._recent.get((session_id, ref.key, ref.sha256))
