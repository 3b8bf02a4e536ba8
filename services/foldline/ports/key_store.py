"""The KeyStore port: each session's data key, its destruction, and the audit log of erasures.

A session's content is sealed under a data key of its own (``core/sealing.py``; docs/ERASURE.md). The key store
holds, per session, one :class:`SessionKey`: the key's id and its 32 bytes while it is live; once the session is
erased, a tombstone — the id, when and by which erasure — with the bytes gone. A session with no record at all
has never had a key (nothing of it was sealed) or lost it: readers tell the two apart by the ``sealed`` marker
of its events (:class:`~foldline.errors.KeyMissing`), never confusing a lost key with an erasure.

It also keeps the erasure records (who asked, when, why, which sessions; no content) and the export files
foldline wrote, so that an erasure can remove them.

Contract (``tests/contracts/key_store.py`` runs it against every adapter):

* ``create`` stores a new session's key only if the session has no record yet (one winner among concurrent
  creators); it returns the record that is stored — the caller's, or the one that was there first.
* ``get`` returns a session's record (live or a tombstone), or ``None``.
* ``destroy`` turns a record into a tombstone: its key bytes are gone from the store (no copy, no older
  version, no free page left holding them — each adapter says how), ``erasure`` and ``erased_ms`` are set.
  It is idempotent; a session without a record is ``None``.
* ``sessions_of_subject`` lists the sessions whose record names ``subject`` (a subject's digest).
* erasure records are put whole (by id) and listed; tracked exports are added, listed per session and
  forgotten.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from ..core import codec
from ..core.events import Envelope
from ..core.inbox import InboxEntry

__all__ = [
    "KEY_BYTES",
    "ErasureRecord",
    "KeyStore",
    "Sealer",
    "SessionKey",
    "TrackedExport",
    "subject_digest",
]

#: A data key is 32 bytes: AES-256.
KEY_BYTES = 32


def subject_digest(subject: str) -> str:
    """What the key store keeps of a subject id: ``sha256:`` + hex of ``foldline-subject:`` + its UTF-8 bytes.

    The subject id itself (an account id, an email address) is never stored; an auditor who knows it can
    still find its erasure (and so can anyone who guesses it: the digest confirms a guess)."""
    return codec.digest_bytes(b"foldline-subject:" + subject.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A session's data key: ``material`` is its 32 bytes while it lives, ``None`` once it was destroyed."""

    session_id: str
    kid: str
    material: bytes | None
    created_ms: int
    subject: str | None = None  # the digest of the subject the session belongs to (subject_digest)
    erasure: str | None = None  # the erasure that destroyed it
    erased_ms: int | None = None

    @property
    def erased(self) -> bool:
        return self.material is None

    def destroyed(self, erasure: str, now_ms: int) -> SessionKey:
        return replace(self, material=None, erasure=erasure, erased_ms=now_ms)

    def __repr__(self) -> str:  # never the key bytes
        state = f"erased by {self.erasure}" if self.erased else "live"
        return f"SessionKey({self.session_id!r}, kid={self.kid}, {state})"


@dataclass(frozen=True, slots=True)
class TrackedExport:
    """An export file foldline wrote: where (host and absolute path), of which session, and its header digest."""

    session_id: str
    host: str
    path: str
    digest: str
    written_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session_id,
            "host": self.host,
            "path": self.path,
            "digest": self.digest,
            "writtenMs": self.written_ms,
        }

    @staticmethod
    def from_json(value: dict[str, Any]) -> TrackedExport:
        return TrackedExport(value["session"], value["host"], value["path"], value["digest"], int(value["writtenMs"]))


ErasureState = Literal["pending", "done"]


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    """One erasure: who asked (``by``), when (``requested_ms``, ``done_ms``), why (``reason``), what (``scope``,
    ``target`` — a session id, or a subject's digest — and ``sessions``) and what it removed. No content.

    ``objects`` are the attachment store objects the erased sessions referenced (images, archived request bodies,
    whole tool outputs), noted before the keys were destroyed: an interrupted erasure goes on from this list.
    ``inbox`` names the entries the sessions' inboxes held when it was planned (every entry of an erased session
    is removed, these and any put since).
    ``report`` counts what was removed (filled in when it is done)."""

    erasure_id: str
    scope: Literal["session", "subject"]
    target: str
    sessions: tuple[str, ...]
    by: str
    reason: str | None
    requested_ms: int
    state: ErasureState = "pending"
    done_ms: int | None = None
    objects: tuple[str, ...] = ()
    report: dict[str, Any] = field(default_factory=dict)
    inbox: tuple[str, ...] = ()  # the sessions' inbox entries when planned, ``<session id>/<entry id>`` (no content)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.erasure_id,
            "scope": self.scope,
            "target": self.target,
            "sessions": list(self.sessions),
            "by": self.by,
            "requestedMs": self.requested_ms,
            "state": self.state,
            "objects": list(self.objects),
            "report": dict(self.report),
        }
        if self.inbox:
            out["inbox"] = list(self.inbox)
        if self.reason is not None:
            out["reason"] = self.reason
        if self.done_ms is not None:
            out["doneMs"] = self.done_ms
        return out

    @staticmethod
    def from_json(value: dict[str, Any]) -> ErasureRecord:
        return ErasureRecord(
            erasure_id=value["id"],
            scope=value["scope"],
            target=value["target"],
            sessions=tuple(value["sessions"]),
            by=value["by"],
            reason=value.get("reason"),
            requested_ms=int(value["requestedMs"]),
            state=value["state"],
            done_ms=value.get("doneMs"),
            objects=tuple(value.get("objects", ())),
            report=dict(value.get("report", {})),
            inbox=tuple(value.get("inbox", ())),
        )


