"""The archive ports: where archived session segments are kept, and how a session's archive is read.

A session's archive is a **manifest** and **segments** (docs/RETENTION.md, "The archive layout"). Each
segment holds a contiguous run of the session's events, ``first`` up to ``end`` (exclusive), as an Avro
object container file; the manifest lists the segments in seq order, with the sha256 of each, and its
*watermark* (``next_seq``) is where the archived prefix of the session ends. Segments are written once
(create-only) and never change; the manifest is replaced only by compare-and-set. Its watermark only grows;
adjacent segments may be *merged* into one that holds the same events, and the segments it replaced are
*retired*: still named by the manifest, deleted after a grace period (docs/RETENTION.md, "Merging").

* :class:`ArchiveStore` — objects by key under one root (an S3 bucket prefix, a directory): create-only
  writes, compare-and-set replacement, reads that check the store's own checksum, listing. One contract
  suite (``tests/contracts/archive_store.py``) runs against every implementation.
* :class:`ArchiveReader` — a session's manifest and its archived events, every segment checked against
  the digest its manifest records; a missing or corrupt object is a typed error naming it, never a
  shorter session.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..core.events import Envelope

__all__ = [
    "MANIFEST_MAX_AGE_S",
    "MAX_BACKOFF_S",
    "ArchiveReader",
    "ArchiveStore",
    "Manifest",
    "MergeIntent",
    "RawEvent",
    "RetiredSegment",
    "SegmentRef",
    "StoredObject",
    "longest_read_s",
]


#: How long a reader may use a manifest it read to read segments; then it reads the manifest again. A segment
#: a merge retired is deleted no sooner than a grace period longer than this plus the longest segment read.
MANIFEST_MAX_AGE_S = 60.0
#: The longest wait between two attempts of one store request (botocore's standard retry mode caps it here).
MAX_BACKOFF_S = 20.0


def longest_read_s(max_attempts: int, connect_timeout_s: float, read_timeout_s: float) -> float:
    """The longest one segment read may take against a store with these request bounds."""
    return max_attempts * (connect_timeout_s + read_timeout_s + MAX_BACKOFF_S)


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object's bytes and its version: the token a compare-and-set replacement must name."""

    data: bytes
    version: str


