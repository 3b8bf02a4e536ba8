"""Session events as Avro: the schemas in ``schemas/``, and Envelope <-> self-describing Avro bytes.

Two framings, both self-describing:

* **Avro single-object encoding** (default): ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's parsing canonical form + the Avro binary body.
* **Confluent wire framing** (when a schema registry is configured): ``00`` + the 4-byte big-endian
  schema id the registry assigned + the body.

Encoding goes through the logged JSON form (:func:`foldline.core.wire.envelope_to_json`) and decoding
back through :func:`foldline.core.wire.envelope_from_json`, so the Avro form carries exactly the logged
field names and every shape rule of the core is checked on decode; encoding first holds the event to the
values every backend can hold (:func:`foldline.core.validation.check_values`). Every failure is typed:
:class:`AvroDecodeError` (bytes that are not a record of ours) and :class:`UnknownSchemaError` (a
fingerprint / schema id we have no writer schema for), both :class:`~foldline.errors.FormatError`.

Schemas are files. In a wheel they ship as ``foldline/_schemas``; in a source checkout (editable
install) they are read from the repository's ``schemas/``. Superseded versions of a schema are kept in
``schemas/previous/`` so records written with them stay decodable (see docs/SCHEMAS.md).
"""

from __future__ import annotations

import importlib
import io
import json
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol, assert_never

import fastavro
import fastavro.schema

from ..core import codec
from ..core.content import (
    REASONING_KINDS,
    ContentBlock,
    EncryptedReasoningBlock,
    ImageBlock,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultPart,
    Usage,
)
from ..core.events import (
    TURN_END_REASONS,
    AssistantChunk,
    AssistantMessage,
    AttachmentQuarantine,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    LlmRetry,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    UserMessage,
)
from ..core.validation import check_values
from ..core.wire import envelope_from_json, envelope_to_json, image_to_json
from ..errors import AvroDecodeError, ConfigError, StoreUnavailable, UnknownSchemaError

__all__ = [
    "EVENT_SCHEMA_NAME",
    "AvroCodec",
    "SchemaRegistry",
    "avro_to_envelope",
    "crc64_avro",
    "envelope_to_avro",
    "load_schema_json",
    "schema_dir",
    "writer_schema_documents",
    "writer_schemas",
]

EVENT_SCHEMA_NAME = "foldline.session_event"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
_NS = "foldline."


# ---------------------------------------------------------------- schema files


def schema_dir() -> Path:
    """The directory holding the ``.avsc`` files: packaged ``_schemas`` or the repo's ``schemas/``."""
    here = Path(__file__).resolve().parent.parent  # .../foldline
    packaged = here / "_schemas"
    if packaged.is_dir():
        return packaged
    repo = here.parent.parent / "schemas"  # services/foldline -> repo root
    if repo.is_dir():
        return repo
    raise ConfigError(f"foldline's Avro schemas are missing: neither {packaged} nor {repo} exists; reinstall foldline")


def load_schema_json(name: str = EVENT_SCHEMA_NAME, directory: Path | None = None) -> dict[str, Any]:
    """The JSON of ``<name>.avsc``."""
    path = (directory or schema_dir()) / f"{name}.avsc"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load Avro schema {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"Avro schema {path} must be a JSON object")
    return value


_CRC64_EMPTY = 0xC15D213AA4D7A795


@cache
def _crc64_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


def crc64_avro(data: bytes) -> int:
    """The CRC-64-AVRO (Rabin) fingerprint of ``data`` as the Avro specification defines it."""
    table = _crc64_table()
    fp = _CRC64_EMPTY
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def _compiled_writer() -> Callable[..., None] | None:
    """fastavro's compiled datum writer — what ``schemaless_writer`` calls once it has re-collected the
    schema's named types, which costs about a fifth of a small record's encode. Not part of fastavro's
    documented API: :class:`AvroCodec` proves it byte-identical to ``schemaless_writer`` before using it."""
    try:
        write_data = getattr(importlib.import_module("fastavro._write"), "write_data", None)
    except ImportError:
        return None
    return write_data if callable(write_data) else None


