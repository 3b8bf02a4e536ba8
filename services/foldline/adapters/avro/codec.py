"""Envelope <-> self-describing Avro bytes: single-object encoding, or Confluent framing with a schema registry.

* **Avro single-object encoding** (default): ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's parsing canonical form + the Avro binary body.
* **Confluent wire framing** (when a schema registry is configured): ``00`` + the 4-byte big-endian
  schema id the registry assigned + the body.
"""

from __future__ import annotations

import importlib
import io
import json
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import fastavro
import fastavro.schema

from ...core.events import Envelope
from ...core.validation import check_values
from ...errors import AvroDecodeError, ConfigError, StoreUnavailable, UnknownSchemaError
from .datum import avro_to_envelope, envelope_to_avro
from .decoding import direct_envelope
from .direct import reads_directly
from .schemas import (
    CONFLUENT_MAGIC,
    EVENT_SCHEMA_NAME,
    SINGLE_OBJECT_MAGIC,
    crc64_avro,
    load_schema_json,
    writer_schemas,
)
from .schemas import NAMESPACE as _NS
from .schemas import parse_schema as _parse

__all__ = ["AvroCodec", "SchemaRegistry"]


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
        # bodies of the current schema take the direct decoder (equal envelopes, ~2x less CPU)
        self._direct = reads_directly(self._fingerprint)
        self._direct_writer: Any = self._readers.get(self._fingerprint)

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
        if self._direct and writer is self._direct_writer and type(data) is bytes:
            direct = direct_envelope(data[body:])
            if direct is not None:
                return direct
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