class ArchiveStore(abc.ABC):
    """Objects by key (``/``-separated, relative to the store's root); see the module docstring.

    * :meth:`create` writes an object only if the key is free: ``True`` when this call created it,
      ``False`` when an object was there already (its bytes are untouched; the caller compares them).
    * :meth:`replace` writes an object only if its current version is ``expected`` (``None``: only if
      there is no object) and returns the new version; otherwise
      :class:`~foldline.errors.ArchiveConflict`. Concurrent replacements naming the same version: one wins.
    * :meth:`read` returns ``None`` for a missing object; bytes that fail the store's own checksum are
      :class:`~foldline.errors.ArchiveCorrupt`. :meth:`fetch` reads an immutable object whose digest the
      caller checks, without the version (and possibly without the store's checksum).
    * :meth:`keys` lists keys under a prefix in ascending order (after ``start_after``).

    A store that cannot be reached raises :class:`~foldline.errors.StoreUnavailable`.
    """

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` at ``key`` unless an object is there; whether this call created it."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes, expected: str | None) -> str:
        """Write ``data`` at ``key`` if its version is ``expected`` (``None``: absent); the new version."""

    @abc.abstractmethod
    def read(self, key: str) -> StoredObject | None:
        """The object at ``key`` with its version, or ``None``."""

    def fetch(self, key: str) -> bytes | None:
        """The bytes of an object that never changes and whose digest the caller checks (a segment: its
        manifest records its sha256), or ``None``. A store may skip its own checksum and the version here,
        and use a cheaper request than :meth:`read`; errors are :meth:`read`'s."""
        stored = self.read(key)
        return None if stored is None else stored.data

    @abc.abstractmethod
    def keys(self, prefix: str = "", start_after: str = "") -> Iterator[str]:
        """Keys under ``prefix``, ascending, each after ``start_after``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object at ``key`` (nothing happens if there is none)."""

    @abc.abstractmethod
    def where(self, key: str) -> str:
        """How messages name the object at ``key`` (``s3://bucket/prefix/key``, a path)."""

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Return if the store answers now (a readiness probe: one quick request, no retries); else raise
        :class:`~foldline.errors.StoreUnavailable` saying why. Default: a store that is always there."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One segment as a manifest lists it: seqs ``first`` up to ``end`` (exclusive) of its session."""

    key: str  # relative to the session's directory in the store
    first: int
    end: int
    sha256: str  # hex digest of the object's bytes
    size: int  # bytes

    @property
    def events(self) -> int:
        return self.end - self.first


@dataclass(frozen=True, slots=True)
class MergeIntent:
    """A merge an archiver announced: ``segment`` will hold exactly the events of ``inputs`` (two or more
    adjacent segments of the manifest, in seq order), and replace them once it is durable."""

    segment: SegmentRef
    inputs: tuple[SegmentRef, ...]


@dataclass(frozen=True, slots=True)
class RetiredSegment:
    """A segment a merge replaced (by its key, relative to the session's directory): no longer part of the
    archive, kept for readers of an older manifest until ``at_ms`` (when it was retired, epoch ms) plus the
    grace period, then deleted."""

    key: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """A session's archive: its segments in seq order (contiguous from 0), a segment being written, a merge
    under way, and the segments merges replaced that are not deleted yet.

    ``pending`` is an intent: the segment an archiver announced before writing it. It is not part of the
    archive (readers ignore it) until a later manifest lists it among ``segments``. ``merging`` is a merge's
    intent (readers ignore it too); ``retired`` are objects no reader of this manifest needs.
    """

    session_id: str
    segments: tuple[SegmentRef, ...] = ()
    pending: SegmentRef | None = None
    merging: MergeIntent | None = None
    retired: tuple[RetiredSegment, ...] = ()

    @property
    def next_seq(self) -> int:
        """The watermark: every seq below it is archived."""
        return self.segments[-1].end if self.segments else 0


class RawEvent(NamedTuple):
    """An event as an archiver meets it: its seq, where it was read, and its Avro body without framing.

    ``body`` is the Avro binary encoding of the event under the schema with ``fingerprint`` (the 8-byte
    CRC-64-AVRO fingerprint of single-object encoding). ``offset`` is its position in its source (a
    Kafka partition offset; ``-1`` where there is none), ``time_ms`` when it was written, ``kind`` its
    event type (``turn/end`` ends an idle wait). A tuple: an archiver makes one per event it reads.
    """

    session_id: str
    seq: int
    kind: str
    time_ms: int
    body: bytes
    fingerprint: bytes
    partition: int = -1
    offset: int = -1


class ArchiveReader(abc.ABC):
    """Reading sessions' archives; see the module docstring. Thread-safe.

    A reader may keep manifests it has read: the watermark it answers is then at most the archive's
    (manifests only grow, segments never change), which is always safe for a caller that reads the
    seqs at and above it from the log's tail.
    """

    @abc.abstractmethod
    def watermark(self, session_id: str, *, refresh: bool = False) -> int:
        """Every seq below this is archived (0 when the session has no archive); ``refresh`` re-reads it."""

    @abc.abstractmethod
    def manifest(self, session_id: str, *, refresh: bool = False) -> Manifest | None:
        """The session's manifest (``None`` when it has no archive)."""

    @abc.abstractmethod
    def read(self, session_id: str, from_seq: int, to_seq: int) -> list[Envelope]:
        """Events ``from_seq`` up to ``to_seq`` (exclusive, at most the watermark), digest-checked and gapless."""

    @abc.abstractmethod
    def sessions(self) -> list[str]:
        """Ids of every session with a manifest, sorted."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
