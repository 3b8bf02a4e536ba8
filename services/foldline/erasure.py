"""Erasing a session's content: destroy its data key everywhere, purge what was derived from it, log that it was.

:func:`erase_sessions` erases one session, or every session of a subject (docs/ERASURE.md). Each step can be
done again with the same result, and the erasure record is written before anything is destroyed, so an erasure
interrupted anywhere (a ``kill -9``) completes when it is run again:

1. **Plan.** The sessions (a session id; or the sessions the key store binds to the subject), and the attachment
   objects they reference — their images, the archived request bodies their ``request/dispatch`` digests name,
   and objects their content names (a cut tool output's whole text) — are read while the keys still open the
   content. A session that holds content logged unsealed is sealed in place first (the embedded log), or the
   erasure is refused before anything changed (:class:`~foldline.errors.NotErasable`, Kafka).
2. **Record.** The erasure record (who, when, why, which sessions, which objects; no content) is put in the key
   store as ``pending``.
3. **Per session:** the writer lease is taken (a loop still running is fenced at once and stops with
   :class:`~foldline.errors.ContentErased`); a ``session/erased`` event is appended (ignorable, no content);
   the data key is destroyed (a tombstone stays: readers then see *erased*, never a lost key); the session's
   inbox entries are removed (claimed or not: a later put is refused); the fold is replaced by the erased
   tombstone.
4. **Purge:** each planned object no session that is not erased references is removed from the attachment
   store; export files foldline wrote of the sessions (and that still hold them) are removed; Redis is asked
   to rewrite its persistence files; the embedded files are left with no copy of a rewritten row or a key.
5. The record is marked ``done`` with what was removed.

Processes that hold the key in their cache can read the session for at most ``FOLDLINE_KEY_CACHE_TTL`` more
seconds; none of them can write it (the lease), nor fold it (the tombstone refuses every apply).
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .config.factories import Stores
from .core import codec
from .core.content import ImageBlock, TextBlock, ToolResultBlock
from .core.events import (
    AssistantMessage,
    CompactionSummary,
    Envelope,
    RequestDispatch,
    SessionErased,
    ToolResult,
    UserMessage,
)
from .core.sealing import has_content
from .errors import ConfigError, ContentErased, KeyMissing, NotErasable, NothingToErase
from .ports.archive import ArchiveReader
from .ports.attachments import AttachmentStore
from .ports.event_log import EventLog
from .ports.key_store import ErasureRecord, KeyStore, TrackedExport, subject_digest

__all__ = ["ErasureOutcome", "default_actor", "erase_sessions", "export_holds", "referenced_objects"]

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def default_actor() -> str:
    """Who erases when nobody says: ``<user>@<host>`` of the process."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class ErasureOutcome:
    """What an erasure did (``record`` is the erasure record as stored at the end)."""

    record: ErasureRecord
    already: bool = False  # every session was erased already: nothing was done
    resumed: bool = False  # an interrupted erasure of the same target was completed
    sealed_in_place: int = 0  # events logged unsealed, sealed where they are stored
    keys_destroyed: int = 0
    folds_erased: int = 0
    objects_removed: list[str] = field(default_factory=list)
    objects_kept: list[str] = field(default_factory=list)  # still referenced by a session that is not erased
    exports_removed: list[str] = field(default_factory=list)
    exports_elsewhere: list[str] = field(default_factory=list)  # noted on another host: not reachable from here
    inbox_removed: list[str] = field(default_factory=list)  # inbox entries removed, ``<session id>/<entry id>``
    persistence: list[str] = field(default_factory=list)  # what Redis was asked to rewrite

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "erasure": r.erasure_id,
            "scope": r.scope,
            "target": r.target,
            "sessions": list(r.sessions),
            "by": r.by,
            "reason": r.reason,
            "requestedMs": r.requested_ms,
            "doneMs": r.done_ms,
            "already": self.already,
            "resumed": self.resumed,
            "sealedInPlace": self.sealed_in_place,
            "keysDestroyed": self.keys_destroyed,
            "foldsErased": self.folds_erased,
            "objectsRemoved": self.objects_removed,
            "objectsKept": self.objects_kept,
            "exportsRemoved": self.exports_removed,
            "exportsElsewhere": self.exports_elsewhere,
            "inboxRemoved": self.inbox_removed,
            "persistence": self.persistence,
        }


