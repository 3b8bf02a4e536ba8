"""Export one session as JSON Lines, and import such a file into a log — all-or-nothing.

The file format is specified in docs/FORMAT.md ("Export format"). In short::

    line 1      {"digest":"sha256:<hex>","events":N,"foldline":"session-export","formatVersion":0,"sessionId":"…"}
    line 2..N+1 one event per line, exactly the canonical bytes ``encode_event`` produces (= the stored form)

Every line ends with LF. ``digest`` is the sha256 of every byte after the header line, i.e. of the
N event lines each including its LF. ``import_session`` checks the header, every line (decoding, canonical
form, the log rules over the whole session — which the log itself checks, in order, as the events stream
into :meth:`~foldline.ports.event_log.EventLog.create`), the event count and the digest; the log commits
only after the last check passed, so nothing is written unless everything is right, and an import of any
size holds about one event at a time. The first problem found is raised as
:class:`~foldline.errors.ImportFailed` naming the 1-based line number. ``export_session`` reads the log
twice (the digest first, then the lines), so it too runs in bounded memory.

The attachment objects a session references (its images) are not in the file. Both directions name them
(:attr:`ExportSummary.attachments`) and carry them on request: ``export_session(..., attachments=store,
bundle=target)`` copies each object, verified, into another store (e.g. a directory in the embedded
store's layout), and ``import_session(..., bundle=source, attachments=store)`` puts each object the
imported events reference from the bundle into the target store, verified against its reference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from .core import codec
from .core.content import ContentBlock, ImageBlock, ImageRef, TextBlock, ToolCallBlock, ToolResultBlock
from .core.events import SESSION_FORMAT_VERSION, AssistantMessage, Envelope, ToolResult, UserMessage
from .core.limits import MAX_EVENT_BYTES
from .core.validation import check_session_id
from .core.wire import decode_canonical, encode_event
from .errors import (
    AttachmentError,
    AttachmentNotFound,
    ConfigError,
    ConflictError,
    ImportFailed,
    SessionExists,
    SessionNotFound,
    ValidationError,
)
from .ports.attachments import AttachmentStore
from .ports.event_log import EncodedEvent, EventLog

__all__ = [
    "EXPORT_KIND",
    "ExportHeader",
    "ExportSummary",
    "LineReader",
    "export_session",
    "import_session",
    "referenced_images",
]

EXPORT_KIND = "session-export"


class LineReader(Protocol):
    """What an import reads from: a binary file, or anything with its ``readline`` (at most ``size`` bytes)."""

    def readline(self, size: int = -1, /) -> bytes: ...


_HEADER_KEYS = frozenset({"digest", "events", "foldline", "formatVersion", "sessionId"})
_LINE_READ = MAX_EVENT_BYTES + 2  # an event line and its newline, plus one byte that tells a longer line
_HEADER_READ = 64 * 1024  # a header line is a few hundred bytes
_READ_PAGE = 1000


@dataclass(frozen=True, slots=True)
class ExportHeader:
    """The first line of an export file."""

    session_id: str
    events: int
    digest: str
    format_version: int = SESSION_FORMAT_VERSION

    def to_line(self) -> bytes:
        return (
            codec.canonical_json(
                {
                    "foldline": EXPORT_KIND,
                    "formatVersion": self.format_version,
                    "sessionId": self.session_id,
                    "events": self.events,
                    "digest": self.digest,
                }
            )
            + b"\n"
        )


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What an export wrote or an import appended, and the attachment objects the session references.

    ``attachments`` are the referenced object ids, first use first, and ``attachment_bytes`` their total
    size. ``copied`` counts the objects copied (into the bundle on export, into the store on import);
    ``missing`` lists the ones that could not be (absent from the source) or, after an import without a
    bundle, that the target store does not hold.
    """

    session_id: str
    events: int
    digest: str
    attachments: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    copied: int = 0
    attachment_bytes: int = 0
    erased: int = 0  # events exported with their content sealed: the session was erased (docs/ERASURE.md)