_WRITE_DATA = _compiled_writer()


def _parse(schema_json: Mapping[str, Any]) -> tuple[Any, bytes]:
    parsed = fastavro.parse_schema(dict(schema_json))
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    return parsed, crc64_avro(canonical.encode()).to_bytes(8, "little")


@cache
def writer_schema_documents(directory: Path | None = None) -> Mapping[bytes, Mapping[str, Any]]:
    """The JSON of every event schema this process can read, by single-object fingerprint (current + previous)."""
    root = directory or schema_dir()
    out: dict[bytes, Mapping[str, Any]] = {}
    files = [root / f"{EVENT_SCHEMA_NAME}.avsc", *sorted((root / "previous").glob(f"{EVENT_SCHEMA_NAME}*.avsc"))]
    for path in files:
        if path.is_file():
            document = load_schema_json(path.name.removesuffix(".avsc"), path.parent)
            out[_parse(document)[1]] = document
    return out


@cache
def writer_schemas(directory: Path | None = None) -> Mapping[bytes, Any]:
    """Every event schema this process can read, parsed, by single-object fingerprint (current + previous)."""
    return {fp: _parse(document)[0] for fp, document in writer_schema_documents(directory).items()}


# ---------------------------------------------------------------- Envelope <-> Avro datum


def _part_to_avro(part: ToolResultPart) -> tuple[str, dict[str, Any]]:
    match part:
        case TextBlock(text=text):
            return (_NS + "TextBlock", {"text": text})
        case ImageBlock(image=ref):
            return (_NS + "ImageBlock", {"attachment": image_to_json(ref)})
        case _:
            assert_never(part)


def _block_to_avro(block: ContentBlock) -> tuple[str, dict[str, Any]]:
    match block:
        case TextBlock() | ImageBlock():
            return _part_to_avro(block)
        case ToolCallBlock(id=id_, name=name, arguments=arguments):
            return (_NS + "ToolCallBlock", {"id": id_, "name": name, "arguments": arguments})
        case ToolResultBlock(tool_call_id=tcid, content=parts, is_error=is_error):
            return (
                _NS + "ToolResultBlock",
                {"toolCallId": tcid, "content": [_part_to_avro(p) for p in parts], "isError": is_error},
            )
        case ReasoningBlock(text=text, signature=signature):
            return (_NS + "ReasoningBlock", {"text": text, "signature": signature})
        case RedactedReasoningBlock(data=data):
            return (_NS + "RedactedReasoningBlock", {"data": data})
        case EncryptedReasoningBlock(id=id_, summary=summary, encrypted_content=encrypted):
            return (
                _NS + "EncryptedReasoningBlock",
                {"id": id_, "summary": list(summary), "encryptedContent": encrypted},
            )
        case _:
            assert_never(block)


def _surface_to_avro(d: dict[str, Any], content: Sequence[ContentBlock]) -> dict[str, Any]:
    # Reasoning blocks travel in the ``reasoning`` field with their position, so a reader of a schema from before
    # they existed (FULL_TRANSITIVE) still reads the record; the rest keeps its order in ``content``.
    blocks: list[tuple[str, dict[str, Any]]] = []
    reasoning: list[dict[str, Any]] = []
    for at, b in enumerate(content):
        if b.kind in REASONING_KINDS:
            reasoning.append({"at": at, "block": _block_to_avro(b)})
        else:
            blocks.append(_block_to_avro(b))
    d["content"] = blocks
    if "role" in d:  # user and assistant messages carry reasoning; a tool result cannot
        d["reasoning"] = reasoning or None
    d.pop("role", None)
    op = d["surfaceOp"]
    d["surfaceOp"] = "append" if op == "append" else (_NS + "ReplaceOp", {"start": op["start"], "end": op["end"]})
    d.setdefault("sourceEventSeqs", None)
    return d