# ---------------------------------------------------------------------------- references


def _text_refs(text: str) -> Iterable[str]:
    return _DIGEST_RE.findall(text)


def referenced_objects(events: Iterable[Envelope]) -> tuple[set[str], set[str]]:
    """The attachment objects a session references: ``(by its structure, by its content)``.

    By structure (readable after an erasure too): its images and the request bodies its ``request/dispatch``
    digests name. By content (only while it opens): the ``sha256:`` digests its texts name (a cut tool result's
    whole output, kept in the store). An erased event adds only what its structure names."""
    structure: set[str] = set()
    content: set[str] = set()
    opened_all = True

    def blocks(items: Iterable[object], sealed: bool) -> None:
        for b in items:
            if isinstance(b, ImageBlock):
                structure.add(b.image.attachment_id)
            elif isinstance(b, ToolResultBlock):
                blocks(b.content, sealed)
            elif isinstance(b, TextBlock) and not sealed:
                content.update(_text_refs(b.text))

    for e in events:
        data, sealed = e.data, e.sealed is not None
        opened_all = opened_all and not sealed
        if isinstance(data, UserMessage | AssistantMessage | ToolResult):
            blocks(data.content, sealed)
        elif isinstance(data, RequestDispatch):
            structure.add(data.digest)
        elif isinstance(data, CompactionSummary) and not sealed:
            content.update(_text_refs(data.summary))
    return structure, content


def export_holds(path: Path, export: TrackedExport) -> bool:
    """Whether the file at ``path`` still is the export foldline noted (its header names the session and digest)."""
    try:
        with path.open("rb") as fp:
            first = fp.readline(64 * 1024)
        header = codec.loads(first)
    except (OSError, ValueError):
        return False
    return (
        isinstance(header, dict)
        and header.get("foldline") == "session-export"
        and header.get("sessionId") == export.session_id
        and header.get("digest") == export.digest
    )


# ---------------------------------------------------------------------------- the erasure


#: What an erasure record holds already; its report holds the rest of an outcome.
_RECORD_FIELDS = frozenset(
    {"erasure", "scope", "target", "sessions", "by", "reason", "requestedMs", "doneMs", "already"}
)


def _keys(stores: Stores) -> KeyStore:
    if stores.sealer is None:
        raise ConfigError("erasure needs the key store; open the stores through foldline's configuration")
    return stores.sealer.keys


def _pending(keys: KeyStore, scope: str, target: str) -> ErasureRecord | None:
    found = [r for r in keys.erasures() if r.scope == scope and r.target == target and r.state == "pending"]
    return found[-1] if found else None


def _targets(log: EventLog, keys: KeyStore, session: str | None, subject: str | None) -> tuple[str, str, list[str]]:
    """(scope, target, sessions) of the request; NothingToErase when it names nothing the stores know."""
    if session is not None:
        if log.head(session) == 0 and keys.get(session) is None:
            raise NothingToErase(
                f"there is no session {session!r}: the log holds no event of it and the key store no key "
                "(`foldline sessions` lists the sessions)"
            )
        return "session", session, [session]
    assert subject is not None
    digest = subject_digest(subject)
    sessions = keys.sessions_of_subject(digest)
    if not sessions:
        raise NothingToErase(
            f"no session belongs to subject {subject!r}: the key store binds none to it (a session is bound to a "
            "subject when it is opened with AgentOptions(subject=...) or imported with --subject)"
        )
    return "subject", digest, sessions


