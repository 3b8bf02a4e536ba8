"""The Kafka inbox store: ``<topic>.inbox``, a compacted topic beside the event topic (docs/KAFKA.md, "The inbox").

One record per entry, on the session's partition (the event topic's partitioner and partition count): key =
session id + ``0xFF`` + entry id (unique per entry, so compaction keeps every live entry), value = the entry's
canonical JSON (docs/FORMAT.md §6), header ``fl-unique`` = its unique key when it has one (an approval
decision's call id). Removing an entry writes its tombstone (no value); compaction then drops both.

* **put** produces the record with an idempotent producer (``acks=all``) and returns once the broker
  acknowledged it: durable. No transaction — an entry is one record — so a ``read_committed`` reader sees it at
  once. With ``unique``, the partition is then read up to that record: if a live entry of the session with the
  same key precedes it, a tombstone for the new record follows and ``put`` answers False. Every reader orders
  records by offset, so two processes racing agree on the one entry that counts (the earlier), and the writer
  of the session, which takes a call's first decision only, agrees with them.
* **entries** reads the session's partition from where this instance last read it to its end (the first read
  from the start: compaction keeps that short) and keeps the live entries of every session met. A partition read
  less than ``refresh_s`` ago answers from memory (plus this instance's own puts and removals, applied at once):
  a step's claim costs no broker call each time, and an entry put by another process joins a claim within
  ``refresh_s``. A put's own entry is always seen by the next ``entries`` of this instance.

The topic is created on first use (compacted, the log's partition count, ``min.insync.replicas`` and
``max.message.bytes`` of its policy) and a topic with another partition count is refused
(:class:`~foldline.errors.ConfigError`): sessions would map to other partitions.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.cimpl import NewTopic

from ...core.inbox import InboxEntry, decode_entry, encode_entry
from ...core.validation import check_session_id
from ...errors import ConfigError, StoreUnavailable
from ...ports.inbox import InboxStore
from .clients import KafkaClients, flush, kafka_error
from .partitioning import partition_for
from .reader import Watermarks, read_partition
from .records import MAX_MESSAGE_BYTES, header, inbox_topic
from .retention import TopicPolicy

__all__ = ["HEADER_UNIQUE", "KafkaInboxStore"]

HEADER_UNIQUE = "fl-unique"
_SEP = b"\xff"


@dataclass(slots=True)
class _Partition:
    """What this instance read of one inbox partition: up to which offset, and the live entries per session."""

    scanned: int = 0
    read_at: float = float("-inf")
    # session → entry id → (offset, unique key, entry bytes)
    live: dict[str, dict[str, tuple[int, str | None, bytes]]] = field(default_factory=dict)
    # entries this instance removed whose tombstone no read has met yet: a read that began before the removal
    # may still bring the entry's record without its tombstone, and must not bring the entry back
    gone: set[tuple[str, str]] = field(default_factory=set)

    def apply(self, session_id: str, entry_id: str, offset: int, unique: str | None, body: bytes | None) -> None:
        held = self.live.setdefault(session_id, {})
        if body is None:
            held.pop(entry_id, None)
            if not held:
                del self.live[session_id]
        elif entry_id not in held:
            held[entry_id] = (offset, unique, body)


class KafkaInboxStore(InboxStore):
    """The inbox of one Kafka log (see the module docstring). Thread-safe."""

    def __init__(
        self,
        clients: KafkaClients,
        *,
        topic: str,
        partitions: int,
        policy: TopicPolicy,
        create_topic: bool = True,
        refresh_s: float = 0.25,
        read_only: bool = False,
    ) -> None:
        self._clients = clients
        self.topic = inbox_topic(topic)
        self._partitions = partitions
        self._policy = policy
        self._create = create_topic
        self._refresh_s = refresh_s
        self._read_only = read_only
        self._lock = threading.Lock()  # the partition states; held only while they change, never across a broker call
        self._io = threading.Lock()  # the reading consumer and the topic's creation: one read at a time
        self._parts: dict[int, _Partition] = {}
        self._ready = False
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._marks = Watermarks(clients)

    # -------------------------------------------------------------- InboxStore

    @property
    def writable(self) -> bool:
        return not self._read_only

    def put(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        check_session_id(session_id)
        self._writable(f"putting an entry into the inbox of session {session_id!r}")
        part = partition_for(session_id, self._partitions)
        offset = self._produce(session_id, part, entry.id, encode_entry(entry), unique)
        if unique is None:
            with self._lock:
                self._state(part).apply(session_id, entry.id, offset, None, encode_entry(entry))
            return True
        state = self._refresh(part, force=True, until=offset + 1)
        with self._lock:
            first = min(
                ((o, eid) for eid, (o, u, _) in state.live.get(session_id, {}).items() if u == unique),
                default=None,
            )
        if first is None or first[1] == entry.id:
            return True
        self.remove(session_id, [entry.id])  # an earlier entry holds the key: ours never counts
        return False

    def entries(self, session_id: str) -> list[InboxEntry]:
        state = self._refresh(partition_for(session_id, self._partitions), force=False)
        with self._lock:
            held = sorted(state.live.get(session_id, {}).items(), key=lambda item: item[1][0])
        return [decode_entry(body, f"inbox entry {eid!r} of session {session_id!r}") for eid, (_, _, body) in held]

    async def entries_async(self, session_id: str) -> list[InboxEntry]:
        """Answered from memory while the partition was read less than ``refresh_s`` ago, else off the loop."""
        part = partition_for(session_id, self._partitions)
        state = self._parts.get(part)
        if state is not None and time.monotonic() - state.read_at < self._refresh_s:
            return self.entries(session_id)
        return await asyncio.to_thread(self.entries, session_id)

    async def put_async(self, session_id: str, entry: InboxEntry, *, unique: str | None = None) -> bool:
        return await asyncio.to_thread(self.put, session_id, entry, unique=unique)

    async def remove_async(self, session_id: str, entry_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.remove, session_id, entry_ids)

    def remove(self, session_id: str, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        self._writable(f"removing entries from the inbox of session {session_id!r}")
        part = partition_for(session_id, self._partitions)
        producer = self._ensure_producer()
        try:
            for entry_id in entry_ids:
                producer.produce(self.topic, key=_key(session_id, entry_id), value=None, partition=part)
            if flush(producer, self._clients.timeout_s) > 0:
                raise StoreUnavailable(
                    f"Kafka at {self._clients.bootstrap} did not acknowledge the removal of inbox entries of session "
                    f"{session_id!r} within {self._clients.timeout_s:g}s; they stay and are skipped (logged)"
                )
        except KafkaException as exc:
            raise self._clients.unavailable(f"removing inbox entries of session {session_id!r}", exc) from exc
        with self._lock:
            state = self._state(part)
            for entry_id in entry_ids:
                state.apply(session_id, entry_id, -1, None, None)
                state.gone.add((session_id, entry_id))

    def sessions(self) -> list[str]:
        for part in range(self._partitions):
            self._refresh(part, force=True)
        with self._lock:
            return sorted({s for state in self._parts.values() for s in state.live})

    def prime(self) -> None:
        """Read every partition now (the topic created when missing): the claims that follow are answered from
        memory until ``refresh_s`` passes, instead of a new process's first claims each waiting, one after
        another, for their partition's first read (and the first of them for the reading consumer's start)."""
        for part in range(self._partitions):
            self._refresh(part, force=True)

    def close(self) -> None:
        with self._io, self._lock:
            producer, self._producer = self._producer, None
            consumer, self._consumer = self._consumer, None
        if producer is not None:
            flush(producer, self._clients.timeout_s)
        if consumer is not None:
            try:
                consumer.close()
            except KafkaException as exc:
                raise StoreUnavailable(f"closing the inbox consumer failed: {exc}") from exc
        self._marks.close()

    # -------------------------------------------------------------- internals

    def _writable(self, what: str) -> None:
        if self._read_only:
            raise StoreUnavailable(f"the inbox {self.topic} was opened read-only; {what} needs a writable one")

    def _produce(self, session_id: str, part: int, entry_id: str, body: bytes, unique: str | None) -> int:
        producer = self._ensure_producer()
        outcome: list[tuple[KafkaError | None, int | None]] = []

        def delivered(err: KafkaError | None, msg: object) -> None:
            outcome.append((err, getattr(msg, "offset", lambda: None)()))

        headers: list[tuple[str, str | bytes | None]] | None = (
            [(HEADER_UNIQUE, unique.encode())] if unique is not None else None
        )
        try:
            producer.produce(
                self.topic,
                key=_key(session_id, entry_id),
                value=body,
                partition=part,
                headers=headers,
                on_delivery=delivered,
            )
            flush(producer, self._clients.timeout_s)
        except KafkaException as exc:
            raise self._clients.unavailable(f"putting an entry into the inbox of session {session_id!r}", exc) from exc
        if not outcome:
            raise StoreUnavailable(
                f"Kafka at {self._clients.bootstrap} did not acknowledge the inbox entry of session {session_id!r} "
                f"within {self._clients.timeout_s:g}s; it may or may not be stored — put it again (a duplicate of a "
                "decision is refused, a message would be entered twice: check `foldline show` first)"
            )
        err, offset = outcome[0]
        if err is not None or offset is None:
            raise StoreUnavailable(
                f"Kafka at {self._clients.bootstrap} refused the inbox entry of session {session_id!r}: {err}"
            )
        return int(offset)

    def _state(self, part: int) -> _Partition:
        """The partition's state (caller holds ``_lock``)."""
        state = self._parts.get(part)
        if state is None:
            state = self._parts[part] = _Partition()
        return state

    def _refresh(self, part: int, *, force: bool, until: int = 0) -> _Partition:
        """The partition's state, read on from where this instance stopped when due.

        The broker is asked outside ``_lock`` (under ``_io``), so a caller answered from memory — an event loop
        claiming a step's messages — never waits for another thread's broker round trip; what was read is then
        applied under ``_lock`` in one go."""
        with self._lock:
            state = self._state(part)
            if not force and time.monotonic() - state.read_at < self._refresh_s:
                return state
        with self._io:
            now = time.monotonic()
            with self._lock:
                if not force and now - state.read_at < self._refresh_s:
                    return state  # another thread read it while this one waited
                start = state.scanned
            self._ensure_topic()
            deadline = self._clients.deadline()
            end = max(self._marks.high(self.topic, part, deadline), until)
            read: list[tuple[str, str, int, str | None, bytes | None]] = []
            if end > start:
                consumer = self._ensure_consumer()
                for msg in read_partition(
                    self._clients, consumer, self.topic, part, start=start, end=end, deadline=deadline
                ):
                    key, offset = msg.key(), msg.offset()
                    if not key or _SEP not in key or offset is None:
                        continue  # not a record of ours
                    raw_session, raw_entry = key.split(_SEP, 1)
                    unique = header(msg, HEADER_UNIQUE)
                    read.append(
                        (
                            raw_session.decode("utf-8", "replace"),
                            raw_entry.decode("utf-8", "replace"),
                            offset,
                            unique.decode("utf-8", "replace") if unique is not None else None,
                            msg.value(),
                        )
                    )
            with self._lock:
                for session_id, entry_id, offset, unique_key, body in read:
                    if (session_id, entry_id) in state.gone:
                        if body is None:
                            state.gone.discard((session_id, entry_id))  # its tombstone: a later read is safe
                        continue
                    state.apply(session_id, entry_id, offset, unique_key, body)
                state.scanned = max(state.scanned, end)
                state.read_at = now
            return state

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            with self._io:
                self._ensure_topic()
        with self._lock:
            if self._producer is None:
                try:
                    self._producer = Producer(
                        {
                            **self._clients.base,
                            "enable.idempotence": True,
                            "acks": "all",
                            "linger.ms": 0,
                            "message.max.bytes": MAX_MESSAGE_BYTES,
                            "message.timeout.ms": max(1000, int(self._clients.timeout_s * 1000)),
                        }
                    )
                except KafkaException as exc:
                    raise ConfigError(f"invalid Kafka producer configuration: {exc}") from exc
            return self._producer

    def _ensure_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._clients.reading_consumer(committed_only=True)
        return self._consumer

    def _ensure_topic(self) -> None:
        if self._ready:
            return
        admin = self._clients.admin()
        timeout_s = self._clients.timeout_s
        config = {
            "cleanup.policy": "compact",
            "min.insync.replicas": str(self._policy.min_insync_replicas),
            "max.message.bytes": str(MAX_MESSAGE_BYTES),
            "unclean.leader.election.enable": "false",
        }
        try:
            md = admin.list_topics(timeout=timeout_s)
            if self.topic not in md.topics:
                if not self._create:
                    raise ConfigError(f"the Kafka topic {self.topic} does not exist and create_topics is off")
                futures = admin.create_topics(
                    [NewTopic(self.topic, self._partitions, self._policy.replication_factor, config=config)],
                    request_timeout=timeout_s,
                )
                for fut in futures.values():
                    try:
                        fut.result(timeout=timeout_s)
                    except KafkaException as exc:
                        err = kafka_error(exc)
                        if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            raise
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    md = admin.list_topics(timeout=timeout_s)
                    meta = md.topics.get(self.topic)
                    if meta is not None and len(meta.partitions) == self._partitions:
                        break
                    time.sleep(0.05)
            meta = md.topics.get(self.topic)
            count = len(meta.partitions) if meta is not None else 0
        except (KafkaException, TimeoutError) as exc:
            raise self._clients.not_answering(exc) from exc
        if count != self._partitions:
            raise ConfigError(
                f"topic {self.topic} has {count} partitions but this log is configured for {self._partitions}; "
                "sessions would map to the wrong partitions"
            )
        self._ready = True


def _key(session_id: str, entry_id: str) -> bytes:
    return session_id.encode("utf-8") + _SEP + entry_id.encode("utf-8")