class KeyStore(abc.ABC):
    """Where the data keys live; see the module docstring."""

    #: What the store is, for messages (``keys.sqlite3 in ./data``, ``s3://bucket/prefix``).
    where: str = "the key store"

    @abc.abstractmethod
    def create(self, key: SessionKey) -> SessionKey:
        """Store ``key`` if its session has no record yet; the record stored (``key`` or the earlier one)."""

    @abc.abstractmethod
    def get(self, session_id: str) -> SessionKey | None:
        """The session's record (live or destroyed), or ``None``."""

    @abc.abstractmethod
    def destroy(self, session_id: str, erasure: str, now_ms: int) -> SessionKey | None:
        """Destroy the session's key bytes, keeping a tombstone; idempotent. ``None`` without a record."""

    @abc.abstractmethod
    def sessions_of_subject(self, subject: str) -> list[str]:
        """The sessions whose record names ``subject`` (a :func:`subject_digest`), sorted."""

    @abc.abstractmethod
    def put_erasure(self, record: ErasureRecord) -> None:
        """Store ``record`` (replacing the one with its id)."""

    @abc.abstractmethod
    def erasures(self) -> list[ErasureRecord]:
        """Every erasure record, oldest first."""

    @abc.abstractmethod
    def track_export(self, export: TrackedExport) -> None:
        """Note an export file foldline wrote."""

    @abc.abstractmethod
    def exports(self, session_id: str) -> list[TrackedExport]:
        """The export files noted for ``session_id`` (one per host and path: the latest), by host and path."""

    @abc.abstractmethod
    def forget_export(self, export: TrackedExport) -> None:
        """Drop an export file from the notes (it was removed, or is gone)."""

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Return if the store answers now; else raise :class:`~foldline.errors.StoreUnavailable`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class Sealer(Protocol):
    """What a log seals new events with and opens stored ones with (``adapters/sealing.py``'s ContentSealer)."""

    keys: KeyStore
    seal_new: bool  # False: encryption is off for new events (sealed ones are still opened)

    def seal(self, session_id: str, events: Sequence[Envelope], *, always: bool = False) -> list[Envelope]:
        """``events`` with their content sealed (as they are when ``seal_new`` is off, unless ``always``);
        ContentErased when the session's key was destroyed."""
        ...

    def open(self, session_id: str, events: Iterable[Envelope]) -> list[Envelope]:
        """``events`` with their content opened; an erased one stays sealed; KeyMissing for a lost key."""
        ...

    def bind(self, session_id: str, subject: str) -> None:
        """Put the session in the subject's erasure scope (before its first sealed event)."""
        ...

    def seal_entry(self, session_id: str, entry: InboxEntry) -> InboxEntry:
        """An inbox entry with its content sealed (as it is when ``seal_new`` is off); ContentErased when the
        session's key was destroyed."""
        ...

    def open_entries(self, session_id: str, entries: Iterable[InboxEntry]) -> list[InboxEntry]:
        """Inbox entries with their content opened; ContentErased for an erased session's sealed entry,
        KeyMissing for a lost key."""
        ...

    def inherit(self, child_id: str, parent_id: str) -> None:
        """Put a fork child in its parent's subject (when the parent has one)."""
        ...

    def erased(self, session_id: str) -> bool:
        """Whether the session's key was destroyed (asked of the store now)."""
        ...

    def cached(self, session_id: str) -> bool:
        """Whether sealing or opening the session's events now needs no request to the key store."""
        ...

    def make_ahead(self, session_id: str) -> None:
        """Start making a new session's key in the background, ahead of its first sealed write."""
        ...

    def making(self, session_id: str) -> Future[None] | None:
        """The making :meth:`make_ahead` started, while it is under way."""
        ...

    def forget(self, session_id: str) -> None:
        """Drop the session's key from this process's cache."""
        ...

    def close(self) -> None: ...
