"""The Kafka event log: Avro session events on a partitioned topic, one fenced writer per session.

Layout (docs/KAFKA.md has the full argument):

* ``<topic>`` (default ``foldline.session-events``, 12 partitions): one record per event, key = session
  id, value = the self-describing Avro envelope (:mod:`foldline.adapters.avro`), headers
  ``fl-kind=event``, ``fl-epoch``, ``fl-batch``. ``acquire`` writes a ``fl-kind=lease`` record (no value).
* ``<topic>.index`` (compacted, same partition count, same partition per session): the latest entry
  per session — epoch, next seq, the data offsets of every event, and the batch the entry was committed
  with (``pending``: id, count and a lower bound of its offsets).
* ``<topic>.dlq``: records a consumer could not apply, with the reason in headers
  (:mod:`foldline.adapters.kafka_consumer`).

**Atomicity.** An append is one Kafka transaction holding its event records *and* the session's index
record; readers use ``read_committed``. The transaction commits, or none of it is ever visible.

**One writer per session.** Every session has its own ``transactional.id`` (``<topic>:<session>``).
``init_transactions`` by a new writer makes the transaction coordinator abort the previous writer's open
transaction and fence its producer: a stale writer can never commit again. On top of Kafka's producer
epoch, foldline's lease epoch (counted in the index) decides who may write: an append carrying an older
lease gets :class:`~foldline.errors.FencedError` and sends nothing. A writer that is the rightful lease
holder but whose producer was fenced by someone else's ``init_transactions`` re-initializes, re-reads the
session and retries.

**Reading one session** costs the session's size: the index partition is tailed (one small entry per
session after compaction), then exactly the listed offsets are fetched; only the latest batch's offsets
are found by a scan from a lower bound taken just before it was produced.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ..core import codec as canonical
from ..core.events import Envelope
from ..errors import ConfigError, ConflictError, FencedError, FormatError, StoreUnavailable
from ..ports.event_log import EventLog, RulesCache, WriterLease
from .avro import AvroCodec

__all__ = [
    "DEFAULT_TOPIC",
    "HEADER_BATCH",
    "HEADER_EPOCH",
    "HEADER_KIND",
    "KafkaEventLog",
    "dlq_topic",
    "index_topic",
    "partition_for",
]

_LOG = logging.getLogger("foldline.kafka")
DEFAULT_TOPIC = "foldline.session-events"
HEADER_KIND = "fl-kind"
HEADER_EPOCH = "fl-epoch"
HEADER_BATCH = "fl-batch"
KIND_EVENT = b"event"
KIND_LEASE = b"lease"
_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
_GAP_TO_SEEK = 256  # consume through gaps smaller than this many offsets instead of re-assigning
_TRANSIENT = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


def index_topic(topic: str) -> str:
    return topic + ".index"


def dlq_topic(topic: str) -> str:
    return topic + ".dlq"


def _murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner), so every client agrees on partitions."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = data[length - rest :]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for(session_id: str, partitions: int) -> int:
    """The partition of a session: Java-compatible ``toPositive(murmur2(key)) % partitions``."""
    return (_murmur2(session_id.encode()) & 0x7FFFFFFF) % partitions


def _error(exc: KafkaException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def _header(msg: Message, name: str) -> bytes | None:
    headers = msg.headers()
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == name:
            return value if isinstance(value, bytes) else None
    return None


# ---------------------------------------------------------------- index entries


@dataclass(slots=True)
class _Pending:
    batch: str
    min_offset: int
    count: int


@dataclass(slots=True)
class _State:
    """What is known of one session: epoch, head and the data offset of every event (by seq)."""

    epoch: int = 0
    offsets: list[int] = field(default_factory=list)
    pending: _Pending | None = None

    @property
    def next_seq(self) -> int:
        return len(self.offsets) + (self.pending.count if self.pending else 0)


def _runs(offsets: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for off in offsets:
        if runs and runs[-1][0] + runs[-1][1] == off:
            runs[-1][1] += 1
        else:
            runs.append([off, 1])
    return runs


def _encode_index(state: _State) -> bytes:
    pending = state.pending
    return canonical.canonical_json(
        {
            "v": 1,
            "epoch": state.epoch,
            "nextSeq": state.next_seq,
            "offsets": _runs(state.offsets),
            "pending": None
            if pending is None
            else {"batch": pending.batch, "minOffset": pending.min_offset, "count": pending.count},
        }
    )


def _decode_index(raw: bytes) -> _State:
    try:
        value = canonical.loads(raw)
        offsets = [start + i for start, count in value["offsets"] for i in range(count)]
        p = value["pending"]
        pending = None if p is None else _Pending(str(p["batch"]), int(p["minOffset"]), int(p["count"]))
        state = _State(int(value["epoch"]), offsets, pending)
        if state.next_seq != value["nextSeq"]:
            raise ValueError("nextSeq disagrees with the offsets")
        return state
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError("kafka-index", f"malformed session index entry: {exc}") from exc


# ---------------------------------------------------------------- the adapter


@dataclass(slots=True)
class _Writer:
    producer: Producer
    state: _State | None = None  # exact while this producer has not been fenced


class KafkaEventLog(EventLog):
    """:class:`~foldline.ports.event_log.EventLog` on Kafka; see the module docstring and docs/KAFKA.md.

    ``timeout_s`` bounds every broker wait of one call (metadata, transaction init/commit, reads): a
    broker that does not answer makes the call fail with :class:`~foldline.errors.StoreUnavailable`.
    """

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:19092",
        *,
        topic: str = DEFAULT_TOPIC,
        partitions: int = 12,
        replication_factor: int = 1,
        timeout_s: float = 10.0,
        registry_url: str | None = None,
        codec: AvroCodec | None = None,
        transaction_timeout_ms: int = 5_000,
        max_writers: int = 256,
        create_topics: bool = True,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        if partitions < 1:
            raise ConfigError("partitions must be >= 1")
        self.bootstrap = bootstrap
        self.topic = topic
        self.index_topic = index_topic(topic)
        self.dlq_topic = dlq_topic(topic)
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.timeout_s = timeout_s
        self.codec = codec or AvroCodec(registry_url=registry_url, subject=f"{topic}-value")
        self._transaction_timeout_ms = transaction_timeout_ms
        self._max_writers = max_writers
        self._create_topics = create_topics
        self._base: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout_s * 1000)),
            # librdkafka's own log lines (e.g. "fenced by a newer instance") go to Python logging;
            # every failure reaches callers as a typed exception instead.
            "logger": _LOG,
            **(client_config or {}),
        }
        self._lock = threading.RLock()
        self._ready = False
        self._closed = False
        self._writers: OrderedDict[str, _Writer] = OrderedDict()
        self._index: dict[str, _State] = {}
        self._index_pos: dict[int, int] = {}
        self._batches: OrderedDict[str, list[int]] = OrderedDict()  # offsets of batches this instance wrote
        self._consumers: dict[str, Consumer] = {}
        self._rules = RulesCache(self._read_all)

    # -------------------------------------------------------------- EventLog

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if not events:
            return self.head(session_id)
        with self._lock:
            self._ensure_ready()
            deadline = time.monotonic() + self.timeout_s
            fresh = False
            while True:
                writer = self._writer(session_id, deadline)
                fresh = fresh or writer.state is None
                state = writer.state or self._load_state(session_id, deadline)
                writer.state = state
                if (lease is not None and lease.epoch != state.epoch) or expected_seq != state.next_seq:
                    if not fresh:
                        # The cached state may predate another instance's writes (which also fenced this
                        # producer): re-initialize, which resolves every earlier transaction, and re-read.
                        self._drop_writer(session_id)
                        fresh = True
                        continue
                    if lease is not None and lease.epoch != state.epoch:
                        raise FencedError(session_id, lease.epoch, state.epoch)
                    raise ConflictError(session_id, expected_seq, state.next_seq)
                rules = self._rules.get(session_id, state.next_seq)
                rules.check_batch(events)  # raises ValidationError: nothing sent
                try:
                    self._commit(
                        session_id, writer=writer, state=state, events=events, new_epoch=None, deadline=deadline
                    )
                except _ProducerFenced:
                    # Someone ran init_transactions for this session after us. Re-init (which fences
                    # them in turn), re-read and decide again: a newer lease makes this a FencedError.
                    self._rules.forget(session_id)
                    self._drop_writer(session_id)
                    fresh = True
                    continue
                except BaseException:
                    self._rules.forget(session_id)
                    raise
                return state.next_seq

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        with self._lock:
            self._ensure_ready()
            deadline = time.monotonic() + self.timeout_s
            state = self._load_state(session_id, deadline)
            end = state.next_seq if to_seq is None else min(to_seq, state.next_seq)
            if from_seq >= end:
                return []
            return self._fetch(session_id, state, max(from_seq, 0), end, deadline)

    def head(self, session_id: str) -> int:
        with self._lock:
            self._ensure_ready()
            return self._load_state(session_id, time.monotonic() + self.timeout_s).next_seq

    def sessions(self) -> list[str]:
        with self._lock:
            self._ensure_ready()
            deadline = time.monotonic() + self.timeout_s
            for p in range(self.partitions):
                self._catch_up_index(p, deadline)
            return sorted(s for s, st in self._index.items() if st.next_seq > 0)

    def acquire(self, session_id: str) -> WriterLease:
        with self._lock:
            self._ensure_ready()
            deadline = time.monotonic() + self.timeout_s
            while True:
                writer = self._writer(session_id, deadline)
                # always re-read: the new epoch must count every earlier lease, other instances' too
                state = writer.state = self._load_state(session_id, deadline)
                try:
                    self._commit(
                        session_id, writer=writer, state=state, events=(), new_epoch=state.epoch + 1, deadline=deadline
                    )
                except _ProducerFenced:
                    self._drop_writer(session_id)
                    continue
                return WriterLease(session_id, state.epoch)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for sid in list(self._writers):
                self._drop_writer(sid)
            for consumer in self._consumers.values():
                consumer.close()

    # -------------------------------------------------------------- topics

    def _ensure_ready(self) -> None:
        if self._closed:
            raise StoreUnavailable("this KafkaEventLog is closed")
        if self._ready:
            return
        admin = AdminClient(self._base)
        try:
            md = admin.list_topics(timeout=self.timeout_s)
            wanted = {
                self.topic: {"max.message.bytes": str(_MAX_MESSAGE_BYTES)},
                self.index_topic: {"cleanup.policy": "compact", "max.message.bytes": str(_MAX_MESSAGE_BYTES)},
                self.dlq_topic: {"max.message.bytes": str(_MAX_MESSAGE_BYTES)},
            }
            missing = [t for t in wanted if t not in md.topics]
            if missing and not self._create_topics:
                raise ConfigError(f"Kafka topics {missing} do not exist and create_topics is off")
            if missing:
                futures = admin.create_topics(
                    [NewTopic(t, self.partitions, self.replication_factor, config=wanted[t]) for t in missing],
                    request_timeout=self.timeout_s,
                )
                for fut in futures.values():
                    try:
                        fut.result(timeout=self.timeout_s)
                    except KafkaException as exc:
                        err = _error(exc)
                        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            raise
                deadline = time.monotonic() + self.timeout_s
                while True:  # new topics take a moment to appear in metadata
                    md = admin.list_topics(timeout=self.timeout_s)
                    if all(len(getattr(md.topics.get(t), "partitions", {})) for t in wanted):
                        break
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            for t in (self.topic, self.index_topic):
                meta = md.topics.get(t)
                count = len(meta.partitions) if meta is not None else 0
                if count != self.partitions:
                    raise ConfigError(
                        f"topic {t} has {count} partitions but this log is configured for {self.partitions}; "
                        "sessions would map to the wrong partitions"
                    )
        except KafkaException as exc:
            raise StoreUnavailable(
                f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:g}s ({exc}); is the broker up? "
                "(deploy/local/up.sh kafka starts the local one)"
            ) from exc
        self._ready = True

    # -------------------------------------------------------------- writers

    def _writer(self, session_id: str, deadline: float) -> _Writer:
        writer = self._writers.get(session_id)
        if writer is not None:
            self._writers.move_to_end(session_id)
            return writer
        try:
            producer = self._new_producer(session_id)
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka producer configuration: {exc}") from exc
        try:
            producer.init_transactions(self._remaining(deadline))
        except KafkaException as exc:
            producer.flush(0)
            raise self._unavailable("initializing the session's transactional writer", exc) from exc
        writer = _Writer(producer)
        self._writers[session_id] = writer
        while len(self._writers) > self._max_writers:
            self._drop_writer(next(iter(self._writers)))
        # After init_transactions every earlier writer's transaction is committed or aborted, so the
        # state read next (by the caller) is exact; it stays exact while this producer is not fenced.
        return writer

    def _new_producer(self, session_id: str) -> Producer:
        return Producer(
            {
                **self._base,
                "transactional.id": f"{self.topic}:{session_id}",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                "retry.backoff.ms": 2,
                "transaction.timeout.ms": self._transaction_timeout_ms,
                "message.max.bytes": _MAX_MESSAGE_BYTES,
                "message.timeout.ms": min(self._transaction_timeout_ms, max(1000, int(self.timeout_s * 1000))),
                "queue.buffering.max.messages": 1_000_000,
            }
        )

    def _drop_writer(self, session_id: str) -> None:
        writer = self._writers.pop(session_id, None)
        if writer is not None:
            try:
                writer.producer.flush(0)
            except KafkaException as exc:  # a fenced producer is in a fatal state; it is discarded anyway
                _LOG.debug("discarding the writer of %r: %s", session_id, exc)

    def _commit(
        self,
        session_id: str,
        *,
        writer: _Writer,
        state: _State,
        events: Sequence[Envelope],
        new_epoch: int | None,
        deadline: float,
    ) -> None:
        """One transaction: the events (or a lease record) plus the session's new index entry."""
        producer = writer.producer
        part = partition_for(session_id, self.partitions)
        epoch = state.epoch if new_epoch is None else new_epoch
        batch = uuid.uuid4().hex
        headers_common = [(HEADER_EPOCH, str(epoch).encode()), (HEADER_BATCH, batch.encode())]
        values = [self.codec.encode(e) for e in events]
        low_bound = self._watermark(part, deadline)
        entry = _State(epoch, list(state.offsets), _Pending(batch, low_bound, len(events)) if events else None)
        delivered: dict[int, int] = {}
        failures: list[KafkaError] = []

        def on_delivery(i: int) -> Any:
            def cb(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    failures.append(err)
                else:
                    off = msg.offset()
                    if off is not None:
                        delivered[i] = off

            return cb

        try:
            producer.begin_transaction()
            for i, value in enumerate(values):
                producer.produce(
                    self.topic,
                    value=value,
                    key=session_id,
                    partition=part,
                    headers=[(HEADER_KIND, KIND_EVENT), *headers_common],
                    on_delivery=on_delivery(i),
                )
            if new_epoch is not None:
                producer.produce(
                    self.topic,
                    value=None,
                    key=session_id,
                    partition=part,
                    headers=[(HEADER_KIND, KIND_LEASE), *headers_common],
                )
            producer.produce(self.index_topic, value=_encode_index(entry), key=session_id, partition=part)
            remaining = producer.flush(self._remaining(deadline))
            if remaining or failures:
                raise _Abort(failures[0] if failures else None, "the broker did not acknowledge the batch in time")
            producer.commit_transaction(self._remaining(deadline))
        except _Abort as exc:
            if exc.err is not None and (exc.err.code() in _FENCED_CODES or exc.err.fatal()):
                self._drop_writer(session_id)
                raise _ProducerFenced() from exc
            self._abort(session_id, writer, deadline)
            raise StoreUnavailable(
                f"append to session {session_id!r} was not acknowledged ({exc}); it was aborted and nothing was "
                "written — retry"
            ) from None
        except KafkaException as exc:
            err = _error(exc)
            if err is not None and (err.code() in _FENCED_CODES or err.fatal()):
                self._drop_writer(session_id)
                if err.code() in _FENCED_CODES:
                    raise _ProducerFenced() from exc
                raise self._unavailable("appending (fatal producer error; nothing was written)", exc) from exc
            if err is not None and err.txn_requires_abort():
                self._abort(session_id, writer, deadline)
                raise self._unavailable("appending (aborted; nothing was written)", exc) from exc
            # Timed out or retriable while committing: the outcome is unknown until the next writer's
            # init_transactions resolves it. Drop the producer so the next call re-initializes and re-reads.
            self._drop_writer(session_id)
            raise StoreUnavailable(
                f"Kafka did not confirm the append to session {session_id!r} within {self.timeout_s:g}s ({exc}); "
                "the outcome is unknown — re-read the session head before retrying"
            ) from exc
        except BufferError as exc:
            self._abort(session_id, writer, deadline)
            raise StoreUnavailable(f"the producer queue is full ({exc}); nothing was written — retry") from exc
        if len(delivered) != len(values):
            self._drop_writer(session_id)
            raise StoreUnavailable(f"append to {session_id!r}: missing delivery reports; re-read the head")
        state.epoch = epoch
        state.offsets.extend(delivered[i] for i in range(len(values)))
        state.pending = None
        self._index[session_id] = _State(state.epoch, list(state.offsets), None)
        if values:
            self._batches[batch] = [delivered[i] for i in range(len(values))]
            while len(self._batches) > 4 * self._max_writers:
                self._batches.popitem(last=False)

    def _abort(self, session_id: str, writer: _Writer, deadline: float) -> None:
        try:
            writer.producer.abort_transaction(max(0.5, self._remaining(deadline)))
        except KafkaException:
            self._drop_writer(session_id)  # the next init_transactions aborts it

    # -------------------------------------------------------------- reading

    def _consumer(self, which: str) -> Consumer:
        current = self._consumers.get(which)
        if current is None:
            current = Consumer(
                {
                    **self._base,
                    "group.id": f"foldline-reader-{uuid.uuid4().hex}",  # never joins: only assign() is used
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    # "watermarks" only asks for high watermarks, which must count records of transactions
                    # that are committed but whose markers are not written yet; everything else reads
                    # committed records only.
                    "isolation.level": "read_uncommitted" if which == "watermarks" else "read_committed",
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 10,
                    "auto.offset.reset": "earliest",
                }
            )
            self._consumers[which] = current
        return current

    def _watermark(self, part: int, deadline: float, topic: str | None = None) -> int:
        """The partition's high watermark: every record acknowledged so far lies below it."""
        while True:
            try:
                _low, high = self._consumer("watermarks").get_watermark_offsets(
                    TopicPartition(topic or self.topic, part), timeout=self._remaining(deadline), cached=False
                )
                return int(high)
            except KafkaException as exc:
                err = _error(exc)
                # right after topic creation the partition leader may not be elected yet
                if err is None or not (err.retriable() or err.code() in _TRANSIENT) or time.monotonic() > deadline:
                    raise self._unavailable("reading the partition's end offset", exc) from exc
                time.sleep(0.05)

    def _load_state(self, session_id: str, deadline: float) -> _State:
        """The session's exact state: its latest index entry, with the pending batch's offsets found."""
        part = partition_for(session_id, self.partitions)
        self._catch_up_index(part, deadline)
        state = self._index.get(session_id)
        if state is None:
            return _State()
        if state.pending is not None:
            pending = state.pending
            found = self._batches.get(pending.batch) or self._scan_batch(session_id, part, pending, deadline)
            state = _State(state.epoch, [*state.offsets, *found], None)
            self._index[session_id] = state
        return _State(state.epoch, list(state.offsets), None)

    def _catch_up_index(self, part: int, deadline: float) -> None:
        # Read up to the high watermark taken now (not the last stable offset): an append that returned
        # before this call is then visible, even while its transaction markers are still being written.
        high = self._watermark(part, deadline, self.index_topic)
        pos = self._index_pos.get(part, 0)
        if pos >= high:
            return
        consumer = self._consumer("index")
        for msg in self._consume(consumer, self.index_topic, part, start=pos, end=high, deadline=deadline):
            key = msg.key()
            value = msg.value()
            if key is None or value is None:
                continue
            sid = key.decode()
            entry = _decode_index(value)
            known = self._index.get(sid)
            # entries only grow (epoch, head); never step back to an older one this process already knows
            if known is None or (entry.epoch, entry.next_seq) >= (known.epoch, known.next_seq):
                self._index[sid] = entry
        self._index_pos[part] = high

    def _consume(
        self, consumer: Consumer, topic: str, part: int, *, start: int, end: int, deadline: float
    ) -> Iterable[Message]:
        """Committed records of ``topic[part]`` from ``start`` until the read position reaches ``end``."""
        consumer.assign([TopicPartition(topic, part, start)])
        try:
            while True:
                # consume() waits for the whole batch or the timeout: keep the timeout short
                batch = consumer.consume(1000, timeout=min(0.005, max(0.0, self._remaining(deadline))))
                done = False
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            off = msg.offset()
                            if off is not None and off >= end:
                                done = True
                            continue
                        raise KafkaException(err)
                    off = msg.offset()
                    if off is not None and off >= end:
                        done = True
                        break
                    yield msg
                    if off is not None and off + 1 >= end:
                        done = True
                if done:
                    return
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"reading {topic}[{part}] did not reach offset {end} within {self.timeout_s:g}s "
                        "(broker down, or an unfinished transaction of another writer holds the partition)"
                    )
        except KafkaException as exc:
            raise self._unavailable(f"reading {topic}[{part}]", exc) from exc
        finally:
            consumer.unassign()

    def _scan_batch(self, session_id: str, part: int, pending: _Pending, deadline: float) -> list[int]:
        """Offsets of the ``pending`` batch: scan forward from its lower bound until all its records are seen."""
        consumer = self._consumer("data")
        want = pending.batch.encode()
        found: list[int] = []
        high = self._watermark(part, deadline)
        for msg in self._consume(consumer, self.topic, part, start=pending.min_offset, end=high, deadline=deadline):
            if _header(msg, HEADER_BATCH) == want and _header(msg, HEADER_KIND) == KIND_EVENT:
                off = msg.offset()
                assert off is not None
                found.append(off)
                if len(found) == pending.count:
                    return found
        raise FormatError(
            "kafka-index",
            f"session {session_id!r}: the index names batch {pending.batch} ({pending.count} events) after offset "
            f"{pending.min_offset} of partition {part}, but only {len(found)} of its records are there",
        )

    def _fetch(self, session_id: str, state: _State, from_seq: int, to_seq: int, deadline: float) -> list[Envelope]:
        wanted = state.offsets[from_seq:to_seq]
        part = partition_for(session_id, self.partitions)
        by_offset: dict[int, Message] = {}
        consumer = self._consumer("data")
        i = 0
        while i < len(wanted):
            j = i
            while j + 1 < len(wanted) and wanted[j + 1] - wanted[j] <= _GAP_TO_SEEK:
                j += 1
            want = set(wanted[i : j + 1])
            for msg in self._consume(consumer, self.topic, part, start=wanted[i], end=wanted[j] + 1, deadline=deadline):
                off = msg.offset()
                if off in want:
                    by_offset[off] = msg
            i = j + 1
        out: list[Envelope] = []
        for seq, off in enumerate(wanted, start=from_seq):
            found = by_offset.get(off)
            if found is None:
                raise FormatError("kafka-index", f"session {session_id!r}: event seq {seq} is missing at offset {off}")
            msg = found
            key = msg.key()
            if key is None or key.decode() != session_id:
                raise FormatError("kafka-index", f"offset {off} holds another session's record", seq=seq)
            env = self.codec.decode(msg.value())
            if env.seq != seq:
                raise FormatError("seq-gapless", f"offset {off} holds seq {env.seq}", seq=seq)
            out.append(env)
        return out

    def _read_all(self, session_id: str) -> list[Envelope]:
        deadline = time.monotonic() + self.timeout_s
        state = self._load_state(session_id, deadline)
        return self._fetch(session_id, state, 0, state.next_seq, deadline) if state.next_seq else []

    # -------------------------------------------------------------- helpers

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailable(f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:g}s")
        return left

    def _unavailable(self, what: str, exc: KafkaException) -> StoreUnavailable:
        return StoreUnavailable(f"Kafka at {self.bootstrap} failed while {what}: {exc}")


class _ProducerFenced(Exception):
    """Internal: the session's producer was fenced by another ``init_transactions``."""


class _Abort(Exception):
    def __init__(self, err: KafkaError | None, message: str) -> None:
        self.err = err
        super().__init__(f"{message}: {err}" if err is not None else message)
