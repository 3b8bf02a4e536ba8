"""Consuming the session-event topic (projectors, tools): decode, check, dead-letter what cannot apply.

:class:`SessionEventConsumer` is a group consumer with ``isolation.level=read_committed`` (records of
aborted or fenced transactions are never delivered). Each record comes back as a typed item:

* :class:`ConsumedEvent` — a decoded envelope that passed the checks;
* :class:`ConsumedLease` — a writer acquired the session (its epoch);
* :class:`DeadLetter` — a record that cannot be applied, with the typed foldline error. It has already
  been copied to the dead-letter topic (``<topic>.dlq``) with the reason in its headers before ``poll``
  returns, so nothing is dropped silently, and consumption goes on.

Checks (docs/KAFKA.md, "What a consumer must check"): the record kind is ``event`` or ``lease``; the
value decodes (:class:`~foldline.adapters.avro.AvroDecodeError`,
:class:`~foldline.adapters.avro.UnknownSchemaError`, core shape/rule errors); the record's writer epoch
is not older than the session's latest lease seen (:class:`~foldline.errors.FencedError` — defence in
depth: a take-over fences the previous owner before it writes the lease record, so the log's own
records never fail it); and the event continues its session under the log rules
(:class:`~foldline.core.validation.LogRules`). A session first met mid-stream is anchored by reading its
prefix through ``log`` (cost bounded by the session) when one is given.

Offsets are committed only by :meth:`SessionEventConsumer.commit`, after the caller applied the items.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from ..core.events import Envelope
from ..core.validation import LogRules
from ..errors import FencedError, FoldlineError, FormatError, StoreUnavailable, ValidationError
from ..ports.event_log import EventLog
from .avro import AvroCodec
from .kafka_log import DEFAULT_TOPIC, HEADER_EPOCH, HEADER_KIND, KIND_EVENT, KIND_LEASE, dlq_topic

__all__ = [
    "DLQ_HEADER_ERROR",
    "DLQ_HEADER_OFFSET",
    "DLQ_HEADER_PARTITION",
    "DLQ_HEADER_REASON",
    "DLQ_HEADER_RULE",
    "DLQ_HEADER_TOPIC",
    "ConsumedEvent",
    "ConsumedItem",
    "ConsumedLease",
    "DeadLetter",
    "SessionEventConsumer",
]

_LOG = logging.getLogger("foldline.kafka")
DLQ_HEADER_REASON = "fl-dlq-reason"
DLQ_HEADER_ERROR = "fl-dlq-error"
DLQ_HEADER_RULE = "fl-dlq-rule"
DLQ_HEADER_TOPIC = "fl-dlq-topic"
DLQ_HEADER_PARTITION = "fl-dlq-partition"
DLQ_HEADER_OFFSET = "fl-dlq-offset"


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


def _headers(msg: Message) -> dict[str, bytes]:
    raw = msg.headers()
    if not raw:
        return {}
    items = raw.items() if isinstance(raw, dict) else raw
    return {k: v.encode() if isinstance(v, str) else v for k, v in items if v is not None}


class SessionEventConsumer:
    """A consumer-group member reading session events; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        group_id: str,
        *,
        topic: str = DEFAULT_TOPIC,
        codec: AvroCodec | None = None,
        registry_url: str | None = None,
        log: EventLog | None = None,
        timeout_s: float = 10.0,
        client_config: Mapping[str, Any] | None = None,
        on_assign: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        max_sessions: int = 10_000,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.topic = topic
        self.max_sessions = max_sessions
        self.dlq_topic = dlq_topic(topic)
        self.codec = codec or AvroCodec(registry_url=registry_url, subject=f"{topic}-value")
        self.timeout_s = timeout_s
        self._log = log
        base: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _LOG, **(client_config or {})}
        try:
            self._consumer = Consumer(
                {
                    **base,
                    "group.id": group_id,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": 6000,
                }
            )
            self._dlq = Producer(
                {
                    **base,
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": max(1000, int(timeout_s * 1000)),
                }
            )
            callbacks: dict[str, Any] = {}
            if on_assign is not None:
                callbacks["on_assign"] = on_assign
            if on_revoke is not None:
                callbacks["on_revoke"] = on_revoke
            self._consumer.subscribe([topic], **callbacks)
        except KafkaException as exc:
            raise StoreUnavailable(f"cannot start a consumer for {topic}: {exc}") from exc
        # Rule state of the sessions seen most recently. With an event log to re-anchor from, at most
        # ``max_sessions`` are kept (a long-running consumer meets unboundedly many sessions); a session
        # evicted and met again costs one read of its prefix. Without a log nothing can be re-anchored,
        # so nothing is evicted.
        self._rules: OrderedDict[str, LogRules] = OrderedDict()
        self._epochs: dict[str, int] = {}
        self._dlq_errors: list[KafkaError] = []

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

    @property
    def tracked_sessions(self) -> int:
        """How many sessions' rule state this consumer holds (at most ``max_sessions`` when it has a log)."""
        return len(self._rules)

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedItem]:
        """The next records as typed items; dead letters are durably in the DLQ topic when this returns."""
        try:
            messages = self._consumer.consume(max_records, timeout=timeout_s)
        except KafkaException as exc:
            raise StoreUnavailable(f"consuming {self.topic} failed: {exc}") from exc
        items: list[ConsumedItem] = []
        dead = 0
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise StoreUnavailable(f"consuming {self.topic} failed: {err}")
            item = self._item(msg)
            if isinstance(item, DeadLetter):
                self._dead_letter(msg, item.error)
                dead += 1
            items.append(item)
        if dead:
            if self._dlq.flush(self.timeout_s):
                raise StoreUnavailable(f"dead-letter topic {self.dlq_topic} did not acknowledge {dead} record(s)")
            if self._dlq_errors:
                raise StoreUnavailable(f"dead-letter write failed: {self._dlq_errors.pop()}")
        return items

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
        self._dlq.flush(self.timeout_s)
        self._consumer.close()

    # -------------------------------------------------------------- internals

    def _item(self, msg: Message) -> ConsumedItem:
        part = msg.partition() or 0
        off = msg.offset() or 0
        key = msg.key()
        sid = key.decode(errors="replace") if key is not None else None
        headers = _headers(msg)
        try:
            if sid is None:
                raise FormatError("kafka-record", "record has no key (session id)")
            try:
                epoch = int(headers.get(HEADER_EPOCH, b"0"))
            except ValueError as exc:
                raise FormatError("kafka-record", f"bad {HEADER_EPOCH} header") from exc
            kind = headers.get(HEADER_KIND, KIND_EVENT)
            if kind == KIND_LEASE:
                self._epochs[sid] = max(epoch, self._epochs.get(sid, 0))
                return ConsumedLease(sid, epoch, part, off)
            if kind != KIND_EVENT:
                raise FormatError("kafka-record", f"unknown record kind {kind!r}")
            latest = self._epochs.get(sid, 0)
            if epoch < latest:
                raise FencedError(sid, epoch, latest)
            event = self.codec.decode(msg.value())
            self._check(sid, event)
            return ConsumedEvent(sid, event, epoch, part, off)
        except FoldlineError as exc:
            return DeadLetter(sid, exc, part, off)

    def _check(self, sid: str, event: Envelope) -> None:
        rules = self._rules.get(sid)
        if rules is None or rules.next_seq != event.seq:
            if event.seq == 0:
                rules = LogRules()
            elif self._log is not None:
                rules = LogRules()
                rules.check_batch(self._log.read(sid, 0, event.seq))
                if rules.next_seq != event.seq:
                    raise ValidationError(
                        "seq-gapless", f"session {sid!r} has {rules.next_seq} events before this one", seq=event.seq
                    )
            else:
                raise ValidationError(
                    "seq-gapless",
                    f"session {sid!r}: event seq {event.seq} does not continue what this consumer has seen "
                    "(give the consumer the event log to anchor sessions met mid-stream)",
                    seq=event.seq,
                )
            self._rules[sid] = rules
            if self._log is not None:
                while len(self._rules) > self.max_sessions:
                    self._rules.popitem(last=False)
        self._rules.move_to_end(sid)
        rules.check(event)

    def _dead_letter(self, msg: Message, error: FoldlineError) -> None:
        errors = self._dlq_errors

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        rule = getattr(error, "rule", "") or ""
        headers: list[tuple[str, str | bytes | None]] = [
            *_headers(msg).items(),
            (DLQ_HEADER_REASON, str(error).encode()),
            (DLQ_HEADER_ERROR, type(error).__name__.encode()),
            (DLQ_HEADER_RULE, str(rule).encode()),
            (DLQ_HEADER_TOPIC, (msg.topic() or "").encode()),
            (DLQ_HEADER_PARTITION, str(msg.partition()).encode()),
            (DLQ_HEADER_OFFSET, str(msg.offset()).encode()),
        ]
        _LOG.warning("dead-lettering %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), error)
        try:
            self._dlq.produce(
                self.dlq_topic, value=msg.value(), key=msg.key(), headers=headers, on_delivery=on_delivery
            )
        except (KafkaException, BufferError) as exc:
            raise StoreUnavailable(f"cannot write to the dead-letter topic {self.dlq_topic}: {exc}") from exc
