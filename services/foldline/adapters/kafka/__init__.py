"""The Kafka adapter: the event log on Kafka, consuming its topic, and its dead letters (docs/KAFKA.md).

Every confluent-kafka call of foldline is in this package, and every librdkafka failure leaves it as an
error of :mod:`foldline.errors`.

=================  ===========================================================================
module             holds
=================  ===========================================================================
``records``        topic names, header names, record kinds, size limits, header reading; consumed items
``partitioning``   Kafka's murmur2 partitioner: :func:`partition_for`
``index``          the session index: entry and chunk codec, and the session state an entry describes
``clients``        the librdkafka clients of a log, and how their errors map onto foldline's
``writer``         committing appends: the group writer and a session's own writer
``reader``         partition ends, index catch-up, fetching one session's records
``topics``         creating and checking the log's topics; waiting for a topic to exist
``retention``      :class:`TopicPolicy`: topic settings that cannot lose the log, and the start-up checks
``archive_tail``   one reader over a session's archive (below its watermark) and its Kafka tail
``archive_feed``   :class:`ArchiveFeed`: what an archiver reads — raw committed records, the index, bounds
``log``            :class:`KafkaEventLog`, the ``EventLog`` port on Kafka
``dead_letters``   the record checks and the one dead-letter writer every consumer runtime uses
``consumer``       :class:`SessionEventConsumer`, a consumer-group member reading typed items
``preflight``      :func:`check_kafka_access`: is a client with these security settings let in?
=================  ===========================================================================
"""

from __future__ import annotations

from .archive_feed import ArchiveFeed, PartitionProgress, archive_progress
from .clients import KafkaClients
from .consumer import SessionEventConsumer
from .dead_letters import (
    DLQ_HEADER_ERROR,
    DLQ_HEADER_OFFSET,
    DLQ_HEADER_PARTITION,
    DLQ_HEADER_REASON,
    DLQ_HEADER_RULE,
    DLQ_HEADER_TOPIC,
    DeadLetterWriter,
    RecordChecker,
)
from .log import KafkaEventLog
from .partitioning import partition_for
from .preflight import check_kafka_access
from .reader import Watermarks, fetch_records, read_partition_span
from .records import (
    HEADER_BATCH,
    HEADER_EPOCH,
    HEADER_KIND,
    KIND_EVENT,
    KIND_LEASE,
    ConsumedEvent,
    ConsumedItem,
    ConsumedLease,
    DeadLetter,
    Record,
    consumed_record,
    dlq_topic,
    index_topic,
)
from .retention import TopicCheck, TopicPolicy
from .topics import inspect_topics, wait_for_topic

__all__ = [
    "ArchiveFeed",
    "DLQ_HEADER_ERROR",
    "DLQ_HEADER_OFFSET",
    "DLQ_HEADER_PARTITION",
    "DLQ_HEADER_REASON",
    "DLQ_HEADER_RULE",
    "DLQ_HEADER_TOPIC",
    "HEADER_BATCH",
    "HEADER_EPOCH",
    "HEADER_KIND",
    "KIND_EVENT",
    "KIND_LEASE",
    "ConsumedEvent",
    "ConsumedItem",
    "ConsumedLease",
    "DeadLetter",
    "DeadLetterWriter",
    "KafkaClients",
    "KafkaEventLog",
    "PartitionProgress",
    "Record",
    "RecordChecker",
    "SessionEventConsumer",
    "TopicCheck",
    "TopicPolicy",
    "Watermarks",
    "check_kafka_access",
    "archive_progress",
    "consumed_record",
    "dlq_topic",
    "fetch_records",
    "read_partition_span",
    "index_topic",
    "inspect_topics",
    "partition_for",
    "wait_for_topic",
]
