"""Consuming the session-event topic (projectors, tools): decode, check, dead-letter what cannot apply.

:class:`SessionEventConsumer` is a group consumer with ``isolation.level=read_committed`` (records of
aborted or fenced transactions are never delivered). Each record comes back as a typed item:

* :class:`~.records.ConsumedEvent` — a decoded envelope that passed the checks;
* :class:`~.records.ConsumedLease` — a writer acquired the session (its epoch);
* :class:`~.records.DeadLetter` — a record that cannot be applied, with the typed foldline error. It has
  already been copied to the dead-letter topic (``<topic>.dlq``) with the reason in its headers before
  ``poll`` returns, so nothing is dropped silently, and consumption goes on.

The checks and the dead-letter records are those of :mod:`.dead_letters` (docs/KAFKA.md, "What a
consumer must check"). Offsets are committed only by :meth:`SessionEventConsumer.commit`, after the
caller applied the items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ...errors import StoreUnavailable
from ...ports.event_log import EventLog
from ..avro import AvroCodec
from .clients import client_settings, consume_ready
from .dead_letters import DeadLetterWriter, RecordChecker
from .records import CONSUMER_FETCH_SIZES, ConsumedItem, dlq_topic

__all__ = ["SessionEventConsumer"]


class SessionEventConsumer:
    """A consumer-group member reading session events; see the module docstring.

    ``on_assign``/``on_revoke`` are librdkafka's rebalance callbacks as they are; ``on_assigned`` and
    ``on_revoked`` get the partition numbers only. ``dead_letters`` shares a writer the caller owns
    (and closes); without it the consumer opens its own.
    """

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        *,
        topic: str,
        codec: AvroCodec | None = None,
        registry_url: str | None = None,
        log: EventLog | None = None,
        timeout_s: float = 10.0,
        client_config: Mapping[str, Any] | None = None,
        on_assign: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        max_sessions: int = 10_000,
        on_assigned: Callable[[set[int]], None] | None = None,
        on_revoked: Callable[[set[int]], None] | None = None,
        dead_letters: DeadLetterWriter | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.topic = topic
        self.dlq_topic = dlq_topic(topic)
        self.timeout_s = timeout_s
        self._owns_dead_letters = dead_letters is None
        if dead_letters is None:
            dead_letters = DeadLetterWriter(bootstrap, self.dlq_topic, timeout_s=timeout_s, client_config=client_config)
        self._checker = RecordChecker(
            dead_letters, topic=topic, codec=codec, registry_url=registry_url, log=log, max_sessions=max_sessions
        )
        try:
            self._consumer = Consumer(
                client_settings(
                    bootstrap,
                    client_config,
                    {
                        "group.id": group_id,
                        **CONSUMER_FETCH_SIZES,
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "auto.offset.reset": "earliest",
                        "session.timeout.ms": 6000,
                        # a member learns that the group rebalances (another joined or left) at its next
                        # heartbeat, and the group waits for every member to rejoin: at librdkafka's 3 s default
                        # a projector joining a fleet under load stalled the folds ~4 s at p99
                        "heartbeat.interval.ms": 500,
                        # a commit (its marker moves the last stable offset) answers a held fetch at once, so
                        # the wait bounds only empty fetches: the broker answers ~2 per second per consumer
                        # while nothing is written, not 100 (a 10 ms wait cost the broker ~3 ms of CPU per
                        # step of a small fleet, and no latency)
                        "fetch.wait.max.ms": 500,
                    },
                )
            )
            callbacks: dict[str, Any] = {}
            if on_assign is not None or on_assigned is not None:
                callbacks["on_assign"] = _rebalance_callback(on_assign, on_assigned)
            if on_revoke is not None or on_revoked is not None:
                callbacks["on_revoke"] = _rebalance_callback(on_revoke, on_revoked)
            self._consumer.subscribe([topic], **callbacks)
        except KafkaException as exc:
            if self._owns_dead_letters:
                dead_letters.close()
            raise StoreUnavailable(f"cannot start a consumer for {topic}: {exc}") from exc

    @property
    def codec(self) -> AvroCodec:
        return self._checker.codec

    @property
    def max_sessions(self) -> int:
        return self._checker.max_sessions

    @property
    def tracked_sessions(self) -> int:
        """How many sessions' rule state this consumer holds (at most ``max_sessions`` when it has a log)."""
        return self._checker.tracked_sessions

    def positions(self, partitions: Iterable[int]) -> dict[int, int]:
        """The next offset this consumer will fetch per assigned partition (past any transaction markers).

        After the last committed transaction of a partition is consumed this equals the high watermark,
        whereas ``last consumed offset + 1`` stays one short (the commit marker takes an offset).
        Partitions without a known position are left out.
        """
        try:
            found = self._consumer.position([TopicPartition(self.topic, p) for p in partitions])
        except KafkaException:
            return {}
        return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedItem]:
        """The next records as typed items; dead letters are durably in the DLQ topic when this returns."""
        try:
            messages = consume_ready(self._consumer, max_records, timeout_s)
        except KafkaException as exc:
            raise StoreUnavailable(f"consuming {self.topic} failed: {exc}") from exc
        records = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise StoreUnavailable(f"consuming {self.topic} failed: {err}")
            records.append(msg)
        return self._checker.check(records)

    def commit(self) -> None:
        """Commit the offsets of everything :meth:`poll` returned (call after applying them)."""
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET:
                return
            raise StoreUnavailable(f"committing consumer offsets failed: {exc}") from exc

    def close(self) -> None:
        """Leave the group (and flush and close the dead-letter writer this consumer opened)."""
        self._checker.close()
        try:
            if self._owns_dead_letters:
                self._checker.dead_letters.close()
        finally:
            try:
                self._consumer.close()
            except KafkaException as exc:
                raise StoreUnavailable(f"closing the consumer of {self.topic} failed: {exc}") from exc


def _rebalance_callback(
    raw: Callable[[Consumer, list[TopicPartition]], None] | None, numbers: Callable[[set[int]], None] | None
) -> Callable[[Consumer, list[TopicPartition]], None]:
    def callback(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if raw is not None:
            raw(consumer, partitions)
        if numbers is not None:
            numbers({tp.partition for tp in partitions})

    return callback
