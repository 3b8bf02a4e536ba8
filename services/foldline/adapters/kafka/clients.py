"""The librdkafka clients the Kafka log opens, and how their failures map onto :mod:`foldline.errors`.

:class:`KafkaClients` holds the settings every client of one :class:`~.log.KafkaEventLog` shares (bootstrap,
the bound on broker waits, extra librdkafka settings) and builds its transactional producers, reading
consumers and admin client; invalid settings become :class:`~foldline.errors.ConfigError`, a broker that
does not answer :class:`~foldline.errors.StoreUnavailable`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from ...errors import ConfigError, StoreUnavailable
from .records import CONSUMER_FETCH_SIZES, MAX_MESSAGE_BYTES

__all__ = [
    "FENCED_CODES",
    "GROUP_PRODUCER",
    "SESSION_PRODUCER",
    "TRANSIENT_CODES",
    "KafkaClients",
    "RDKAFKA_LOG",
    "LibrdkafkaLog",
    "client_settings",
    "consume_ready",
    "flush",
    "kafka_error",
]

LOG = logging.getLogger("foldline.kafka")
# a broker stopped or restarting: librdkafka reports a partition it has no fresh metadata for as unknown
# (``_UNKNOWN_PARTITION``) and a lost connection as ``_TRANSPORT``/``_ALL_BROKERS_DOWN`` until it reconnects;
# callers retry these until their deadline, whose error then names the code
TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
    }
)
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# the group writer produces a whole group's records at once and then waits for their acknowledgements, so
# lingering would only delay them (librdkafka's default is 5 ms; the records of one group still go out in few
# requests); it keeps many records in flight. Take-over and fencing producers send one small transaction each
GROUP_PRODUCER: Mapping[str, Any] = {
    "linger.ms": 0,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 1_000_000,
}
SESSION_PRODUCER: Mapping[str, Any] = {"linger.ms": 0}


class LibrdkafkaLog:
    """librdkafka's log lines (the clients' ``logger``) to a Python logger, each at its own level — except
    the lines of a producer fenced by a newer instance with its transactional id, logged at INFO.

    Fencing is how a take-over stops the previous writer (docs/KAFKA.md): the fenced producer's
    librdkafka reports it as a fatal error (``TXNERR``/``FATAL`` lines), while what it means reaches the
    callers as a typed outcome (the append is retried under the new writer). Every other fatal error is
    still logged as librdkafka rates it.
    """

    #: librdkafka's texts of the errors in :data:`FENCED_CODES`
    FENCED_TEXTS = tuple(KafkaError(code).str() for code in sorted(FENCED_CODES))

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: object) -> None:
        if level > logging.INFO:
            line = msg % args if args else msg
            if any(text in line for text in self.FENCED_TEXTS):
                level = logging.INFO
        self.logger.log(level, msg, *args)


RDKAFKA_LOG = LibrdkafkaLog(LOG)


def client_settings(
    bootstrap: str, client_config: Mapping[str, Any] | None, fixed: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """librdkafka settings of one client: the bootstrap, its log lines to Python logging, the caller's
    extra settings (security, tuning), then the ``fixed`` ones the client needs to work as it does."""
    return {"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG, **(client_config or {}), **(fixed or {})}


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, if any."""
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def consume_ready(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Up to ``max_records`` records: waits (at most ``timeout_s``) for the first only, then takes what the
    consumer already fetched without waiting.

    ``Consumer.consume(n, timeout)`` waits until it has ``n`` records or the timeout passed, so a tailing
    consumer that asks for a batch waited the whole timeout for every record that came alone — a record
    committed while nothing else arrived sat in the client for up to the timeout before its caller saw it.
    Batches still form: the second call takes every record that arrived while the caller worked."""
    first = consumer.consume(1, timeout=timeout_s)
    if not first or max_records <= 1:
        return first
    return first + consumer.consume(max_records - 1, timeout=0)


def flush(producer: Producer, timeout: float) -> int:
    """``producer.flush``, with a fatal producer error raised as the KafkaException it is.

    (confluent-kafka raises a fatal error from inside the delivery-report dispatch, which surfaces
    as a ``SystemError`` chained to the ``KafkaException``.)
    """
    try:
        return int(producer.flush(timeout))
    except SystemError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KafkaException):
            raise cause from None
        raise


def discard(producer: Producer | None, what: str) -> None:
    """Drop a producer that is no longer used (``flush(0)``: nothing waits for its queue)."""
    if producer is None:
        return
    try:
        flush(producer, 0)
    except KafkaException as exc:
        LOG.debug("discarding %s: %s", what, exc)


class KafkaClients:
    """Settings shared by every client of one log, the deadlines of its calls, and its client factories."""

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float = 10.0,
        client_config: Mapping[str, Any] | None = None,
        transaction_timeout_ms: int = 5_000,
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.transaction_timeout_ms = transaction_timeout_ms
        self.base: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout_s * 1000)),
            "socket.nagle.disable": True,
            # librdkafka's own log lines go to Python logging (an expected fence at INFO: LibrdkafkaLog);
            # every failure reaches callers as a typed exception instead.
            "logger": RDKAFKA_LOG,
            **(client_config or {}),
        }

    # -------------------------------------------------------------- deadlines and errors

    def deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailable(f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:g}s")
        return left

    def unavailable(self, what: str, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"Kafka at {self.bootstrap} failed while {what}: {exc}")

    # -------------------------------------------------------------- clients

    def transactional_producer(self, transactional_id: str, extra: Mapping[str, Any]) -> Producer:
        try:
            return Producer(
                {
                    **self.base,
                    "transactional.id": transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "retry.backoff.ms": 2,
                    "retry.backoff.max.ms": 5,
                    # connect to the brokers at once: with sparse connections the coordinator lookup of
                    # init_transactions waited for the learned broker's connection (a reconnect backoff,
                    # 50 ms) or for librdkafka's 500 ms coordinator-query timer; 2 ms this way
                    "enable.sparse.connections": False,
                    "transaction.timeout.ms": self.transaction_timeout_ms,
                    "message.max.bytes": MAX_MESSAGE_BYTES,
                    "message.timeout.ms": min(self.transaction_timeout_ms, max(1000, int(self.timeout_s * 1000))),
                    **extra,
                }
            )
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka producer configuration: {exc}") from exc

    def fence(self, writer_id: str, deadline: float) -> None:
        """Fence the producer ``writer_id``: its open transaction is aborted, its later sends rejected."""
        producer = self.transactional_producer(writer_id, SESSION_PRODUCER)
        try:
            producer.init_transactions(self.remaining(deadline))
        except KafkaException as exc:
            raise self.unavailable(f"fencing the previous writer {writer_id}", exc) from exc
        finally:
            discard(producer, f"the fencing producer of {writer_id}")

    def reading_consumer(self, *, committed_only: bool) -> Consumer:
        """A consumer that never joins its group (only ``assign()`` is used) and reads partitions to their end.

        ``committed_only=False`` is for high watermarks only, which must count records of transactions
        that are committed but whose markers are not written yet; everything else reads committed
        records only.
        """
        try:
            return Consumer(
                {
                    **self.base,
                    "group.id": f"foldline-reader-{uuid.uuid4().hex}",
                    **CONSUMER_FETCH_SIZES,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed" if committed_only else "read_uncommitted",
                    "enable.partition.eof": True,
                    # a read ends at the partition's end: the broker's answer that nothing follows the last
                    # record (and its transaction marker) should not wait long
                    "fetch.wait.max.ms": 1,
                    "auto.offset.reset": "earliest",
                }
            )
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka consumer configuration: {exc}") from exc

    def following_consumer(self) -> Consumer:
        """A committed-records consumer that tails partitions (assign only): the broker holds an empty fetch up
        to 500 ms and answers it as soon as a commit lands (its marker moves the last stable offset), so
        following adds no latency and costs ~2 fetches per second while nothing is written."""
        try:
            return Consumer(
                {
                    **self.base,
                    "group.id": f"foldline-follower-{uuid.uuid4().hex}",
                    **CONSUMER_FETCH_SIZES,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": False,
                    "fetch.wait.max.ms": 500,
                    "auto.offset.reset": "latest",
                }
            )
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka consumer configuration: {exc}") from exc

    def admin(self) -> AdminClient:
        try:
            return AdminClient(self.base)
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka admin client configuration: {exc}") from exc

    def not_answering(self, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(
            f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:g}s ({exc}); is the broker up? "
            "(deploy/local/up.sh kafka starts the local one)"
        )
