"""Segments: a contiguous run of one session's events as an Avro object container file (fastavro).

A segment is a standard Avro object container file — any Avro reader opens it — whose records are the
session's events under the event schema (``schemas/foldline.session_event.avsc``), the schema written in
the file's header. Its metadata names the session and the seq range (``foldline.session``,
``foldline.first``, ``foldline.end``), so a segment read from the wrong key is caught. Blocks are
``deflate``-compressed (docs/RETENTION.md says why deflate rather than zstd).

The bytes of a segment are a function of its events: the sync marker is derived from the session and
the range instead of drawn at random, so two archivers writing the same range write the same object,
and the digest a manifest records can be re-derived.

Writing takes the events' Avro bodies as they are on the Kafka topic (single-object encoding without
its 10-byte prefix): no event is decoded or re-encoded to archive it. Reading parses the container itself
(fastavro's reader would parse the schema in its header again for every segment) and decodes the records
of the current schema straight into envelopes (:func:`foldline.adapters.avro.decoding.decode_bodies`); a
segment of another schema goes through fastavro's reader, resolved to the current schema, and the same
datum mapping as the Kafka codec (:func:`foldline.adapters.avro.avro_to_envelope`). Both give equal
envelopes; the seqs are checked to be exactly the range.

Merging (:func:`merge_segments`) makes one segment of adjacent ones without decoding a record: their blocks
are inflated, their record bytes concatenated in seq order into blocks of about :data:`BLOCK_BYTES`, and
deflated again. Segments written under another schema than the others' are decoded and their events encoded
under the current schema first. The result is a function of the inputs' bytes, and it is read back (every
seq of the range, in order) before anyone may rely on it.
"""

from __future__ import annotations

import hashlib
import io
import json
import operator
import threading
import zlib
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from functools import cache
from itertools import accumulate
from typing import Any, cast

import fastavro
import fastavro.schema

from ...core.events import Envelope
from ...errors import ArchiveCorrupt, FormatError
from ..avro import (
    SINGLE_OBJECT_MAGIC,
    AvroCodec,
    avro_to_envelope,
    crc64_avro,
    load_schema_json,
    writer_schema_documents,
)
from ..avro.decoding import decode_bodies
from ..avro.direct import reads_directly

__all__ = [
    "BLOCK_BYTES",
    "CODEC",
    "SegmentEncoder",
    "body_of",
    "build_segment",
    "event_head",
    "merge_segments",
    "read_segment",
]

CODEC = "deflate"
BLOCK_BYTES = 256 * 1024  # uncompressed bytes per container block
_META_SESSION = "foldline.session"
_META_FIRST = "foldline.first"
_META_END = "foldline.end"
_SEQ = operator.attrgetter("seq")


class _Block:
    """What ``fastavro``'s ``Writer.write_block`` takes: a record count and the records' encoded bytes."""

    __slots__ = ("bytes_", "num_records")

    def __init__(self, num_records: int, data: bytes) -> None:
        self.num_records = num_records
        self.bytes_ = io.BytesIO(data)


def sync_marker(session_id: str, first: int, end: int) -> bytes:
    return hashlib.sha256(f"foldline-segment\0{session_id}\0{first}\0{end}".encode()).digest()[:16]


def _blocks(bodies: Sequence[bytes]) -> Iterator[_Block]:
    """Blocks of consecutive bodies, each closed by the first body that takes it to ``BLOCK_BYTES`` or more
    (the ends found by bisecting the running total of the sizes: no Python step per event)."""
    ends = list(accumulate(map(len, bodies)))
    start = 0
    while start < len(bodies):
        base = ends[start - 1] if start else 0
        stop = min(bisect_left(ends, base + BLOCK_BYTES, lo=start), len(bodies) - 1) + 1
        yield _Block(stop - start, b"".join(bodies[start:stop]))
        start = stop