def _block_images(blocks: Iterable[ContentBlock]) -> Iterator[ImageRef]:
    for b in blocks:
        if isinstance(b, ImageBlock):
            yield b.image
        elif isinstance(b, ToolResultBlock):
            yield from _block_images(b.content)


def referenced_images(env: Envelope) -> Iterator[ImageRef]:
    """The image references of one event: the attachment objects a request built over it resolves."""
    data = env.data
    if isinstance(data, UserMessage | AssistantMessage | ToolResult):
        yield from _block_images(data.content)


class _Images:
    """A session's distinct images in first-use order, copied from ``source`` to ``target`` as met (when both)."""

    def __init__(self, source: AttachmentStore | None, target: AttachmentStore | None) -> None:
        self.refs: dict[str, ImageRef] = {}
        self.missing: list[str] = []
        self.copied = 0
        self._source, self._target = source, target

    def add(self, env: Envelope) -> None:
        data = env.data
        if not isinstance(data, UserMessage | AssistantMessage | ToolResult) or all(
            isinstance(b, TextBlock | ToolCallBlock) for b in data.content
        ):
            return  # the common case: no image anywhere in the event
        for ref in referenced_images(env):
            if ref.attachment_id not in self.refs:
                self.refs[ref.attachment_id] = ref
                if self._source is not None and self._target is not None:
                    self._copy(self._source, self._target, ref)

    def _copy(self, source: AttachmentStore, target: AttachmentStore, ref: ImageRef) -> None:
        if target.exists(ref.attachment_id):
            target.get(ref.attachment_id, ref)  # a damaged object already there is an error, not a match
            return
        try:
            data = source.get(ref.attachment_id, ref)  # re-hashed and checked against the reference
        except AttachmentNotFound:
            self.missing.append(ref.attachment_id)
            return
        target.put(data, ref.media_type, width=ref.width, height=ref.height)
        self.copied += 1

    def summary(
        self, session_id: str, events: int, digest: str, holder: AttachmentStore | None, erased: int = 0
    ) -> ExportSummary:
        """The summary; ``holder``: also list the objects it lacks as missing."""
        missing = list(self.missing)
        if holder is not None:
            missing += [a for a in self.refs if a not in missing and not holder.exists(a)]
        total = sum(r.bytes for r in self.refs.values())
        return ExportSummary(session_id, events, digest, tuple(self.refs), tuple(missing), self.copied, total, erased)


def export_session(
    log: EventLog,
    session_id: str,
    out: BinaryIO,
    *,
    attachments: AttachmentStore | None = None,
    bundle: AttachmentStore | None = None,
) -> ExportSummary:
    """Write ``session_id`` to ``out`` as a header line plus one canonical event per line.

    Raises :class:`~foldline.errors.SessionNotFound` when the session has no events. The events are read
    page by page up to the head seen at the start (appends racing the export are not included), once for
    the digest and once to write them. With ``attachments`` (the session's store) and ``bundle``, every
    referenced object is copied, verified, into ``bundle``; one the store lacks is listed as missing.

    The lines hold each event's content as it was logged — opened by the log's key store — except for an
    erased session: its events are written as stored, their content sealed under the destroyed key
    (``sealed`` marker; docs/FORMAT.md §8), so the file shows the structure and holds no content.
    """
    head = log.head(session_id)
    if head == 0:
        raise SessionNotFound(session_id)
    hasher = hashlib.sha256()
    images = _Images(attachments, bundle)
    erased = 0
    for env in _pages(log, session_id, head):
        hasher.update(encode_event(env) + b"\n")
        images.add(env)
        erased += env.sealed is not None
    digest = codec.DIGEST_PREFIX + hasher.hexdigest()
    out.write(ExportHeader(session_id, head, digest).to_line())
    for env in _pages(log, session_id, head):
        out.write(encode_event(env) + b"\n")
    return images.summary(session_id, head, digest, None, erased)