def erase_sessions(
    stores: Stores,
    *,
    session: str | None = None,
    subject: str | None = None,
    by: str | None = None,
    reason: str | None = None,
    now_ms: Callable[[], int] = _now_ms,
    progress: Callable[[str, int, int], None] | None = None,
    archive: ArchiveReader | None = None,
) -> ErasureOutcome:
    """Erase ``session``, or every session of ``subject`` (see the module docstring); returns what was done.

    Typed errors: :class:`NothingToErase` for a target the stores do not know, :class:`KeyMissing` for a session
    whose key is lost (restore the key store first), :class:`~foldline.errors.NotErasable` for content logged
    unsealed on a log that cannot rewrite it, or that a session archive beside the log (``archive``: the embedded
    log's) holds in the clear. ``progress(step, done, total)`` hears of the long steps."""
    if (session is None) == (subject is None):
        raise ConfigError("name a session or a subject to erase (one of them)")
    log, keys = stores.log, _keys(stores)
    scope, target, sessions = _targets(log, keys, session, subject)
    tell = progress or (lambda _step, _done, _total: None)
    record = _pending(keys, scope, target)
    outcome = ErasureOutcome(record) if record is not None else None
    if record is None:
        states = [keys.get(sid) for sid in sessions]
        if all(k is not None and k.erased for k in states):
            done = [r for r in keys.erasures() if r.state == "done" and set(sessions) <= set(r.sessions)]
            if done:
                return ErasureOutcome(done[-1], already=True)
        record = _plan(stores, keys, scope, target, sessions, by or default_actor(), reason, now_ms(), tell, archive)
        keys.put_erasure(record)
        outcome = ErasureOutcome(record)
    else:
        outcome = ErasureOutcome(record, resumed=True)
        sessions = list(record.sessions)
    assert outcome is not None

    for i, sid in enumerate(sessions):
        tell("sessions", i, len(sessions))
        _erase_one(stores, keys, record, sid, now_ms, outcome)
    tell("sessions", len(sessions), len(sessions))

    _purge_objects(stores, set(sessions), record.objects, outcome, tell)
    _purge_exports(keys, sessions, outcome)
    folds = stores.folds
    rewrite = getattr(folds, "rewrite_persistence", None)
    if callable(rewrite):
        outcome.persistence = list(rewrite())
    # always: rows rewritten in place, and the inbox rows of the sessions — pending ones just removed, claimed
    # ones deleted earlier — leave no copy in the embedded file's free pages or journal (a no-op on Kafka)
    log.scrub()
    compact = getattr(keys, "vacuum", None)
    if callable(compact):
        compact()
    kept = (
        "sealedInPlace",
        "keysDestroyed",
        "foldsErased",
        "objectsRemoved",
        "objectsKept",
        "exportsRemoved",
        "inboxRemoved",
    )
    summary = outcome.to_json()
    record = dataclasses.replace(
        record,
        state="done",
        done_ms=now_ms(),
        report={k: summary[k] for k in (*kept, "exportsElsewhere", "persistence")},
    )
    keys.put_erasure(record)
    outcome.record = record
    return outcome


def _plan(
    stores: Stores,
    keys: KeyStore,
    scope: Literal["session", "subject"] | str,
    target: str,
    sessions: list[str],
    by: str,
    reason: str | None,
    requested_ms: int,
    tell: Callable[[str, int, int], None],
    archive: ArchiveReader | None,
) -> ErasureRecord:
    """The erasure record, before anything is destroyed: the sessions and the objects they reference (read while
    their keys still open them). Refuses content that cannot be erased before anything changed."""
    log = stores.log
    objects: set[str] = set()
    inbox: list[str] = []
    for i, sid in enumerate(sessions):
        tell("reading", i, len(sessions))
        inbox += [f"{sid}/{e.id}" for e in log.inbox().stored(sid)]
        key = keys.get(sid)
        stored = log.read_stored(sid)
        unsealed = [e.seq for e in stored if e.sealed is None and has_content(type(e.data))]
        if unsealed and not log.seals_in_place:
            raise NotErasable(
                f"session {sid!r} holds {len(unsealed)} event(s) with content logged before encryption was on "
                f"(seqs {unsealed[0]}..{unsealed[-1]}), and this log cannot rewrite its records, so destroying a "
                "key cannot erase them; nothing was changed (docs/ERASURE.md, 'What an erasure cannot do')"
            )
        if unsealed and archive is not None and archive.watermark(sid, refresh=True) > unsealed[0]:
            raise NotErasable(
                f"session {sid!r} holds {len(unsealed)} event(s) with content logged before encryption was on "
                f"(seqs {unsealed[0]}..{unsealed[-1]}), and the session archive already holds them in the clear: "
                "sealing the log in place would leave those segments behind, so nothing was changed "
                "(docs/ERASURE.md, 'What an erasure cannot do')"
            )
        seals = [e.sealed for e in stored if e.sealed is not None]
        if seals and key is None:
            raise KeyMissing(seals[0].kid, f"erasing session {sid!r}")
        events = log.read(sid) if key is None or not key.erased else stored
        structure, content = referenced_objects(events)
        objects |= structure | {o for o in content if stores.attachments.exists(o)}
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(requested_ms / 1000))
    return ErasureRecord(
        erasure_id=f"erasure-{stamp}-{secrets.token_hex(4)}",
        scope="session" if scope == "session" else "subject",
        target=target,
        sessions=tuple(sessions),
        by=by,
        reason=reason,
        requested_ms=requested_ms,
        objects=tuple(sorted(objects)),
        inbox=tuple(inbox),
    )


