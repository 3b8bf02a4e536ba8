"""What a record on the session-event topics is: topic names, header names, record kinds, size limits.

Also what a consumed record becomes (:data:`ConsumedItem`: an event, a lease, or a dead letter) and how
its headers are read. docs/KAFKA.md, "Topics", has the layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from confluent_kafka import Message

from ...core.events import Envelope
from ...errors import FoldlineError

__all__ = [
    "HEADER_BATCH",
    "HEADER_EPOCH",
    "HEADER_KIND",
    "KIND_EVENT",
    "KIND_LEASE",
    "CONSUMER_FETCH_SIZES",
    "MAX_MESSAGE_BYTES",
    "MAX_RECORD_BYTES",
    "ConsumedEvent",
    "ConsumedItem",
    "ConsumedLease",
    "DeadLetter",
    "ForeignRecord",
    "Record",
    "consumed_record",
    "dlq_topic",
    "header",
    "headers_of",
    "inbox_topic",
    "index_topic",
]

HEADER_KIND = "fl-kind"
HEADER_EPOCH = "fl-epoch"
HEADER_BATCH = "fl-batch"
KIND_EVENT = b"event"
KIND_LEASE = b"lease"
#: The largest record batch the log's topics take (``max.message.bytes``, set when they are created and checked
#: at start-up) and its producers send (``message.max.bytes``). The broker's own default (Kafka 3.9:
#: ``message.max.bytes`` 1,048,588) applies only to topics without the setting; librdkafka's producer default
#: is 1,000,000. An event is at most 4 MiB of canonical JSON (core/limits.py), less as an Avro record.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_RECORD_BYTES = MAX_MESSAGE_BYTES - 64 * 1024  # room for key, headers and batch overhead
#: What every librdkafka consumer of the log's topics fetches, set rather than left to librdkafka's defaults
#: (2.x: 1 MiB per partition, growing on a larger record; 50 MiB per fetch; 100 MB per response): a whole
#: record of the largest size per partition, and a fetch that holds several.
CONSUMER_FETCH_SIZES: Mapping[str, int] = {
    "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
    "fetch.max.bytes": 8 * MAX_MESSAGE_BYTES,
    "receive.message.max.bytes": 8 * MAX_MESSAGE_BYTES + 1024 * 1024,  # librdkafka: >= fetch.max.bytes + 512
}

Record: TypeAlias = Message
"""A record as consumed from Kafka (confluent-kafka's ``Message``; :func:`consumed_record` makes one)."""


def index_topic(topic: str) -> str:
    return topic + ".index"


def dlq_topic(topic: str) -> str:
    return topic + ".dlq"


def inbox_topic(topic: str) -> str:
    """The sessions' durable inboxes beside the event topic (:mod:`.inbox`)."""
    return topic + ".inbox"


def header(msg: Record, name: str) -> bytes | None:
    """The value of the first header ``name`` (None when absent or not bytes)."""
    headers = msg.headers()
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == name:
            return value if isinstance(value, bytes) else None
    return None


def headers_of(msg: Record) -> dict[str, bytes]:
    """Every header of a record as bytes (a header without a value is left out)."""
    raw = msg.headers()
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, dict) else raw
    return {k: v.encode() if isinstance(v, str) else v for k, v in items if v is not None}


class ForeignRecord(Protocol):
    """A record another Kafka client consumed (aiokafka's ``ConsumerRecord``, as faust hands it over)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None: ...


def consumed_record(record: ForeignRecord) -> Record:
    """A record another Kafka client consumed, as the record checks and the dead-letter writer read it."""
    headers = record.headers
    pairs = list(headers.items()) if isinstance(headers, Mapping) else headers
    return Message(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=list(pairs) if pairs else None,
    )


# ---------------------------------------------------------------- consumed items


@dataclass(frozen=True, slots=True)
class ConsumedEvent:
    session_id: str
    event: Envelope
    epoch: int
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ConsumedLease:
    session_id: str
    epoch: int
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    session_id: str | None
    error: FoldlineError
    partition: int
    offset: int


ConsumedItem: TypeAlias = ConsumedEvent | ConsumedLease | DeadLetter
