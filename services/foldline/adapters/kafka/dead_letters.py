"""Checking consumed records, and the one way a record that cannot be applied reaches ``<topic>.dlq``.

:class:`RecordChecker` turns each consumed record into a typed item (docs/KAFKA.md, "What a consumer
must check"): the record kind is ``event`` or ``lease``; the value decodes
(:class:`~foldline.errors.AvroDecodeError`, :class:`~foldline.errors.UnknownSchemaError`,
core shape/rule errors); the record's writer epoch is not older than the session's latest lease seen
(:class:`~foldline.errors.FencedError` — defence in depth: a take-over fences the previous owner before
it writes the lease record, so the log's own records never fail it); and the event continues its
session under the log rules (:class:`~foldline.core.validation.LogRules`). A session first met
mid-stream is anchored by reading its prefix through ``log`` (cost bounded by the session) when one is
given.

:class:`DeadLetterWriter` copies a record that cannot be applied to the dead-letter topic: the original
key, value bytes and headers, plus ``fl-dlq-reason`` (the error's message), ``fl-dlq-error`` (its
type), ``fl-dlq-rule`` (the broken rule, empty if none), ``fl-dlq-topic``, ``fl-dlq-partition`` and
``fl-dlq-offset``. Records the checker refuses and events the fold store refuses as stale go through
it alike, whichever consumer runtime read them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ...core.events import Envelope
from ...core.validation import LogRules
from ...errors import (
    ConfigError,
    FencedError,
    FoldlineError,
    FormatError,
    StoreUnavailable,
    TransientError,
    ValidationError,
)
from ...ports.event_log import EventLog, opened
from ...ports.key_store import Sealer
from ..avro import AvroCodec
from .clients import client_settings, flush
from .records import (
    HEADER_EPOCH,
    HEADER_KIND,
    KIND_EVENT,
    KIND_LEASE,
    MAX_MESSAGE_BYTES,
    ConsumedEvent,
    ConsumedItem,
    ConsumedLease,
    DeadLetter,
    Record,
    headers_of,
)

__all__ = [
    "DLQ_HEADER_ERROR",
    "DLQ_HEADER_OFFSET",
    "DLQ_HEADER_PARTITION",
    "DLQ_HEADER_REASON",
    "DLQ_HEADER_RULE",
    "DLQ_HEADER_TOPIC",
    "DeadLetterWriter",
    "RecordChecker",
]

_LOG = logging.getLogger("foldline.kafka")
#: sessions whose keys are looked up, or prefixes read, at once by one checker
_PARALLEL_SESSIONS = 16
DLQ_HEADER_REASON = "fl-dlq-reason"
DLQ_HEADER_ERROR = "fl-dlq-error"
DLQ_HEADER_RULE = "fl-dlq-rule"
DLQ_HEADER_TOPIC = "fl-dlq-topic"
DLQ_HEADER_PARTITION = "fl-dlq-partition"
DLQ_HEADER_OFFSET = "fl-dlq-offset"


class DeadLetterWriter:
    """An idempotent producer of dead-letter records; :meth:`write` then :meth:`flush` (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str,
        dlq_topic: str,
        *,
        timeout_s: float = 10.0,
        client_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.dlq_topic = dlq_topic
        self.timeout_s = timeout_s
        self._errors: list[KafkaError] = []
        self._pending = 0
        try:
            self._producer = Producer(
                client_settings(
                    bootstrap,
                    client_config,
                    {
                        "enable.idempotence": True,
                        "acks": "all",
                        "message.timeout.ms": max(1000, int(timeout_s * 1000)),
                        "message.max.bytes": MAX_MESSAGE_BYTES,  # a dead letter carries a whole record
                    },
                )
            )
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka producer configuration for {dlq_topic}: {exc}") from exc

    def write(self, record: Record, error: FoldlineError) -> None:
        """Queue the dead-letter copy of ``record``; durable only after :meth:`flush`."""
        errors = self._errors

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)

        rule = getattr(error, "rule", "") or ""
        headers: list[tuple[str, str | bytes | None]] = [
            *headers_of(record).items(),
            (DLQ_HEADER_REASON, str(error).encode()),
            (DLQ_HEADER_ERROR, type(error).__name__.encode()),
            (DLQ_HEADER_RULE, str(rule).encode()),
            (DLQ_HEADER_TOPIC, (record.topic() or "").encode()),
            (DLQ_HEADER_PARTITION, str(record.partition()).encode()),
            (DLQ_HEADER_OFFSET, str(record.offset()).encode()),
        ]
        _LOG.warning("dead-lettering %s[%s]@%s: %s", record.topic(), record.partition(), record.offset(), error)
        try:
            self._producer.produce(
                self.dlq_topic, value=record.value(), key=record.key(), headers=headers, on_delivery=on_delivery
            )
        except (KafkaException, BufferError) as exc:
            raise StoreUnavailable(f"cannot write to the dead-letter topic {self.dlq_topic}: {exc}") from exc
        self._pending += 1

    def flush(self) -> None:
        """Return once every queued dead letter is acknowledged; StoreUnavailable when one is not."""
        count, self._pending = self._pending, 0
        try:
            left = flush(self._producer, self.timeout_s)
        except KafkaException as exc:
            raise StoreUnavailable(f"dead-letter write failed: {exc}") from exc
        if left:
            raise StoreUnavailable(f"dead-letter topic {self.dlq_topic} did not acknowledge {count} record(s)")
        if self._errors:
            raise StoreUnavailable(f"dead-letter write failed: {self._errors.pop()}")

    def write_all(self, letters: Iterable[tuple[Record, FoldlineError]]) -> None:
        """:meth:`write` each ``(record, error)``, then :meth:`flush`."""
        for record, error in letters:
            self.write(record, error)
        self.flush()

    def close(self) -> None:
        try:
            flush(self._producer, self.timeout_s)
        except KafkaException as exc:
            raise StoreUnavailable(f"dead-letter write failed: {exc}") from exc