def _pages(log: EventLog, session_id: str, head: int) -> Iterator[Envelope]:
    for start in range(0, head, _READ_PAGE):
        stop = min(start + _READ_PAGE, head)
        page = log.read(session_id, start, stop)
        if len(page) != stop - start:  # pragma: no cover - a log that loses events breaks its contract
            raise SessionNotFound(session_id)
        yield from page


def _header_from_line(raw: bytes) -> ExportHeader:
    def bad(reason: str) -> ImportFailed:
        return ImportFailed(1, f"bad export header: {reason}")

    if not raw:
        raise bad("the file is empty")
    if not raw.endswith(b"\n"):
        raise bad("the header line does not end with a newline (truncated file?)")
    try:
        value: Any = codec.loads(raw[:-1])
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if not isinstance(value, dict):
        raise bad(f"expected a JSON object, got {type(value).__name__}")
    if value.get("foldline") != EXPORT_KIND:
        raise bad(f"field 'foldline' must be {EXPORT_KIND!r}; is this a foldline session export?")
    extra = set(value) - _HEADER_KEYS
    missing = _HEADER_KEYS - set(value)
    if extra or missing:
        raise bad(f"unknown field(s) {sorted(extra)}, missing field(s) {sorted(missing)}")
    version = value["formatVersion"]
    if type(version) is not int or version != SESSION_FORMAT_VERSION:
        raise bad(f"formatVersion {version!r} is not supported; this foldline reads format {SESSION_FORMAT_VERSION}")
    session_id = value["sessionId"]
    if not isinstance(session_id, str) or not session_id:
        raise bad("sessionId must be a non-empty string")
    try:
        check_session_id(session_id, "sessionId")
    except ValidationError as exc:
        raise bad(str(exc)) from exc
    events = value["events"]
    if type(events) is not int or events < 1:
        raise bad(f"events must be an integer >= 1, got {events!r}")
    digest = value["digest"]
    if (
        not isinstance(digest, str)
        or not digest.startswith(codec.DIGEST_PREFIX)
        or len(digest) != len(codec.DIGEST_PREFIX) + 64
        or any(c not in "0123456789abcdef" for c in digest[len(codec.DIGEST_PREFIX) :])
    ):
        raise bad(f"digest must be 'sha256:' + 64 lowercase hex digits, got {digest!r}")
    return ExportHeader(session_id, events, digest, version)


