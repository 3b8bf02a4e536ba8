"""The event schemas: the ``.avsc`` files, their CRC-64-AVRO fingerprints, and every writer schema this process reads.

Schemas are files. In a wheel they ship as ``foldline/_schemas``; in a source checkout (editable
install) they are read from the repository's ``schemas/``. Superseded versions of a schema are kept in
``schemas/previous/`` so records written with them stay decodable (see docs/SCHEMAS.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
import fastavro.schema

from ...errors import ConfigError

__all__ = [
    "CONFLUENT_MAGIC",
    "EVENT_SCHEMA_NAME",
    "SINGLE_OBJECT_MAGIC",
    "crc64_avro",
    "load_schema_json",
    "parse_schema",
    "schema_dir",
    "writer_schema_documents",
    "writer_schemas",
]

EVENT_SCHEMA_NAME = "foldline.session_event"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
NAMESPACE = "foldline."


def schema_dir() -> Path:
    """The directory holding the ``.avsc`` files: packaged ``_schemas`` or the repo's ``schemas/``."""
    here = Path(__file__).resolve().parents[2]  # .../foldline
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


def parse_schema(schema_json: Mapping[str, Any]) -> tuple[Any, bytes]:
    """The schema parsed by fastavro, and its single-object fingerprint."""
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
            out[parse_schema(document)[1]] = document
    return out


@cache
def writer_schemas(directory: Path | None = None) -> Mapping[bytes, Any]:
    """Every event schema this process can read, parsed, by single-object fingerprint (current + previous)."""
    return {fp: parse_schema(document)[0] for fp, document in writer_schema_documents(directory).items()}
