"""Export one session as JSON Lines, and import such a file into a log — all-or-nothing.

The file format is specified in docs/FORMAT.md ("Export format"). In short::

    line 1      {"digest":"sha256:<hex>","events":N,"foldline":"session-export","formatVersion":0,"sessionId":"…"}
    line 2..N+1 one event per line, exactly the canonical bytes ``encode_event`` produces (= the stored form)

Every line ends with LF. ``digest`` is the sha256 of every byte after the header line, i.e. of the
N event lines each including its LF. ``import_session`` checks the header, every line (decoding, canonical
form, the log rules over the whole session), the event count and the digest before it writes anything,
then appends the whole session in one batch at ``expected_seq`` 0. The first problem found is raised as
:class:`~foldline.errors.ImportFailed` naming the 1-based line number.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, BinaryIO

from .core import codec
from .core.events import SESSION_FORMAT_VERSION, Envelope
from .core.validation import LogRules
from .core.wire import decode_event, encode_event
from .errors import ConflictError, ImportFailed, SessionExists, SessionNotFound, ValidationError
from .ports.event_log import EventLog

__all__ = ["EXPORT_KIND", "ExportHeader", "ExportSummary", "export_session", "import_session"]

EXPORT_KIND = "session-export"
_HEADER_KEYS = frozenset({"digest", "events", "foldline", "formatVersion", "sessionId"})
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
    """What an export wrote or an import appended."""

    session_id: str
    events: int
    digest: str


def export_session(log: EventLog, session_id: str, out: BinaryIO) -> ExportSummary:
    """Write ``session_id`` to ``out`` as a header line plus one canonical event per line.

    Raises :class:`~foldline.errors.SessionNotFound` when the session has no events. The events are
    read page by page up to the head seen at the start, so appends racing the export are not included.
    """
    head = log.head(session_id)
    if head == 0:
        raise SessionNotFound(session_id)
    hasher = hashlib.sha256()
    lines: list[bytes] = []
    for start in range(0, head, _READ_PAGE):
        stop = min(start + _READ_PAGE, head)
        page = log.read(session_id, start, stop)
        if len(page) != stop - start:  # pragma: no cover - a log that loses events breaks its contract
            raise SessionNotFound(session_id)
        for env in page:
            line = encode_event(env) + b"\n"
            hasher.update(line)
            lines.append(line)
    digest = codec.DIGEST_PREFIX + hasher.hexdigest()
    out.write(ExportHeader(session_id, head, digest).to_line())
    for line in lines:
        out.write(line)
    return ExportSummary(session_id, head, digest)


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


def import_session(log: EventLog, fp: BinaryIO, as_id: str | None = None) -> ExportSummary:
    """Validate an export read from ``fp`` completely, then append it as one batch; or write nothing.

    ``as_id`` imports under a new session id instead of the header's ``sessionId``. Raises
    :class:`~foldline.errors.ImportFailed` (line number + reason) for the first bad line and
    :class:`~foldline.errors.SessionExists` when the target session already has events.
    """
    header = _header_from_line(fp.readline())
    if as_id is not None and not as_id:
        raise ImportFailed(1, "the new session id (--as) must be non-empty")
    session_id = header.session_id if as_id is None else as_id
    if log.head(session_id) != 0:
        raise SessionExists(session_id)

    rules = LogRules()
    hasher = hashlib.sha256()
    events: list[Envelope] = []
    line_no = 1
    while raw := fp.readline():
        line_no += 1
        if not raw.endswith(b"\n"):
            raise ImportFailed(line_no, "the line does not end with a newline (truncated file?)")
        body = raw[:-1]
        if not body.strip():
            raise ImportFailed(line_no, "empty line; every line after the header holds one event")
        if len(events) == header.events:
            raise ImportFailed(line_no, f"the header announces {header.events} events but the file has more lines")
        try:
            env = decode_event(body)
        except ValidationError as exc:
            raise ImportFailed(line_no, str(exc)) from exc
        canonical = encode_event(env)
        if canonical != body:
            at = _first_difference(canonical, body)
            raise ImportFailed(
                line_no,
                f"the event is not in canonical form (first difference at byte {at}); "
                "events are stored and exported exactly as canonical JSON (docs/FORMAT.md)",
            )
        try:
            rules.check(env)
        except ValidationError as exc:
            raise ImportFailed(line_no, str(exc)) from exc
        hasher.update(raw)
        events.append(env)

    if len(events) != header.events:
        raise ImportFailed(
            line_no + 1,
            f"the file ends after {len(events)} of the {header.events} events the header announces (truncated?)",
        )
    digest = codec.DIGEST_PREFIX + hasher.hexdigest()
    if digest != header.digest:
        raise ImportFailed(
            1,
            f"header digest {header.digest} does not match the event lines ({digest}); the file was altered",
        )
    try:
        log.append(session_id, 0, events)
    except ConflictError as exc:  # another writer created the session since the check above
        raise SessionExists(session_id) from exc
    return ExportSummary(session_id, len(events), digest)