@dataclass(slots=True)
class _Decoded:
    """One consumed record as decoded: its kind and event, or the error that makes it a dead letter."""

    sid: str | None
    part: int
    off: int
    epoch: int = 0
    kind: bytes | None = None  # set once the record's kind is known and valid
    event: Envelope | None = None
    error: FoldlineError | None = None


class RecordChecker:
    """Decodes and checks consumed records of one topic (see the module docstring); not thread-safe.

    The codec is ``codec``, or one for the topic's subject (``<topic>-value``, through ``registry_url``).

    Rule state is kept for the sessions seen most recently. With an event log to re-anchor from, at most
    ``max_sessions`` are kept (a long-running consumer meets unboundedly many sessions); a session
    evicted and met again costs one read of its prefix. Without a log nothing can be re-anchored, so
    nothing is evicted.
    """

    def __init__(
        self,
        dead_letters: DeadLetterWriter,
        *,
        topic: str,
        codec: AvroCodec | None = None,
        registry_url: str | None = None,
        log: EventLog | None = None,
        max_sessions: int = 10_000,
        sealer: Sealer | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.dead_letters = dead_letters
        self.sealer = sealer if sealer is not None else log.sealer if log is not None else None
        self.topic = topic
        self.codec = codec or AvroCodec(registry_url=registry_url, subject=f"{topic}-value")
        self.max_sessions = max_sessions
        self._log = log
        self._rules: OrderedDict[str, LogRules] = OrderedDict()
        self._epochs: dict[str, int] = {}
        self._executor: ThreadPoolExecutor | None = None

    @property
    def tracked_sessions(self) -> int:
        """How many sessions' rule state this checker holds (at most ``max_sessions`` when it has a log)."""
        return len(self._rules)

    def check(self, records: Iterable[Record]) -> list[ConsumedItem]:
        """Typed items for ``records`` in order; dead letters are durably in the DLQ topic when this returns.

        The batch's per-session work is done per session, and for many sessions at once: the sealed events
        of a session are opened together (one key lookup per session, the lookups of different sessions in
        parallel), and the sessions met mid-stream are anchored together (their prefix reads in parallel).
        A consumer that takes partitions over — a projector joining or leaving the group under load — meets
        hundreds of sessions mid-stream in its first batches: one after another, their key lookups and prefix
        reads held the folds of those partitions for seconds. Each record is then checked in order, exactly as
        :meth:`item` checks it alone."""
        batch = list(records)
        if len(batch) < 2:
            return self._items(batch, [self._decoded(msg) for msg in batch])
        decoded = [self._decoded(msg, open_now=False) for msg in batch]
        self._open_by_session(decoded)
        self._anchor_ahead(decoded)
        return self._items(batch, decoded)

    def item(self, msg: Record) -> ConsumedItem:
        """The typed item of one record (a :class:`DeadLetter` is not written anywhere by this)."""
        return self._finish(self._decoded(msg))

    def _items(self, batch: list[Record], decoded: list[_Decoded]) -> list[ConsumedItem]:
        items: list[ConsumedItem] = []
        dead = False
        for msg, d in zip(batch, decoded, strict=True):
            item = self._finish(d)
            if isinstance(item, DeadLetter):
                self.dead_letters.write(msg, item.error)
                dead = True
            items.append(item)
        if dead:
            self.dead_letters.flush()
        return items

    def _decoded(self, msg: Record, *, open_now: bool = True) -> _Decoded:
        """What a record holds, before the checks that depend on the records before it (epochs, rules)."""
        part = msg.partition() or 0
        off = msg.offset() or 0
        key = msg.key()
        sid = key.decode(errors="replace") if key is not None else None
        d = _Decoded(sid, part, off)
        try:
            if sid is None:
                raise FormatError("kafka-record", "record has no key (session id)")
            headers = headers_of(msg)
            try:
                d.epoch = int(headers.get(HEADER_EPOCH, b"0"))
            except ValueError as exc:
                raise FormatError("kafka-record", f"bad {HEADER_EPOCH} header") from exc
            kind = headers.get(HEADER_KIND, KIND_EVENT)
            if kind not in (KIND_EVENT, KIND_LEASE):
                raise FormatError("kafka-record", f"unknown record kind {kind!r}")
            d.kind = kind
            if kind == KIND_EVENT:
                d.event = self.codec.decode(msg.value())
                if open_now and d.event.sealed is not None:
                    d.event = opened(f"the Kafka topic {self.topic}", sid, self.sealer, [d.event])[0]
        except TransientError:  # the key store did not answer: the record is fine, the batch is consumed again
            raise
        except FoldlineError as exc:
            d.error = exc
        return d

    def _finish(self, d: _Decoded) -> ConsumedItem:
        """The item of a decoded record, checked against what the records before it established."""
        sid = d.sid
        try:
            if sid is None or d.kind is None:  # no key, a bad header, an unknown kind: refused as it is
                raise d.error or FormatError("kafka-record", "record has no key (session id)")
            if d.kind == KIND_LEASE:
                self._epochs[sid] = max(d.epoch, self._epochs.get(sid, 0))
                return ConsumedLease(sid, d.epoch, d.part, d.off)
            latest = self._epochs.get(sid, 0)
            if d.epoch < latest:
                raise FencedError(sid, d.epoch, latest)
            if d.error is not None:
                raise d.error
            assert d.event is not None
            self._check(sid, d.event)
            return ConsumedEvent(sid, d.event, d.epoch, d.part, d.off)
        except TransientError:
            raise
        except FoldlineError as exc:
            return DeadLetter(sid, exc, d.part, d.off)

    def _open_by_session(self, decoded: list[_Decoded]) -> None:
        """Open the batch's sealed events, a session's together; the sessions in parallel when their keys are
        not at hand. An event that does not open is opened alone, so its error is its own."""
        sealed: dict[str, list[_Decoded]] = {}
        for d in decoded:
            if d.event is not None and d.event.sealed is not None and d.sid is not None:
                sealed.setdefault(d.sid, []).append(d)
        if not sealed:
            return
        where = f"the Kafka topic {self.topic}"

        def open_session(sid: str) -> None:
            group = sealed[sid]
            try:
                events = opened(where, sid, self.sealer, [d.event for d in group if d.event is not None])
            except TransientError:
                raise
            except FoldlineError:
                for d in group:  # one by one: each keeps its own outcome
                    try:
                        assert d.event is not None
                        d.event = opened(where, sid, self.sealer, [d.event])[0]
                    except TransientError:
                        raise
                    except FoldlineError as exc:
                        d.error = exc
                return
            for d, event in zip(group, events, strict=True):
                d.event = event

        asking = [sid for sid in sealed if self.sealer is not None and not self.sealer.cached(sid)]
        if len(asking) > 1:
            for _ in self._pool().map(open_session, asking):
                pass
        for sid in sealed:
            if sid not in asking or len(asking) <= 1:
                open_session(sid)

    def _anchor_ahead(self, decoded: list[_Decoded]) -> None:
        """Read the prefixes of the sessions this batch meets mid-stream, in parallel (the rules of those that
        anchor are kept; any other is anchored, or refused, by :meth:`_check` as a record comes)."""
        if self._log is None:
            return
        log = self._log
        need: dict[str, int] = {}
        seen: set[str] = set()
        for d in decoded:
            if d.sid is None or d.event is None or d.error is not None or d.sid in seen:
                continue
            seen.add(d.sid)
            rules = self._rules.get(d.sid)
            if d.event.seq > 0 and (rules is None or rules.next_seq != d.event.seq):
                need[d.sid] = d.event.seq
        if len(need) < 2:
            return

        def anchored(sid: str, seq: int, events: list[Envelope] | None) -> LogRules | None:
            try:
                rules = LogRules()
                rules.check_batch(log.read(sid, 0, seq) if events is None else events)
            except Exception:  # _check reads it again in order and raises what it finds
                return None
            return rules if rules.next_seq == seq else None

        read_prefixes = getattr(log, "read_prefixes", None)  # the Kafka log reads many at once
        prefixes: dict[str, list[Envelope]] = {}
        if read_prefixes is not None:
            try:
                prefixes = read_prefixes(need)
            except TransientError:
                raise
            except FoldlineError:
                prefixes = {}  # each is read alone below
        for sid, seq in need.items():
            if sid in prefixes:
                rules = anchored(sid, seq, prefixes[sid])
                if rules is not None:
                    self._rules[sid] = rules
        rest = [sid for sid in need if sid not in prefixes]
        for sid, rules in zip(rest, self._pool().map(lambda sid: anchored(sid, need[sid], None), rest), strict=True):
            if rules is not None:
                self._rules[sid] = rules
        while len(self._rules) > self.max_sessions:
            self._rules.popitem(last=False)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(_PARALLEL_SESSIONS, thread_name_prefix="foldline-checker")
        return self._executor

    def close(self) -> None:
        """Stop the threads that open and anchor sessions in parallel (started on first use)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

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
