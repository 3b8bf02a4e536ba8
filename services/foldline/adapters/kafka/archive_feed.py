"""What an archiver reads of the Kafka log: committed records as they are, the index, partition bounds.

:class:`ArchiveFeed` is a consumer-group member of the archivers' group on the session-event topic
(``read_committed``, offsets committed only by :meth:`ArchiveFeed.commit`, explicitly per partition). It
hands records over undecoded, as :class:`~foldline.ports.archive.RawEvent`: the Avro body of the event
without its framing, its type and seq read from the body's first two fields, the record's timestamp —
archiving needs no decoding. Lease records (no value) are skipped; a record that does not parse as an
event is skipped too (it is not the log's: the index never names it).

Which records are the log's is the index's answer: :meth:`ArchiveFeed.offsets` gives each session's
offsets by seq from ``<topic>.index``, so an archiver archives a record only where the index names it
(a foreign record on the topic, an event of a fenced writer, is never archived). :meth:`ArchiveFeed.fetch`
reads a session's records by those offsets, for the part of a session an archiver did not meet in the
stream. :meth:`ArchiveFeed.bounds` and :meth:`ArchiveFeed.committed` are what ``foldline doctor`` and the
archiver compare to tell whether Kafka deleted anything not archived.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from ...errors import ConfigError, FormatError, StoreUnavailable
from ...ports.archive import RawEvent
from ..archive.segments import SegmentEncoder, event_head
from ..avro import SINGLE_OBJECT_MAGIC, AvroCodec
from .clients import KafkaClients, client_settings
from .reader import SessionReader, Watermarks
from .records import CONSUMER_FETCH_SIZES, Record, index_topic
from .retention import TopicCheck, TopicPolicy, enforce
from .topics import inspect_topics, wait_for_topic

__all__ = ["ArchiveFeed", "PartitionProgress", "archive_progress"]

_LOG = logging.getLogger("foldline.archiver")
_MAX_NAMES = 100_000  # session ids kept decoded by their key bytes (cleared past this)


class ArchiveFeed:
    """The archivers' consumer and index reader on one log topic; see the module docstring. Not thread-safe
    for :meth:`poll` / :meth:`commit` (one thread); :meth:`offsets` and :meth:`fetch` may run on others."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        topic: str,
        partitions: int,
        timeout_s: float = 10.0,
        registry_url: str | None = None,
        client_config: Mapping[str, Any] | None = None,
        on_assigned: Callable[[set[int]], None] | None = None,
        on_revoked: Callable[[set[int]], None] | None = None,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self._bootstrap = bootstrap
        self._client_config = client_config
        self.codec = AvroCodec(registry_url=registry_url, subject=f"{topic}-value")
        self._encoder = SegmentEncoder()
        self.fingerprint = self._encoder.fingerprint
        self._names: dict[bytes, str] = {}
        self._clients = KafkaClients(bootstrap, timeout_s=timeout_s, client_config=client_config)
        self._reader = SessionReader(
            self._clients, topic=topic, index_topic=index_topic(topic), partitions=partitions, decode=self.codec.decode
        )
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        try:
            self._consumer = Consumer(
                client_settings(
                    bootstrap,
                    client_config,
                    {
                        "group.id": group,
                        **CONSUMER_FETCH_SIZES,
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                        "auto.offset.reset": "earliest",
                        "session.timeout.ms": 6000,
                    },
                )
            )
            self._consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)
        except KafkaException as exc:
            raise ConfigError(f"cannot start the archivers' consumer of {topic}: {exc}") from exc

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._on_assigned is not None:
            self._on_assigned({tp.partition for tp in partitions})

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._on_revoked is not None:
            self._on_revoked({tp.partition for tp in partitions})

    # -------------------------------------------------------------- the topic

    def wait_for_topic(self, *, stopped: Callable[[], bool], pause: Callable[[float], object]) -> None:
        """Block until the topic exists (writers create it) or ``stopped()``."""
        wait_for_topic(self._bootstrap, self.topic, client_config=self._client_config, stopped=stopped, pause=pause)

    def check_topics(self, policy: TopicPolicy) -> list[TopicCheck]:
        """The log's topics checked against ``policy``; the first failure raised (:mod:`.retention`)."""
        checks = inspect_topics(self._clients, self.topic, partitions=self.partitions, policy=policy)
        enforce(checks)
        return checks

    # -------------------------------------------------------------- the stream

    def poll(self, max_records: int = 5000, timeout_s: float = 0.1) -> tuple[list[RawEvent], dict[int, int]]:
        """The next events, and per partition the offset after the last record polled."""
        try:
            messages = self._consumer.consume(max_records, timeout=timeout_s)
        except KafkaException as exc:
            raise StoreUnavailable(f"consuming {self.topic} failed: {exc}") from exc
        events: list[RawEvent] = []
        ends: dict[int, int] = {}
        fingerprint = self.fingerprint
        prefix = SINGLE_OBJECT_MAGIC + fingerprint
        head = event_head
        names = self._names
        if len(names) > _MAX_NAMES:
            names.clear()
        append = events.append
        raw = tuple.__new__  # RawEvent's own __new__ is a Python frame: ~80 ns an event here
        for msg in messages:  # the hot loop of an archiver: one pass, no decoding
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise StoreUnavailable(f"consuming {self.topic} failed: {err}")
            part, off = msg.partition(), msg.offset()
            if part is None or off is None:
                continue
            ends[part] = off + 1
            value = msg.value()
            key = msg.key()
            if value is None or key is None:  # a lease record, or not ours
                continue
            if value.startswith(prefix):  # the current schema, single-object encoding: archived as it is
                body = value[10:]
                try:
                    kind, seq = head(body)
                except ValueError:
                    continue
                session_id = names.get(key)
                if session_id is None:
                    session_id = names[key] = key.decode(errors="replace")
                append(raw(RawEvent, (session_id, seq, kind, msg.timestamp()[1], body, fingerprint, part, off)))
            else:
                event = self._event(msg, part, off)
                if event is not None:
                    append(event)
        return events, ends

    def _event(self, msg: Record, part: int, off: int) -> RawEvent | None:
        """Any framing or schema version: a value not in the current schema is decoded and re-encoded."""
        value = msg.value()
        key = msg.key()
        if value is None or key is None:
            return None
        try:
            fingerprint, body = self.codec.split(value)
            if fingerprint != self.fingerprint:
                env = self.codec.decode(value)
                fingerprint, body = self.fingerprint, self._encoder.body(env)
            kind, seq = event_head(body)
        except (FormatError, ValueError) as exc:
            _LOG.debug("%s[%d]@%d is not an event record (%s); not archived", self.topic, part, off, exc)
            return None
        return RawEvent(key.decode(errors="replace"), seq, kind, msg.timestamp()[1], body, fingerprint, part, off)

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit ``offsets`` (partition → the next offset to read after a restart)."""
        if not offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())], asynchronous=False
            )
        except KafkaException as exc:
            raise StoreUnavailable(f"committing the archivers' offsets failed: {exc}") from exc

    def assignment(self) -> set[int]:
        try:
            return {tp.partition for tp in self._consumer.assignment()}
        except KafkaException as exc:
            raise StoreUnavailable(f"reading the archivers' assignment failed: {exc}") from exc

    # -------------------------------------------------------------- the index and positions

    def offsets(self, session_ids: Sequence[str]) -> dict[str, list[int]]:
        """Each session's record offsets by seq, as the index names them."""
        states = self._reader.states(session_ids, self._clients.deadline())
        return {sid: state.offsets for sid, state in states.items()}

    def fetch(self, session_id: str, from_seq: int, to_seq: int) -> list[RawEvent]:
        """The session's events ``from_seq`` up to ``to_seq``, read by the offsets the index names.

        Raises :class:`~foldline.errors.EventsExpired` when Kafka deleted one of them.
        """
        deadline = self._clients.deadline()
        state = self._reader.state(session_id, deadline)
        out: list[RawEvent] = []
        for seq, msg in enumerate(self._reader.records(session_id, state, from_seq, to_seq, deadline), start=from_seq):
            part, off = msg.partition(), msg.offset()
            event = self._event(msg, part if part is not None else -1, off if off is not None else -1)
            if event is None or event.seq != seq:
                raise FormatError("kafka-index", f"session {session_id!r}: the index names offset {off} for seq {seq}")
            out.append(event)
        return out

    def bounds(self, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """``(log start offset, high watermark)`` of each partition."""
        deadline = self._clients.deadline()
        return {p: self._reader.watermarks.bounds(self.topic, p, deadline) for p in partitions}

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        """The archivers' committed offset of each partition (partitions never committed are left out)."""
        try:
            found = self._consumer.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=self._clients.timeout_s
            )
        except KafkaException as exc:
            raise StoreUnavailable(f"reading the archivers' committed offsets failed: {exc}") from exc
        return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}

    def close(self) -> None:
        failures: list[Exception] = []
        for close in (self._consumer.close, self._reader.close):
            try:
                close()
            except (KafkaException, StoreUnavailable) as exc:
                failures.append(exc)
        if failures:
            raise StoreUnavailable(f"closing the archivers' Kafka clients failed: {failures[0]}") from failures[0]


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """How far the archivers' group got in one partition, against what Kafka still holds."""

    partition: int
    low: int  # log start offset: records below it were deleted
    high: int  # high watermark
    committed: int | None  # the group's committed offset (None: never committed)

    @property
    def deleted_unarchived(self) -> int:
        """Records Kafka deleted before the group committed past them (0 when none)."""
        return max(0, self.low - self.committed) if self.committed is not None else 0

    @property
    def behind(self) -> int:
        """Offsets the group has not committed past yet (records, leases and transaction markers)."""
        return self.high - (self.committed if self.committed is not None else self.low)


def archive_progress(clients: KafkaClients, group: str, topic: str, partitions: int) -> list[PartitionProgress]:
    """Each partition's bounds and the archivers' committed offset, asked without joining the group."""
    admin = clients.admin()
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])]
    try:
        found = admin.list_consumer_group_offsets(request, request_timeout=clients.timeout_s)[group].result(
            timeout=clients.timeout_s
        )
    except (KafkaException, TimeoutError) as exc:
        raise clients.not_answering(exc) from exc
    committed = {tp.partition: tp.offset for tp in found.topic_partitions or [] if tp.error is None and tp.offset >= 0}
    watermarks = Watermarks(clients)
    try:
        deadline = clients.deadline()
        return [
            PartitionProgress(p, *watermarks.bounds(topic, p, deadline), committed.get(p)) for p in range(partitions)
        ]
    finally:
        watermarks.close()
