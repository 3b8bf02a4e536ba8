"""Where the golden session logs live, and the framing of their Avro record streams.

``tests/fixtures/golden-logs/v0/`` (format version 0) holds, per session:

* ``<session>.jsonl`` — the export file of docs/FORMAT.md §8 (``foldline import`` takes it);
* ``<session>.verify.json`` — the report ``foldline verify <session> --json`` prints for it (its four fields;
  the outcome printed after them is derived from them);
* ``avro-<fingerprint>/<session>.records`` — the Kafka record value of every event in seq order (Avro
  single-object encoding by ``AvroCodec``, exactly what the Kafka log writes), each preceded by its length
  as a 4-byte big-endian unsigned integer; ``<fingerprint>`` is the hex of the writer schema's 8-byte
  fingerprint as framed in the records;

and ``attachments/`` — every object the logs reference, in the filesystem store's layout.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "ATTACHMENTS_DIR",
    "GOLDEN_DIR",
    "LINKED",
    "SESSIONS",
    "avro_dir",
    "frame_records",
    "jsonl_path",
    "read_records",
    "records_path",
    "verify_path",
]

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "golden-logs" / "v0"
ATTACHMENTS_DIR = GOLDEN_DIR / "attachments"
#: Every golden session, in the order the generator writes them (a fork after its parent).
SESSIONS = (
    "golden-anthropic",
    "golden-fork",
    "golden-openai",
    "golden-quarantine",
    "golden-transport",
    "golden-usage",
    "golden-pauses",
    "golden-pauses-research",
)

#: Sessions whose lineage names another golden session (a sub-agent and its parent): verified beside it.
LINKED: dict[str, tuple[str, ...]] = {
    "golden-pauses": ("golden-pauses-research",),
    "golden-pauses-research": ("golden-pauses",),
}

_LENGTH = struct.Struct(">I")


def jsonl_path(session: str) -> Path:
    return GOLDEN_DIR / f"{session}.jsonl"


def verify_path(session: str) -> Path:
    return GOLDEN_DIR / f"{session}.verify.json"


def avro_dir(fingerprint: bytes) -> Path:
    return GOLDEN_DIR / f"avro-{fingerprint.hex()}"


def records_path(fingerprint: bytes, session: str) -> Path:
    return avro_dir(fingerprint) / f"{session}.records"


def frame_records(records: Iterable[bytes]) -> bytes:
    """Length-prefixed concatenation of record values."""
    return b"".join(_LENGTH.pack(len(r)) + r for r in records)


def read_records(data: bytes) -> list[bytes]:
    """The record values of a length-prefixed stream; ``ValueError`` if it is truncated."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        if at + _LENGTH.size > len(data):
            raise ValueError(f"record stream truncated in a length prefix at byte {at}")
        (n,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if at + n > len(data):
            raise ValueError(f"record stream truncated: a {n}-byte record at byte {at} runs past the end")
        out.append(data[at : at + n])
        at += n
    return out
