"""Reading sessions' archives from an archive store: manifests, and segments checked against their digests.

:class:`SessionArchive` is the :class:`~foldline.ports.archive.ArchiveReader` of one
:class:`~foldline.ports.archive.ArchiveStore`. It keeps the manifests it has read (a watermark only grows:
a kept one is never wrong, at most behind) and the decoded events of recently read segments (segments
never change). Every segment it reads is checked before use:

* the object exists (else :class:`~foldline.errors.ArchiveObjectMissing` naming it);
* its sha256 is the one its manifest records, its container metadata names its session and range, and
  its records decode into exactly the seqs of that range (else :class:`~foldline.errors.ArchiveCorrupt`).

Merges replace segments, and the replaced ones are deleted a grace period later (docs/RETENTION.md,
"Merging"), so a kept manifest is used to read segments only while it is younger than
:data:`MANIFEST_MAX_AGE_S`; an older one is read again first. A segment that is missing although the
manifest used names it is read again through a fresh manifest (a merge may have replaced it meanwhile)
before the read fails.

**The segment cache** keeps decoded events of ``cache_events`` events in all, least recently used first
out, but a read never evicts a segment it uses itself: a session larger than the cache keeps its oldest
segments cached from one read to the next and reads only the rest, instead of each read pushing out what
the next one needs first.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ...collector import collector_paused
from ...core.events import Envelope
from ...errors import ArchiveCorrupt, ArchiveObjectMissing
from ...ports.archive import MANIFEST_MAX_AGE_S, ArchiveReader, ArchiveStore, Manifest, SegmentRef
from .layout import SESSIONS_PREFIX, decode_manifest, manifest_key, segment_key, session_of_manifest_key
from .segments import read_segment

__all__ = ["MANIFEST_MAX_AGE_S", "SessionArchive"]

_FETCHERS = 8  # segments of one read fetched at once


class SessionArchive(ArchiveReader):
    """The archives of the sessions in ``store``; see the module docstring. Thread-safe.

    ``max_manifests`` manifests and the decoded events of segments holding ``cache_events`` events in
    all are kept (least recently used first out). ``manifest_max_age_s`` bounds how long a kept manifest
    is used to read segments; ``clock`` (monotonic seconds) measures it.
    """

    def __init__(
        self,
        store: ArchiveStore,
        *,
        max_manifests: int = 100_000,
        cache_events: int = 20_000,
        manifest_max_age_s: float = MANIFEST_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._max_manifests = max_manifests
        self._cache_events = cache_events
        self._max_age = manifest_max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        # session -> (manifest, version, when it was read from the store)
        self._manifests: OrderedDict[str, tuple[Manifest | None, str | None, float]] = OrderedDict()
        self._segments: OrderedDict[tuple[str, str, str], list[Envelope]] = OrderedDict()
        self._cached_events = 0
        self._pool: ThreadPoolExecutor | None = None

    # -------------------------------------------------------------- manifests

    def versioned(self, session_id: str, *, refresh: bool = False) -> tuple[Manifest | None, str | None]:
        """The session's manifest and its store version (``(None, None)``: no archive yet)."""
        if not refresh:
            with self._lock:
                known = self._manifests.get(session_id)
                if known is not None:
                    self._manifests.move_to_end(session_id)
                    return known[0], known[1]
        key = manifest_key(session_id)
        stored = self.store.read(key)
        if stored is None:
            found: tuple[Manifest | None, str | None] = (None, None)
        else:
            found = (decode_manifest(stored.data, session_id, self.store.where(key)), stored.version)
        self.remember(session_id, *found)
        return found

    def cached(self, session_id: str) -> tuple[Manifest | None, str | None] | None:
        """The manifest and version kept for the session, without asking the store (``None``: none kept)."""
        with self._lock:
            known = self._manifests.get(session_id)
            return None if known is None else (known[0], known[1])

    def remember(self, session_id: str, manifest: Manifest | None, version: str | None) -> None:
        """Keep ``manifest`` as the session's, read (or written) now (unless a longer one is kept already)."""
        with self._lock:
            known = self._manifests.get(session_id)
            if (
                known is not None
                and known[0] is not None
                and manifest is not None
                and known[0].next_seq > manifest.next_seq
            ):
                return
            self._manifests[session_id] = (manifest, version, self._clock())
            self._manifests.move_to_end(session_id)
            while len(self._manifests) > self._max_manifests:
                self._manifests.popitem(last=False)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._manifests.pop(session_id, None)

    def manifest(self, session_id: str, *, refresh: bool = False) -> Manifest | None:
        return self.versioned(session_id, refresh=refresh)[0]

    def watermark(self, session_id: str, *, refresh: bool = False) -> int:
        manifest = self.manifest(session_id, refresh=refresh)
        return 0 if manifest is None else manifest.next_seq

    def sessions(self) -> list[str]:
        found = (session_of_manifest_key(k) for k in self.store.keys(SESSIONS_PREFIX))
        return sorted(s for s in found if s is not None)

    def _readable(self, session_id: str, to_seq: int) -> tuple[Manifest | None, bool]:
        """A manifest to read segments by (kept if it is young enough and reaches ``to_seq``), and whether
        it was read from the store just now."""
        with self._lock:
            known = self._manifests.get(session_id)
        if (
            known is not None
            and known[0] is not None
            and known[0].next_seq >= to_seq
            and self._clock() - known[2] <= self._max_age
        ):
            return known[0], False
        return self.manifest(session_id, refresh=True), True

    # -------------------------------------------------------------- events

    def read(self, session_id: str, from_seq: int, to_seq: int) -> list[Envelope]:
        from_seq = max(from_seq, 0)
        if from_seq >= to_seq:
            return []
        manifest, fresh = self._readable(session_id, to_seq)
        while True:
            watermark = 0 if manifest is None else manifest.next_seq
            if manifest is None or watermark < to_seq:
                raise ValueError(
                    f"session {session_id!r}: seqs up to {to_seq} asked of an archive that ends at {watermark}"
                )
            try:
                return self._read_segments(session_id, manifest, from_seq, to_seq)
            except ArchiveObjectMissing:
                if fresh:
                    raise
                # a merge may have replaced it since this manifest was read: ask the store which segments hold it now
                again = self.manifest(session_id, refresh=True)
                if again == manifest:
                    raise
                manifest, fresh = again, True

    def _read_segments(self, session_id: str, manifest: Manifest, from_seq: int, to_seq: int) -> list[Envelope]:
        refs = [ref for ref in manifest.segments if ref.end > from_seq and ref.first < to_seq]
        fetched = self._fetch_all(session_id, refs)
        using = {(session_id, ref.key, ref.sha256) for ref in refs}
        out: list[Envelope] = []
        with collector_paused():
            for ref in refs:
                events = self.segment(session_id, ref, fetched.get(ref.key), keep=using)
                out.extend(events[max(from_seq - ref.first, 0) : to_seq - ref.first])
        return out

    def _fetch_all(self, session_id: str, refs: list[SegmentRef]) -> dict[str, Future[bytes | None]]:
        """Start reading the segments not in the cache, several at once (the waits are the store's)."""
        with self._lock:
            missing = [r for r in refs if (session_id, r.key, r.sha256) not in self._segments]
            if len(missing) < 2:
                return {}
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=_FETCHERS, thread_name_prefix="foldline-archive-read")
            pool = self._pool
        return {r.key: pool.submit(self.store.fetch, segment_key(session_id, r)) for r in missing}

    def segment_bytes(self, session_id: str, ref: SegmentRef, fetching: Future[bytes | None] | None = None) -> bytes:
        """The bytes of one segment, checked against the digest its manifest records (not decoded)."""
        key = segment_key(session_id, ref)
        where = self.store.where(key)
        data = self.store.fetch(key) if fetching is None else fetching.result()
        if data is None:
            raise ArchiveObjectMissing(
                where,
                f"the manifest of session {session_id!r} lists it (seqs {ref.first}..{ref.end}) but the store has no "
                "such object; restore it from a copy of the archive",
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != ref.sha256:
            raise ArchiveCorrupt(
                where, f"its sha256 is {digest}, the manifest of session {session_id!r} records {ref.sha256}"
            )
        return data

    def segment(
        self,
        session_id: str,
        ref: SegmentRef,
        fetching: Future[bytes | None] | None = None,
        *,
        keep: set[tuple[str, str, str]] | None = None,
    ) -> list[Envelope]:
        """The events of one segment (checked as the module docstring says); ``fetching``: its read, started.

        ``keep``: cache keys of segments the caller is reading too, which making room for this one must not
        evict (when it cannot make room otherwise, this segment is not cached).
        """
        cache_key = (session_id, ref.key, ref.sha256)
        with self._lock:
            cached = self._segments.get(cache_key)
            if cached is not None:
                self._segments.move_to_end(cache_key)
                return cached
        data = self.segment_bytes(session_id, ref, fetching)
        events = read_segment(data, session_id, ref.first, ref.end, self.store.where(segment_key(session_id, ref)))
        self._cache(cache_key, events, keep or set())
        return events

    def _cache(self, cache_key: tuple[str, str, str], events: list[Envelope], keep: set[tuple[str, str, str]]) -> None:
        with self._lock:
            if cache_key in self._segments or len(events) > self._cache_events:
                return
            room = self._cache_events - self._cached_events
            if room < len(events):
                evictable = 0
                for k, v in self._segments.items():  # least recently used first
                    if k not in keep:
                        evictable += len(v)
                        if room + evictable >= len(events):
                            break
                if room + evictable < len(events):
                    return  # only this read's own segments could make room: keep them, skip this one
                for k in [k for k in self._segments if k not in keep]:
                    if self._cache_events - self._cached_events >= len(events):
                        break
                    self._cached_events -= len(self._segments.pop(k))
            self._segments[cache_key] = events
            self._cached_events += len(events)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.store.close()