def _first_difference(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


class _Lines:
    """The event lines of an export after its header, checked one by one as they are iterated."""

    def __init__(self, fp: LineReader, header: ExportHeader, images: _Images, on_line: Callable[[int], None] | None):
        self.fp = fp
        self.header = header
        self.images = images
        self.on_line = on_line
        self.line = 1  # the line last read (1-based; 1 is the header)
        self.events = 0

    def __iter__(self) -> Iterator[EncodedEvent]:
        header, hasher = self.header, hashlib.sha256()
        announced = header.events
        readline, on_line, add_images, update = self.fp.readline, self.on_line, self.images.add, hasher.update
        events = 0
        while raw := readline(_LINE_READ):  # never more than one event's limit in memory
            line = self.line = events + 2  # the header is line 1
            if on_line is not None:
                on_line(len(raw))
            if len(raw) == _LINE_READ and not raw.endswith(b"\n"):
                raise ImportFailed(
                    line,
                    f"the line is longer than the {MAX_EVENT_BYTES:,} bytes one event may take (docs/FORMAT.md, "
                    "'Size limits'); it was not read further",
                )
            if not raw.endswith(b"\n"):
                raise ImportFailed(line, "the line does not end with a newline (truncated file?)")
            body = raw[:-1]
            if not body or body.isspace():
                raise ImportFailed(line, "empty line; every line after the header holds one event")
            if events == announced:
                raise ImportFailed(line, f"the header announces {announced} events but the file has more lines")
            try:
                env, canonical = decode_canonical(body)
            except ValidationError as exc:
                raise ImportFailed(line, str(exc)) from exc
            if env.sealed is not None:
                raise ImportFailed(
                    line,
                    "the event holds sealed content (an export of an erased session): it cannot be imported — "
                    "a session is imported with its content as it was logged",
                )
            if canonical != body:
                at = _first_difference(canonical, body)
                raise ImportFailed(
                    line,
                    f"the event is not in canonical form (first difference at byte {at}); "
                    "events are stored and exported exactly as canonical JSON (docs/FORMAT.md)",
                )
            try:
                add_images(env)
            except AttachmentError as exc:
                raise ImportFailed(
                    line, f"cannot take an attachment the event references: {type(exc).__name__}: {exc}"
                ) from exc
            update(raw)
            events = self.events = events + 1
            yield EncodedEvent(env, body)  # checked canonical above: the log stores these very bytes
        if self.events != header.events:
            raise ImportFailed(
                self.line + 1,
                f"the file ends after {self.events} of the {header.events} events the header announces (truncated?)",
            )
        digest = codec.DIGEST_PREFIX + hasher.hexdigest()
        if digest != header.digest:
            raise ImportFailed(
                1, f"header digest {header.digest} does not match the event lines ({digest}); the file was altered"
            )


def import_session(
    log: EventLog,
    fp: LineReader,
    as_id: str | None = None,
    *,
    attachments: AttachmentStore | None = None,
    bundle: AttachmentStore | None = None,
    on_line: Callable[[int], None] | None = None,
    subject: str | None = None,
) -> ExportSummary:
    """Validate an export read from ``fp`` while its events stream into a new session; or write nothing.

    ``as_id`` imports under a new session id instead of the header's ``sessionId``. Raises
    :class:`~foldline.errors.ImportFailed` (line number + reason) for the first bad line and
    :class:`~foldline.errors.SessionExists` when the target session already has events. With ``bundle``
    (where the objects are) and ``attachments`` (the target store), each image the events reference is put
    into ``attachments`` as it is met, verified against its reference: a damaged object fails the import, an
    absent one is listed as missing. With ``attachments`` alone, the objects it lacks are listed as missing.
    ``on_line(n)`` hears of each line read (``n`` bytes), for a progress display. ``subject`` puts the new
    session in that subject's erasure scope (its content key names the subject; docs/ERASURE.md).
    """
    first = fp.readline(_HEADER_READ)
    if len(first) == _HEADER_READ and not first.endswith(b"\n"):
        raise ImportFailed(1, f"bad export header: the first line is longer than {_HEADER_READ:,} bytes")
    header = _header_from_line(first)
    if as_id is not None and not as_id:
        raise ImportFailed(1, "the new session id (--as) must be non-empty")
    if as_id is not None:
        try:
            check_session_id(as_id, "the new session id (--as)")
        except ValidationError as exc:
            raise ImportFailed(1, str(exc)) from exc
    session_id = header.session_id if as_id is None else as_id
    if log.head(session_id) != 0:
        raise SessionExists(session_id)
    if subject is not None:
        if log.sealer is None:
            raise ConfigError("a subject needs the key store: open the log through foldline's configuration")
        log.sealer.bind(session_id, subject)
    if on_line is not None:
        on_line(len(first))
    images = _Images(bundle, attachments)
    # One thread reads, checks and writes: SQLite's own work is a small part of an import, and a reader
    # thread beside the writer cost more in switching the interpreter between them than it overlapped.
    lines = _Lines(fp, header, images, on_line)
    try:
        log.create(session_id, lines)
    except ConflictError as exc:  # another writer created the session since the check above
        raise SessionExists(session_id) from exc
    except ValidationError as exc:  # the log checks each event as it arrives: the one it was given last
        raise ImportFailed(lines.events + 1, str(exc)) from exc  # line 1 is the header
    return images.summary(session_id, lines.events, header.digest, attachments if bundle is None else None)