def build_segment(session_id: str, first: int, bodies: Sequence[bytes], fingerprint: bytes) -> bytes:
    """The segment of seqs ``first`` .. ``first + len(bodies)``: Avro bodies of the schema ``fingerprint``."""
    if not bodies:
        raise ValueError("a segment holds at least one event")
    document = writer_schema_documents().get(fingerprint)
    if document is None:
        raise FormatError("avro-unknown-schema", f"no event schema has fingerprint {fingerprint.hex()}")
    end = first + len(bodies)
    out = io.BytesIO()
    writer = fastavro.write.Writer(
        out,
        dict(document),
        codec=CODEC,
        sync_marker=sync_marker(session_id, first, end),
        metadata={_META_SESSION: session_id, _META_FIRST: str(first), _META_END: str(end)},
    )
    for block in _blocks(bodies):
        writer.write_block(block)
    writer.flush()
    return out.getvalue()


class SegmentEncoder:
    """Avro bodies of envelopes under the current event schema (for logs that do not store Avro)."""

    def __init__(self, codec: AvroCodec | None = None) -> None:
        self._codec = codec or AvroCodec()
        if self._codec.framing != "single-object":
            self._codec = AvroCodec()
        self.fingerprint = self._codec.fingerprint

    def body(self, env: Envelope) -> bytes:
        return self._codec.encode(env)[10:]


def _long(data: bytes, at: int) -> tuple[int, int]:
    """The zigzag varint long at ``at`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def event_head(body: bytes) -> tuple[str, int]:
    """``(type, seq)`` of an event's Avro body, read without decoding the rest (the schema's first two fields).

    Raises ``ValueError`` for bytes that do not start like an event record.
    """
    try:
        first = body[0]
        if first < 0x80 and first and not first & 1:  # a type of 1 to 63 bytes (all of foldline's): one length byte
            end = 1 + (first >> 1)
            byte = body[end]
            if byte < 0x80:  # seqs below 64
                value = byte
            else:
                second = body[end + 1]
                if second < 0x80:  # seqs below 8,192
                    value = (byte & 0x7F) | (second << 7)
                elif body[end + 2] < 0x80:  # seqs below 1,048,576
                    value = (byte & 0x7F) | ((second & 0x7F) << 7) | (body[end + 2] << 14)
                else:
                    return _event_head(body)
            if not value & 1:
                return body[1:end].decode(), value >> 1
        return _event_head(body)
    except (IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"not an event record: {exc}") from exc


def _event_head(body: bytes) -> tuple[str, int]:
    size, at = _long(body, 0)
    if not 0 < size <= 1024:
        raise ValueError(f"an event type of {size} bytes")
    seq = _long(body, at + size)[0]
    if seq < 0:
        raise ValueError(f"negative seq {seq}")
    return body[at : at + size].decode(), seq


def body_of(value: bytes | None) -> tuple[bytes, bytes] | None:
    """``(fingerprint, body)`` of a single-object-encoded record value (``None`` for any other framing)."""
    if value is None or len(value) < 10 or value[:2] != SINGLE_OBJECT_MAGIC:
        return None
    return bytes(value[2:10]), value[10:]


# ---------------------------------------------------------------- reading


@cache
def _current() -> tuple[Any, bytes]:
    document = load_schema_json()
    parsed = fastavro.parse_schema(document)
    return parsed, crc64_avro(fastavro.schema.to_parsing_canonical_form(parsed).encode()).to_bytes(8, "little")


_schemas_lock = threading.Lock()
_writers: dict[str, tuple[bytes, Any]] = {}


def _writer(schema_text: str) -> tuple[bytes, Any]:
    """The fingerprint of a file's writer schema and the schema parsed (kept: files share a handful of schemas)."""
    with _schemas_lock:
        known = _writers.get(schema_text)
    if known is None:
        parsed = fastavro.parse_schema(json.loads(schema_text))
        fp = crc64_avro(fastavro.schema.to_parsing_canonical_form(parsed).encode()).to_bytes(8, "little")
        known = (fp, parsed)
        with _schemas_lock:
            _writers[schema_text] = known
    return known