_RECORD_NAMES = {
    "user/message": "UserMessage",
    "assistant/message": "AssistantMessage",
    "tool/result": "ToolResult",
    "turn/start": "TurnStart",
    "turn/end": "TurnEnd",
    "step/start": "StepStart",
    "step/end": "StepEnd",
    "tool/call": "ToolCall",
    "request/header": "RequestHeader",
    "request/dispatch": "RequestDispatch",
    "session/end-seed": "SessionEndSeed",
    "compaction/start": "CompactionStart",
    "compaction/summary": "CompactionSummary",
    "compaction/end": "CompactionEnd",
    "attachment/quarantine": "AttachmentQuarantine",
}
_TYPES_BY_RECORD = {_NS + v: k for k, v in _RECORD_NAMES.items()}


def _data_to_avro(event: EventData, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``data`` union branch of an event: its record name and value, from its logged JSON ``data``."""
    match event:
        case UserMessage() | AssistantMessage() | ToolResult():
            return (_NS + _RECORD_NAMES[event.TYPE], _surface_to_avro(data, event.content))
        case RequestHeader():
            header = data["header"]
            if "tools" in header:
                header["tools"] = [
                    {**t, "inputSchema": codec.canonical_json(t["inputSchema"]).decode()} for t in header["tools"]
                ]
            return (_NS + "RequestHeader", data)
        case (
            TurnStart()
            | TurnEnd()
            | StepStart()
            | StepEnd()
            | ToolCall()
            | RequestDispatch()
            | SessionEndSeed()
            | CompactionStart()
            | CompactionSummary()
            | CompactionEnd()
            | AttachmentQuarantine()
        ):
            return (_NS + _RECORD_NAMES[event.TYPE], data)
        case LlmRetry() | AssistantChunk() | UnknownEvent():
            # always ignorable (docs/SCHEMAS.md rule 4): they travel as UnknownEvent, and readers that know
            # the type decode its JSON data into the event again
            return (_NS + "UnknownEvent", {"json": codec.canonical_json(data).decode()})
        case _:
            assert_never(event)


def envelope_to_avro(env: Envelope) -> dict[str, Any]:
    """The Avro datum of an envelope (fastavro tuple notation selects each union branch)."""
    j = envelope_to_json(env)
    return {
        "type": j["type"],
        "seq": env.seq,
        "time": env.time,
        "ignorable": env.ignorable,
        "data": _data_to_avro(env.data, j["data"]),
    }


def _drop_nulls(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _block_from_avro(value: Any) -> dict[str, Any]:
    name, d = value
    match name:
        case "foldline.TextBlock":
            return {"type": "text", "text": d["text"]}
        case "foldline.ImageBlock":
            return {"type": "image", "attachment": d["attachment"]}
        case "foldline.ToolCallBlock":
            return {"type": "tool-call", **d}
        case "foldline.ToolResultBlock":
            out = {
                "type": "tool-result",
                "toolCallId": d["toolCallId"],
                "content": [_block_from_avro(b) for b in d["content"]],
            }
            if d.get("isError"):
                out["isError"] = True
            return out
        case "foldline.ReasoningBlock":
            out = {"type": "reasoning", "text": d["text"]}
            if d.get("signature") is not None:
                out["signature"] = d["signature"]
            return out
        case "foldline.RedactedReasoningBlock":
            return {"type": "redacted-reasoning", "data": d["data"]}
        case "foldline.EncryptedReasoningBlock":
            return {"type": "encrypted-reasoning", **d}
    raise ValueError(f"unknown content block record {name!r}")


def _content_from_avro(content: list[Any], reasoning: list[Any] | None) -> list[dict[str, Any]]:
    """``content`` with the ``reasoning`` entries put back at their positions."""
    out = [_block_from_avro(b) for b in content]
    if not reasoning:
        return out
    merged: list[dict[str, Any]] = []
    rest = iter(out)
    total = len(out) + len(reasoning)
    entries = iter(reasoning)
    entry = next(entries, None)
    for at in range(total):
        if entry is not None and entry["at"] == at:
            merged.append(_block_from_avro(entry["block"]))
            entry = next(entries, None)
        else:
            block = next(rest, None)
            if block is None:
                raise ValueError(f"reasoning entries out of order at content position {at}")
            merged.append(block)
    if entry is not None:
        raise ValueError(f"reasoning entry at {entry['at']} is outside the {total} content blocks or out of order")
    return merged


_TEXT_BLOCK = _NS + "TextBlock"
_CALL_BLOCK = _NS + "ToolCallBlock"
_PLAIN = frozenset({"turn/start", "turn/end", "step/start", "step/end", "tool/call", "request/dispatch"})
_SURFACE = ("surfaceOp", "sourceEventSeqs")
_USAGE_FIELDS = frozenset({"input", "output", "cacheRead", "cacheWrite"})
# the fields of each record the direct path reads; a record with any other field (a newer schema) takes the
# checked path, so nothing the direct path does not know is ever dropped
_FIELDS: dict[str, frozenset[str]] = {
    "user/message": frozenset({"id", "content", "source", "reasoning", *_SURFACE}),
    "assistant/message": frozenset(
        {"id", "content", "usage", "stopReason", "reasoning", "providerRequestId", "providerMessageId", *_SURFACE}
    ),
    "tool/result": frozenset({"callId", "name", "content", "isError", *_SURFACE}),
    "turn/start": frozenset({"turn"}),
    "turn/end": frozenset({"turn", "reason"}),
    "step/start": frozenset({"turn", "step"}),
    "step/end": frozenset({"turn", "step"}),
    "tool/call": frozenset({"turn", "step", "callId", "name", "arguments"}),
    "request/dispatch": frozenset({"turn", "step", "serializer", "serializerVersion", "digest", "bytes"}),
}


def _fast_blocks(items: Any, *, parts: bool = False) -> tuple[Any, ...] | None:
    """Text and tool-call blocks (text only for tool-result parts); None for anything else."""
    out: list[Any] = []
    for name, d in items:
        if name == _TEXT_BLOCK:
            out.append(TextBlock(d["text"]))
        elif name == _CALL_BLOCK and not parts:
            out.append(ToolCallBlock(d["id"], d["name"], d["arguments"]))
        else:
            return None
    return tuple(out)


def _fast_plain(etype: str, d: Mapping[str, Any]) -> EventData | None:
    """Turn, step, tool-call and dispatch records: the values the core's readers accept, else None."""
    turn = d["turn"]
    if turn < 0:
        return None
    if etype == "turn/start":
        return TurnStart(turn)
    if etype == "turn/end":
        reason = d["reason"]
        return TurnEnd(turn, reason) if reason in TURN_END_REASONS else None
    step = d["step"]
    if step < 0:
        return None
    if etype == "step/start":
        return StepStart(turn, step)
    if etype == "step/end":
        return StepEnd(turn, step)
    if etype == "tool/call":
        return ToolCall(turn, step, d["callId"], d["name"], d["arguments"])
    digest, version, size = d["digest"], d["serializerVersion"], d["bytes"]
    hexpart = digest[len(codec.DIGEST_PREFIX) :]
    if (
        version < 0
        or size < 0
        or not digest.startswith(codec.DIGEST_PREFIX)
        or len(hexpart) != 64
        or hexpart.strip("0123456789abcdef")
    ):
        return None
    return RequestDispatch(turn, step, d["serializer"], version, digest, size)


def _fast_envelope(datum: Mapping[str, Any]) -> Envelope | None:
    """The envelope of a datum of the common shapes, built directly (the schema already guarantees every
    field's type); ``None`` for anything else, which :func:`avro_to_envelope` then reads through the logged
    JSON form and the core's validating reader. Both return equal envelopes (tests hold them together)."""
    etype, seq, time = datum["type"], datum["seq"], datum["time"]
    if datum.get("ignorable") or seq < 0 or time < 0:
        return None
    name, d = datum["data"]
    fields = _FIELDS.get(etype)
    if fields is None or name != _NS + _RECORD_NAMES[etype] or d.keys() != fields:
        return None
    if etype in _PLAIN:
        data = _fast_plain(etype, d)
        return None if data is None else Envelope(seq, time, data)
    op = d["surfaceOp"]
    if type(op) is tuple:  # (the enum's record name, its symbol): the union also holds ReplaceOp
        op = op[1]
    if op != "append" or d["sourceEventSeqs"] is not None:
        return None
    if d.get("reasoning"):  # reasoning blocks woven back into the content: the checked path
        return None
    if etype == "user/message":
        content = _fast_blocks(d["content"])
        return None if content is None else Envelope(seq, time, UserMessage(d["id"], content, d["source"]))
    if etype == "assistant/message":
        content = _fast_blocks(d["content"])
        u = d["usage"]
        if content is None or (u is not None and (u.keys() != _USAGE_FIELDS or min(u.values()) < 0)):
            return None
        usage = None if u is None else Usage(u["input"], u["output"], u["cacheRead"], u["cacheWrite"])
        message = AssistantMessage(
            d["id"],
            content,
            usage,
            d["stopReason"],
            provider_request_id=d["providerRequestId"],
            provider_message_id=d["providerMessageId"],
        )
        return Envelope(seq, time, message)
    parts = _fast_blocks(d["content"], parts=True)
    if parts is None:
        return None
    return Envelope(seq, time, ToolResult(d["callId"], d["name"], parts, bool(d["isError"])))


def avro_to_envelope(datum: Mapping[str, Any]) -> Envelope:
    """Rebuild the envelope from a decoded datum (``return_record_name`` form); every core rule applies."""
    try:
        fast = _fast_envelope(datum)
    except (KeyError, TypeError, ValueError, AttributeError):
        fast = None
    return fast if fast is not None else _checked_envelope(datum)


def _checked_envelope(datum: Mapping[str, Any]) -> Envelope:
    """The envelope of any datum, through the logged JSON form and the core's validating reader."""
    seq = datum.get("seq")
    try:
        etype = datum["type"]
        name, data = datum["data"]
        data = dict(data)
        if name == _NS + "UnknownEvent":
            data = codec.loads(data["json"])
        else:
            expected = _TYPES_BY_RECORD.get(name)
            if expected != etype:
                raise AvroDecodeError(
                    f"envelope type {etype!r} does not match its data record {name!r}",
                    seq=seq if isinstance(seq, int) else None,
                )
            if "content" in data:
                data["content"] = _content_from_avro(data["content"], data.pop("reasoning", None))
            if "surfaceOp" in data:
                op = data["surfaceOp"]
                if isinstance(op, tuple):  # (record name, value): the union also holds the named enum
                    op = op[1]
                data["surfaceOp"] = (
                    "append" if op == "append" else {"op": "replace", "start": op["start"], "end": op["end"]}
                )
                if etype == "user/message":
                    data["role"] = "user"
                elif etype == "assistant/message":
                    data["role"] = "assistant"
                if not data.get("isError", True):
                    del data["isError"]
            if etype == "request/header":
                header = _drop_nulls(data["header"])
                header["config"] = _drop_nulls(header["config"])
                if "tools" in header:
                    header["tools"] = [{**t, "inputSchema": codec.loads(t["inputSchema"])} for t in header["tools"]]
                data["header"] = header
            data = _drop_nulls(data)
        value: dict[str, Any] = {"type": etype, "seq": datum["seq"], "time": datum["time"], "data": data}
    except (KeyError, TypeError, ValueError) as exc:
        raise AvroDecodeError(f"malformed event datum: {exc!r}", seq=seq if isinstance(seq, int) else None) from exc
    if datum.get("ignorable"):
        value["ignorable"] = True
    return envelope_from_json(value)


# ---------------------------------------------------------------- framing


class SchemaRegistry(Protocol):
    """The part of confluent-kafka's ``SchemaRegistryClient`` the codec uses."""

    def register_schema(self, subject_name: str, schema: Any, normalize_schemas: bool = ...) -> int: ...

    def get_schema(self, schema_id: int, subject_name: str | None = ..., fmt: str | None = ...) -> Any: ...


class AvroCodec:
    """Envelope <-> self-describing Avro bytes.

    ``AvroCodec()`` uses single-object encoding. ``AvroCodec(registry_url=..., subject=...)`` uses
    Confluent framing with a ``confluent_kafka.schema_registry.SchemaRegistryClient`` (``mock://``
    URLs give the client's in-process registry, for tests); the schema is registered on first encode.
    """

    def __init__(
        self,
        *,
        registry_url: str | None = None,
        subject: str = "foldline.session-events-value",
        registry: SchemaRegistry | None = None,
        schema_directory: Path | None = None,
    ) -> None:
        schema_json = load_schema_json(EVENT_SCHEMA_NAME, schema_directory)
        self._schema_json = schema_json
        self._schema, self._fingerprint = _parse(schema_json)
        self._readers = writer_schemas(schema_directory)
        self.subject = subject
        self._registry = registry
        if registry is None and registry_url is not None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ConfigError(
                    "a schema registry URL is configured but confluent-kafka's schema registry client is not "
                    "installed; install confluent-kafka[schemaregistry]"
                ) from exc
            self._registry = SchemaRegistryClient.new_client({"url": registry_url})
        self._schema_id: int | None = None
        self._by_id: dict[int, Any] = {}
        self._fingerprints: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._named: dict[str, Any] = {}
        fastavro.parse_schema(dict(schema_json), self._named)
        self._write_data = _WRITE_DATA if self._compiled_writer_agrees() else None
        self._single_object = SINGLE_OBJECT_MAGIC + self._fingerprint

    @property
    def registry(self) -> SchemaRegistry | None:
        return self._registry

    @property
    def framing(self) -> str:
        return "confluent" if self._registry is not None else "single-object"

    @property
    def uses_compiled_writer(self) -> bool:
        """Whether encoding calls fastavro's compiled writer directly (proved equal at construction)."""
        return self._write_data is not None

    @property
    def fingerprint(self) -> bytes:
        """The 8-byte CRC-64-AVRO fingerprint of the current schema (little-endian, as framed)."""
        return self._fingerprint

    # -- encode

    def encode(self, env: Envelope) -> bytes:
        check_values(env)  # the values every backend can hold (ValidationError), before Avro sees a long
        datum = envelope_to_avro(env)
        if self._write_data is not None:
            out = bytearray(self._single_object if self._registry is None else self._prefix())
            self._write_data(out, datum, self._schema, self._named, "", {})
            return bytes(out)
        buf = io.BytesIO()
        buf.write(self._prefix())
        fastavro.schemaless_writer(buf, self._schema, datum)
        return buf.getvalue()

    def _compiled_writer_agrees(self) -> bool:
        """Whether fastavro's compiled writer, called directly, writes what ``schemaless_writer`` writes
        (a named-type reference, a union branch, an array and a null among them)."""
        if _WRITE_DATA is None:
            return False
        probe = {
            "type": "user/message",
            "seq": 3,
            "time": 1,
            "ignorable": False,
            "data": (
                _NS + "UserMessage",
                {
                    "id": "r",
                    "content": [
                        (
                            _NS + "ToolResultBlock",
                            {"toolCallId": "c", "content": [(_NS + "TextBlock", {"text": "é"})], "isError": True},
                        )
                    ],
                    "source": "user",
                    "surfaceOp": (_NS + "ReplaceOp", {"start": 0, "end": 2}),
                    "sourceEventSeqs": [1, 2],
                },
            ),
        }
        expected = io.BytesIO()
        try:
            fastavro.schemaless_writer(expected, self._schema, probe)
            direct = bytearray()
            _WRITE_DATA(direct, probe, self._schema, self._named, "", {})
        except Exception:  # a fastavro whose internals differ: use its public writer
            return False
        return bytes(direct) == expected.getvalue()

    def _prefix(self) -> bytes:
        if self._registry is None:
            return SINGLE_OBJECT_MAGIC + self._fingerprint
        schema_id = self._schema_id
        if schema_id is None:
            schema_id = self._register()
        return CONFLUENT_MAGIC + struct.pack(">I", schema_id)

    def _register(self) -> int:
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        assert self._registry is not None
        with self._lock:
            if self._schema_id is None:
                try:
                    schema_id = self._registry.register_schema(
                        self.subject, Schema(json.dumps(self._schema_json), "AVRO")
                    )
                except SchemaRegistryError as exc:
                    raise StoreUnavailable(f"schema registry refused {self.subject!r}: {exc}") from exc
                except Exception as exc:
                    raise StoreUnavailable(f"schema registry unreachable: {exc}") from exc
                self._schema_id = int(schema_id)
                self._by_id[self._schema_id] = self._schema
            return self._schema_id

    # -- decode

    def decode(self, data: bytes | None) -> Envelope:
        """Decode one framed record (either framing is accepted); typed errors on anything else."""
        if not data:
            raise AvroDecodeError("empty record value")
        if data[:2] == SINGLE_OBJECT_MAGIC:
            writer = self._readers.get(bytes(data[2:10]))
            if writer is None:
                raise UnknownSchemaError(
                    f"unknown schema fingerprint {bytes(data[2:10]).hex()} (single-object encoding); the record was "
                    "written with a schema this foldline does not ship — upgrade, or add the old schema to "
                    "schemas/previous/"
                )
            body = 10
        elif data[:1] == CONFLUENT_MAGIC and len(data) >= 5:
            writer = self._writer_by_id(struct.unpack(">I", data[1:5])[0])
            body = 5
        else:
            raise AvroDecodeError(f"not a framed Avro record (starts with {bytes(data[:2]).hex()!r})")
        try:
            datum = fastavro.schemaless_reader(
                io.BytesIO(data[body:]),
                writer,
                # Written with our own schema: no resolution needed. Passing a reader schema makes fastavro
                # resolve (and deep-compare) the schemas on every record, ~6x slower per decode.
                None if writer is self._readers.get(self._fingerprint) or writer is self._schema else self._schema,
                return_record_name=True,
                return_record_name_override=True,
            )
        except Exception as exc:  # fastavro raises many types (EOFError, ValueError, SchemaResolutionError...)
            raise AvroDecodeError(f"Avro body does not decode: {type(exc).__name__}: {exc}") from exc
        if not isinstance(datum, dict):
            raise AvroDecodeError("Avro body is not a record")
        return avro_to_envelope(datum)

    def split(self, data: bytes | None) -> tuple[bytes, bytes]:
        """``(fingerprint, body)`` of a framed record without decoding it: the single-object fingerprint of its
        writer schema (for Confluent framing, of the registry schema its id names) and its Avro body."""
        if not data:
            raise AvroDecodeError("empty record value")
        if data[:2] == SINGLE_OBJECT_MAGIC and len(data) >= 10:
            return bytes(data[2:10]), data[10:]
        if data[:1] == CONFLUENT_MAGIC and len(data) >= 5:
            schema_id = struct.unpack(">I", data[1:5])[0]
            fingerprint = self._fingerprints.get(schema_id)
            if fingerprint is None:
                writer = self._writer_by_id(schema_id)
                canonical = fastavro.schema.to_parsing_canonical_form(writer)
                fingerprint = self._fingerprints[schema_id] = crc64_avro(canonical.encode()).to_bytes(8, "little")
            return fingerprint, data[5:]
        raise AvroDecodeError(f"not a framed Avro record (starts with {bytes(data[:2]).hex()!r})")

    def _writer_by_id(self, schema_id: int) -> Any:
        writer = self._by_id.get(schema_id)
        if writer is not None:
            return writer
        if self._registry is None:
            raise UnknownSchemaError(
                f"record is in Confluent framing (schema id {schema_id}) but no schema registry is configured"
            )
        try:
            schema = self._registry.get_schema(schema_id)
            parsed = fastavro.parse_schema(json.loads(schema.schema_str))
        except Exception as exc:
            raise UnknownSchemaError(f"schema id {schema_id} is not in the registry: {exc}") from exc
        with self._lock:
            self._by_id[schema_id] = parsed
        return parsed