def _erase_one(
    stores: Stores, keys: KeyStore, record: ErasureRecord, sid: str, now_ms: Callable[[], int], out: ErasureOutcome
) -> None:
    log = stores.log
    head = log.head(sid)
    if head:
        lease = log.acquire(sid)  # a loop still writing is fenced from here on
        head = log.head(sid)
        key = keys.get(sid)
        if (key is None or not key.erased) and _has_unsealed(log, sid):
            out.sealed_in_place += log.seal_in_place(sid)  # before the key goes: it erases them too
            key = keys.get(sid)
        marked = any(
            isinstance(e.data, SessionErased) and e.data.erasure == record.erasure_id
            for e in log.read_stored(sid, max(0, head - 8), head)
        )
        if not marked:
            kid = key.kid if key is not None else "-"
            event = SessionErased(record.erasure_id, record.scope, record.by, kid, record.reason)
            log.append(sid, head, [Envelope(head, now_ms(), event, True)], lease=lease)
    destroyed = keys.destroy(sid, record.erasure_id, now_ms())
    if destroyed is not None:
        out.keys_destroyed += 1
    if stores.sealer is not None:
        stores.sealer.forget(sid)
    # after the key: an entry put from now on is refused (ContentErased), so none is left behind
    out.inbox_removed += [f"{sid}/{x}" for x in log.inbox().purge(sid)]
    if stores.folds is not None:
        stores.folds.erase(sid)
        out.folds_erased += 1


def _has_unsealed(log: EventLog, sid: str) -> bool:
    return any(e.sealed is None and has_content(type(e.data)) for e in log.read_stored(sid))


def _purge_objects(
    stores: Stores,
    erased: set[str],
    objects: Iterable[str],
    out: ErasureOutcome,
    tell: Callable[[str, int, int], None],
) -> None:
    """Remove the planned objects that no session outside the erasure references."""
    planned = set(objects)
    if not planned:
        return
    attachments: AttachmentStore = stores.attachments
    log = stores.log
    still: set[str] = set()
    others = [sid for sid in log.sessions() if sid not in erased]
    for i, sid in enumerate(others):
        tell("references", i, len(others))
        try:
            events = log.read(sid)
        except (ContentErased, KeyMissing):
            events = log.read_stored(sid)
        structure, content = referenced_objects(events)
        still |= (structure | content) & planned
    tell("references", len(others), len(others))
    for attachment_id in sorted(planned):
        if attachment_id in still:
            out.objects_kept.append(attachment_id)
        elif attachments.delete(attachment_id):
            out.objects_removed.append(attachment_id)


def _purge_exports(keys: KeyStore, sessions: Iterable[str], out: ErasureOutcome) -> None:
    host = socket.gethostname()
    for sid in sessions:
        for export in keys.exports(sid):
            if export.host != host:
                out.exports_elsewhere.append(f"{export.host}:{export.path}")
                continue
            path = Path(export.path)
            if export_holds(path, export):
                path.unlink(missing_ok=True)
                out.exports_removed.append(export.path)
            keys.forget_export(export)