class _Container:
    """An object container file's header and its blocks, still compressed (the Avro specification's layout:
    ``Obj\\x01``, the metadata map, the sync marker; then per block its record count, its size, its bytes
    and the sync marker again). Read here rather than by fastavro's reader, which parses the writer schema
    in every file's header again (~1 ms a segment); ``ValueError`` for bytes that are not such a file."""

    __slots__ = ("blocks", "meta")

    def __init__(self, data: bytes) -> None:
        if not data.startswith(b"Obj\x01"):
            raise ValueError("no Avro object container header")
        meta: dict[str, bytes] = {}
        p = 4
        n, p = _long(data, p)
        while n:
            if n < 0:
                n = -n
                p = _long(data, p)[1]
            for _ in range(n):
                size, p = _long(data, p)
                key = data[p : p + size].decode()
                size, p = _long(data, p + size)
                meta[key] = data[p : p + size]
                p += size
            n, p = _long(data, p)
        sync = data[p : p + 16]
        p += 16
        blocks: list[tuple[int, bytes]] = []
        while p < len(data):
            count, p = _long(data, p)
            size, p = _long(data, p)
            if count < 0 or size < 0 or p + size + 16 > len(data):
                raise ValueError(f"a block of {count} records and {size} bytes at {p} does not fit the file")
            blocks.append((count, data[p : p + size]))
            p += size
            if data[p : p + 16] != sync:
                raise ValueError(f"the block ending at {p} is not followed by the file's sync marker")
            p += 16
        if len(sync) != 16:
            raise ValueError("the header is cut short")
        self.meta = meta
        self.blocks = blocks


def _decoded_directly(container: _Container) -> list[Envelope] | None:
    """The events of a container whose records are of the schema :mod:`~foldline.adapters.avro.direct` reads
    (``None`` for another schema or codec: fastavro's reader takes the file)."""
    fingerprint, parsed = _writer(container.meta["avro.schema"].decode())
    codec = container.meta.get("avro.codec", b"null")
    if fingerprint != _current()[1] or not reads_directly(fingerprint) or codec not in (b"deflate", b"null"):
        return None
    events: list[Envelope] = []
    for count, block in container.blocks:
        raw = zlib.decompress(block, -15) if codec == b"deflate" else block
        events.extend(decode_bodies(raw, count, parsed))
    return events


def _read_with_fastavro(data: bytes) -> list[Envelope]:
    """Any container file: fastavro's reader, the records resolved to the current schema when written under another."""
    records = fastavro.reader(io.BytesIO(data), return_record_name=True, return_record_name_override=True)
    fingerprint, _ = _writer(records.metadata["avro.schema"])
    if fingerprint != _current()[1]:  # written under an older schema: read it as the current one
        records = fastavro.reader(
            io.BytesIO(data), reader_schema=_current()[0], return_record_name=True, return_record_name_override=True
        )
    return [avro_to_envelope(cast(dict[str, Any], datum)) for datum in records]


def read_segment(data: bytes, session_id: str, first: int, end: int, where: str) -> list[Envelope]:
    """The events of a segment that must hold seqs ``first`` .. ``end`` of ``session_id``; ArchiveCorrupt otherwise.

    A segment of the current schema is decoded by :func:`~foldline.adapters.avro.decoding.decode_bodies`
    (equal envelopes, several times faster); any other by fastavro's reader."""
    try:
        container = _Container(data)
        meta = container.meta
        named = tuple(meta.get(k, b"").decode() or None for k in (_META_SESSION, _META_FIRST, _META_END))
        if named != (session_id, str(first), str(end)):
            raise ArchiveCorrupt(
                where,
                f"the segment names session {named[0]!r} seqs {named[1]}..{named[2]}, "
                f"not {session_id!r} {first}..{end}",
            )
        events = _decoded_directly(container)
        if events is None:
            events = _read_with_fastavro(data)
    except ArchiveCorrupt:
        raise
    except FormatError as exc:
        raise ArchiveCorrupt(where, f"a record does not decode into an event: {exc}") from exc
    except Exception as exc:  # fastavro raises many types for bytes that are not a container file
        raise ArchiveCorrupt(where, f"not a readable Avro container file: {type(exc).__name__}: {exc}") from exc
    if len(events) != end - first:
        raise ArchiveCorrupt(where, f"holds {len(events)} events, its range {first}..{end} needs {end - first}")
    if not all(map(operator.eq, map(_SEQ, events), range(first, end))):  # the loop below only names the culprit
        for i, env in enumerate(events):
            if env.seq != first + i:
                raise ArchiveCorrupt(where, f"record {i} has seq {env.seq}, expected {first + i}")
    return events


# ---------------------------------------------------------------- merging


def _records(container: _Container) -> Iterator[tuple[int, bytes]]:
    """Each block of a container as ``(record count, the records' bytes, inflated)``."""
    codec = container.meta.get("avro.codec", b"null")
    if codec not in (b"deflate", b"null"):
        raise ValueError(f"a segment compressed with {codec.decode(errors='replace')!r}, not deflate")
    for count, block in container.blocks:
        yield count, zlib.decompress(block, -15) if codec == b"deflate" else block


def merge_segments(session_id: str, parts: Sequence[tuple[int, int, bytes, str]]) -> bytes:
    """One segment holding the events of adjacent segments of ``session_id``.

    ``parts`` are ``(first, end, bytes, where)`` of each input in seq order, their bytes already checked
    against their digests. Their metadata must name the session and their ranges, their record counts must
    fill the ranges; the output is read back (every seq of the whole range, in order) before it is
    returned. :class:`~foldline.errors.ArchiveCorrupt` names the input (or the output) that fails a check.
    """
    if len(parts) < 2:
        raise ValueError("a merge takes two segments or more")
    first, end = parts[0][0], parts[-1][1]
    where = f"the merge of seqs {first}..{end} of session {session_id!r}"
    containers: list[tuple[_Container, bytes, str]] = []
    at = first
    for a, b, data, name in parts:
        if a != at:
            raise ValueError(f"merge inputs are not adjacent: {name} starts at {a}, expected {at}")
        at = b
        try:
            container = _Container(data)
            named = tuple(container.meta.get(k, b"").decode() or None for k in (_META_SESSION, _META_FIRST, _META_END))
            fingerprint = _writer(container.meta["avro.schema"].decode())[0]
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise ArchiveCorrupt(name, f"not a readable Avro container file: {exc}") from exc
        if named != (session_id, str(a), str(b)):
            raise ArchiveCorrupt(
                name, f"the segment names session {named[0]!r} seqs {named[1]}..{named[2]}, not {session_id!r} {a}..{b}"
            )
        if sum(count for count, _ in container.blocks) != b - a:
            raise ArchiveCorrupt(name, f"its blocks hold another number of records than its range {a}..{b} needs")
        containers.append((container, fingerprint, name))
    schemas = {fp for _, fp, _ in containers}
    if len(schemas) == 1:
        container = containers[0][0]
        document: dict[str, Any] = json.loads(container.meta["avro.schema"])
        target = next(iter(schemas))
    else:  # written under several schemas: everything under the current one
        target = _current()[1]
        found = writer_schema_documents().get(target)
        if found is None:
            raise FormatError("avro-unknown-schema", f"no event schema has fingerprint {target.hex()}")
        document = dict(found)
    chunks: list[tuple[int, bytes]] = []
    encoder: SegmentEncoder | None = None
    for (container, fingerprint, name), (a, b, data, _) in zip(containers, parts, strict=True):
        try:
            if fingerprint == target:
                chunks.extend(_records(container))
                continue
            encoder = encoder or SegmentEncoder()
            events = read_segment(data, session_id, a, b, name)
            chunks.append((len(events), b"".join(encoder.body(e) for e in events)))
        except (ValueError, zlib.error) as exc:
            raise ArchiveCorrupt(name, f"its blocks do not inflate: {exc}") from exc
    out = io.BytesIO()
    writer = fastavro.write.Writer(
        out,
        document,
        codec=CODEC,
        sync_marker=sync_marker(session_id, first, end),
        metadata={_META_SESSION: session_id, _META_FIRST: str(first), _META_END: str(end)},
    )
    count, pieces, size = 0, [], 0
    for n, raw in chunks:  # whole input blocks into blocks of about BLOCK_BYTES
        count, size = count + n, size + len(raw)
        pieces.append(raw)
        if size >= BLOCK_BYTES:
            writer.write_block(_Block(count, b"".join(pieces)))
            count, pieces, size = 0, [], 0
    if count:
        writer.write_block(_Block(count, b"".join(pieces)))
    writer.flush()
    merged = out.getvalue()
    read_segment(merged, session_id, first, end, where)  # every seq of the range, in order, or ArchiveCorrupt
    return merged
