"""Reading the log: partition ends, catching up the session index, fetching one session's records.

:class:`Watermarks` asks for partitions' high watermarks (the log, and the projector's lag). A
:class:`SessionReader` keeps this process's view of the index (the latest entry and the chunks of
every session met) and reads a session by fetching exactly the offsets its entry lists: the cost of a
read is the session's size plus one catch-up of its index partition. docs/KAFKA.md, "Reading one
session: the index".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ...core.events import Envelope
from ...errors import EventsExpired, FormatError, StoreUnavailable
from .clients import TRANSIENT_CODES, KafkaClients, kafka_error
from .index import CHUNK_MARK, IndexEntry, PendingBatch, SessionState, decode_chunk, decode_index, expand, runs
from .partitioning import partition_for
from .records import HEADER_BATCH, HEADER_KIND, KIND_EVENT, Record, header

__all__ = ["SessionReader", "Watermarks", "fetch_records", "read_partition", "read_partition_span"]

_LOG = logging.getLogger("foldline.kafka")
_GAP_TO_SEEK = 256  # consume through gaps smaller than this many offsets instead of re-assigning


class Watermarks:
    """High watermarks from one ``read_uncommitted`` consumer that never joins a group (thread-safe)."""

    def __init__(self, clients: KafkaClients) -> None:
        self._clients = clients
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        # one query per partition at a time; callers that waited for it use its answer when it was asked
        # after they were (it then covers every record acknowledged before their call)
        self._asking: dict[tuple[str, int], threading.Lock] = {}
        self._answered: dict[tuple[str, int], tuple[float, tuple[int, int]]] = {}

    def high(self, topic: str, part: int, deadline: float | None = None) -> int:
        """The partition's high watermark: every record acknowledged so far lies below it.

        Retries while the partition has no leader yet (right after topic creation); raises
        :class:`~foldline.errors.StoreUnavailable` when the broker does not answer by ``deadline``
        (default: the clients' timeout from now).
        """
        return self.bounds(topic, part, deadline)[1]

    def low(self, topic: str, part: int, deadline: float | None = None) -> int:
        """The partition's log start offset: records below it were deleted (retention, or deleted records)."""
        return self.bounds(topic, part, deadline)[0]

    def bounds(self, topic: str, part: int, deadline: float | None = None) -> tuple[int, int]:
        """The partition's ``(log start offset, high watermark)``, asked of the broker after this call began.

        Concurrent callers share one broker query per partition: a caller that waited for a query asked
        after its own call began takes that query's answer.
        """
        clients = self._clients
        until = clients.deadline() if deadline is None else deadline
        called = time.monotonic()
        key = (topic, part)
        with self._lock:
            asking = self._asking.setdefault(key, threading.Lock())
        if not asking.acquire(timeout=max(0.0, clients.remaining(until))):
            raise clients.unavailable(f"reading the end offset of {topic}[{part}]", TimeoutError("no answer in time"))
        try:
            answered = self._answered.get(key)
            if answered is not None and answered[0] >= called:
                return answered[1]
            asked = time.monotonic()
            found = self._ask(topic, part, until)
            self._answered[key] = (asked, found)
            return found
        finally:
            asking.release()

    def _ask(self, topic: str, part: int, until: float) -> tuple[int, int]:
        clients = self._clients
        consumer = self._open()
        last: KafkaException | None = None
        while True:
            left = until - time.monotonic()
            if left <= 0 and last is not None:  # asked until the deadline: the error names the last answer
                raise clients.unavailable("reading the partition's end offset", last) from last
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=clients.remaining(until), cached=False
                )
                return int(low), int(high)
            except KafkaException as exc:
                err = kafka_error(exc)
                if err is None or not (err.retriable() or err.code() in TRANSIENT_CODES):
                    raise clients.unavailable("reading the partition's end offset", exc) from exc
                last = exc
                time.sleep(min(0.05, max(0.0, until - time.monotonic())))

    def close(self) -> None:
        with self._lock:
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            _close(consumer)

    def _open(self) -> Consumer:
        with self._lock:
            if self._consumer is None:
                self._consumer = self._clients.reading_consumer(committed_only=False)
            return self._consumer


def _close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except KafkaException as exc:
        raise StoreUnavailable(f"closing a Kafka consumer failed: {exc}") from exc


def read_partition(
    clients: KafkaClients, consumer: Consumer, topic: str, part: int, *, start: int, end: int, deadline: float
) -> Iterator[Message]:
    """Committed records of ``topic[part]`` from ``start`` until the read position reaches ``end``.

    ``consumer`` is a reading consumer (:meth:`KafkaClients.reading_consumer`); it is assigned to the
    partition for the read and released afterwards.
    """
    try:
        consumer.assign([TopicPartition(topic, part, start)])
        while True:
            # consume() waits for the whole batch or the timeout, whichever comes first: a short timeout
            # returns what the last fetch brought (a read is usually a few records, then end of partition)
            batch = consumer.consume(1000, timeout=min(0.001, max(0.0, clients.remaining(deadline))))
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
                    f"reading {topic}[{part}] did not reach offset {end} within {clients.timeout_s:g}s "
                    "(broker down, or an unfinished transaction of another writer holds the partition)"
                )
    except KafkaException as exc:
        raise clients.unavailable(f"reading {topic}[{part}]", exc) from exc
    finally:
        try:
            consumer.unassign()
        except KafkaException as exc:  # harmless: the next read's assign() replaces the assignment
            _LOG.warning("releasing %s[%d] after a read failed: %s", topic, part, exc)


def read_partition_span(
    clients: KafkaClients, topic: str, part: int, *, start: int, end: int, chunk: int = 5000
) -> Iterator[list[Message]]:
    """Committed records of ``topic[part]`` from ``start`` until the read position reaches ``end``, as lists
    of the records of at most ``chunk`` offsets each: a projector re-reading a whole partition. One reading
    consumer, opened and closed for the call; each list must arrive within the clients' timeout (the read as
    a whole has no deadline), else :class:`~foldline.errors.StoreUnavailable`."""
    if chunk < 1:
        raise ValueError("chunk must be at least 1")
    consumer = clients.reading_consumer(committed_only=True)
    try:
        at = start
        while at < end:
            upto = min(at + chunk, end)
            records = list(
                read_partition(clients, consumer, topic, part, start=at, end=upto, deadline=clients.deadline())
            )
            if records:
                yield records
            at = upto
    finally:
        _close(consumer)


def fetch_records(
    clients: KafkaClients, topic: str, positions: Sequence[tuple[int, int]], deadline: float | None = None
) -> list[Record]:
    """The committed records at ``positions`` (partition, offset) of ``topic``, in the order asked.

    For the rare record a consumer let go of and needs again (an event a projector's fold store refused,
    dead-lettered as it is on the topic). One reading consumer, opened and closed for the call; raises
    :class:`~foldline.errors.StoreUnavailable` when the broker does not answer by ``deadline``.
    """
    until = clients.deadline() if deadline is None else deadline
    wanted: dict[int, set[int]] = {}
    for part, off in positions:
        wanted.setdefault(part, set()).add(off)
    found: dict[tuple[int, int], Record] = {}
    consumer = clients.reading_consumer(committed_only=True)
    try:
        for part, offsets in wanted.items():
            for msg in read_partition(
                clients, consumer, topic, part, start=min(offsets), end=max(offsets) + 1, deadline=until
            ):
                at = msg.offset()
                if at is not None and at in offsets:
                    found[(part, at)] = msg
    finally:
        _close(consumer)
    missing = [p for p in positions if p not in found]
    if missing:
        raise FormatError("kafka-record", f"{topic}: no committed record at (partition, offset) {missing}")
    return [found[p] for p in positions]


class SessionReader:
    """Committed session state and events of one log's topics; see the module docstring.

    ``lock`` serializes the reading consumers and the index positions; entries and chunks have a lock
    of their own, so appends record what they committed without waiting for a read.
    """

    def __init__(
        self,
        clients: KafkaClients,
        *,
        topic: str,
        index_topic: str,
        partitions: int,
        decode: Callable[[bytes | None], Envelope],
    ) -> None:
        self._clients = clients
        self.topic = topic
        self.index_topic = index_topic
        self.partitions = partitions
        self._decode = decode
        self.lock = threading.RLock()  # the reading consumers and the index position
        self._consumers_lock = threading.Lock()  # opening consumers (watermarks are asked outside the read lock)
        self._index_lock = threading.Lock()  # entries and chunks
        self._index: dict[str, IndexEntry] = {}
        self._chunks: dict[str, dict[int, list[list[int]]]] = {}
        self._index_pos: dict[int, int] = {}
        self._consumers: dict[str, Consumer] = {}
        self.watermarks = Watermarks(clients)

    # -------------------------------------------------------------- what this process knows

    def remember(self, session_id: str, entry: IndexEntry) -> None:
        """Record an entry; entries only grow (epoch, head): an older one than the known one is ignored."""
        with self._index_lock:
            known = self._index.get(session_id)
            if known is None or (entry.epoch, entry.next_seq) >= (known.epoch, known.next_seq):
                self._index[session_id] = entry

    def knows(self, session_id: str) -> bool:
        """Whether this instance's view of the index (as far as it has read) has an entry for the session."""
        with self._index_lock:
            return session_id in self._index

    def remember_chunk(self, session_id: str, n: int, chunk: list[list[int]]) -> None:
        with self._index_lock:
            self._chunks.setdefault(session_id, {})[n] = chunk

    def known_entries(
        self, session_ids: Sequence[str], part: int, deadline: float, *, catch_up: bool = True
    ) -> dict[str, IndexEntry]:
        """The committed index entries of ``session_ids`` (all in partition ``part``), after one catch-up
        (without ``catch_up``: as far as this instance has read and remembered)."""
        if catch_up:
            high = self.watermarks.high(self.index_topic, part, deadline)
            with self.lock:
                self._catch_up_index(part, deadline, high)
        with self._index_lock:
            return {sid: entry for sid in session_ids if (entry := self._index.get(sid)) is not None}

    def sessions(self, deadline: float) -> list[str]:
        """Every session with events, after catching up every index partition."""
        with self.lock:
            for p in range(self.partitions):
                self._catch_up_index(p, deadline)
            with self._index_lock:
                return sorted(s for s, st in self._index.items() if st.next_seq > 0)

    def heads(self, deadline: float) -> dict[str, int]:
        """Every session's head (next seq), after catching up every index partition."""
        with self.lock:
            for p in range(self.partitions):
                self._catch_up_index(p, deadline)
            with self._index_lock:
                return {s: st.next_seq for s, st in self._index.items() if st.next_seq > 0}

    # -------------------------------------------------------------- one session

    def state(self, session_id: str, deadline: float) -> SessionState:
        """The session's committed state: its latest index entry with every event's offset.

        The index's end is taken before waiting for the read lock: a caller that finds another thread
        already caught up past it (readers waiting behind one catch-up) reads no further.
        """
        part = partition_for(session_id, self.partitions)
        high = self.watermarks.high(self.index_topic, part, deadline)
        with self.lock:
            self._catch_up_index(part, deadline, high)
            return self._state_of(session_id, part, deadline)

    def _state_of(self, session_id: str, part: int, deadline: float) -> SessionState:
        with self._index_lock:
            entry = self._index.get(session_id)
            chunks = dict(self._chunks.get(session_id, {}))
        if entry is None:
            return SessionState()
        offsets: list[int] = []
        for n in range(entry.chunks):
            chunk = chunks.get(n)
            if chunk is None:
                raise FormatError("kafka-index", f"session {session_id!r}: index chunk {n} is missing")
            offsets.extend(expand(chunk))
        if len(offsets) != entry.sealed:
            raise FormatError(
                "kafka-index",
                f"session {session_id!r}: index chunks hold {len(offsets)} offsets, not {entry.sealed}",
            )
        tail = [list(r) for r in entry.tail]
        offsets.extend(expand(tail))
        if entry.pending is not None:
            found = self._scan_batch(session_id, part, entry.pending, deadline)
            offsets.extend(found)
            runs(found, tail)
        return SessionState(entry.epoch, offsets, entry.owner, entry.chunks, entry.sealed, tail)

    def events(
        self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float
    ) -> list[Envelope]:
        """Events ``from_seq`` up to ``to_seq`` (exclusive) of a session in ``state``, fetched by offset.

        Raises :class:`~foldline.errors.EventsExpired` when Kafka deleted some of them (retention).
        """
        with self.lock:
            messages = self._fetch(session_id, state, from_seq, to_seq, deadline)
        out: list[Envelope] = []
        decode = self._decode
        for seq, msg in enumerate(messages, start=from_seq):
            env = decode(msg.value())
            if env.seq != seq:
                raise FormatError("seq-gapless", f"offset {msg.offset()} holds seq {env.seq}", seq=seq)
            out.append(env)
        return out

    def records(
        self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float
    ) -> list[Record]:
        """The committed records of events ``from_seq`` up to ``to_seq`` of a session, undecoded, in seq order."""
        with self.lock:
            return self._fetch(session_id, state, from_seq, to_seq, deadline)

    def records_of(self, sessions: Mapping[str, tuple[SessionState, int]], deadline: float) -> dict[str, list[Record]]:
        """The committed records of many sessions' events ``0 .. to_seq`` at once: one pass over the offsets
        they name in each partition (a span of nearby offsets read through, a gap sought over), not one read
        per session. A session some of whose records are not there (deleted by retention: the archive holds
        them) is left out; its caller reads it alone."""
        by_part: dict[int, set[int]] = {}
        for sid, (state, to_seq) in sessions.items():
            by_part.setdefault(partition_for(sid, self.partitions), set()).update(state.offsets[:to_seq])
        found: dict[int, dict[int, Message]] = {}
        with self.lock:
            consumer = self._consumer("data")
            for part, offsets in by_part.items():
                found[part] = self._read_offsets(consumer, part, sorted(offsets), deadline)
        out: dict[str, list[Record]] = {}
        for sid, (state, to_seq) in sessions.items():
            got = found[partition_for(sid, self.partitions)]
            key = sid.encode()
            records = [got.get(off) for off in state.offsets[:to_seq]]
            if all(r is not None and r.key() == key for r in records):
                out[sid] = [r for r in records if r is not None]
        return out

    def states(self, session_ids: Sequence[str], deadline: float) -> dict[str, SessionState]:
        """The committed state of each session, catching up each index partition once."""
        by_part: dict[int, list[str]] = {}
        for sid in session_ids:
            by_part.setdefault(partition_for(sid, self.partitions), []).append(sid)
        out: dict[str, SessionState] = {}
        for part, sids in by_part.items():
            high = self.watermarks.high(self.index_topic, part, deadline)
            with self.lock:
                self._catch_up_index(part, deadline, high)
                for sid in sids:
                    out[sid] = self._state_of(sid, part, deadline)
        return out

    def close(self) -> None:
        """Close the reading consumers (each of them, even when one fails)."""
        with self.lock:
            consumers, self._consumers = list(self._consumers.values()), {}
        failures = []
        for close in [*(c.close for c in consumers), self.watermarks.close]:
            try:
                close()
            except (KafkaException, StoreUnavailable) as exc:
                failures.append(exc)
        if failures:
            raise StoreUnavailable(f"closing the Kafka log's consumers failed: {failures[0]}") from failures[0]

    # -------------------------------------------------------------- internals

    def _read_offsets(
        self, consumer: Consumer, part: int, wanted: Sequence[int], deadline: float
    ) -> dict[int, Message]:
        """The records at ``wanted`` (ascending offsets) of one partition that are there: runs of nearby offsets
        are read through, gaps over ``_GAP_TO_SEEK`` sought over. The caller holds :attr:`lock`."""
        by_offset: dict[int, Message] = {}
        i = 0
        while i < len(wanted):
            j = i
            while j + 1 < len(wanted) and wanted[j + 1] - wanted[j] <= _GAP_TO_SEEK:
                j += 1
            want = set(wanted[i : j + 1])
            for msg in read_partition(
                self._clients, consumer, self.topic, part, start=wanted[i], end=wanted[j] + 1, deadline=deadline
            ):
                off = msg.offset()
                if off in want:
                    by_offset[off] = msg
            i = j + 1
        return by_offset

    def _fetch(self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float) -> list[Record]:
        wanted = state.offsets[from_seq:to_seq]
        part = partition_for(session_id, self.partitions)
        by_offset = self._read_offsets(self._consumer("data"), part, wanted, deadline)
        out: list[Record] = []
        for seq, off in enumerate(wanted, start=from_seq):
            found = by_offset.get(off)
            if found is None:
                self._missing(session_id, part, seq, off, deadline)
            msg = found
            key = msg.key()
            if key is None or key.decode() != session_id:
                raise FormatError("kafka-index", f"offset {off} holds another session's record", seq=seq)
            out.append(msg)
        return out

    def _missing(self, session_id: str, part: int, seq: int, off: int, deadline: float) -> NoReturn:
        """An event the index names is not in its partition: deleted by retention, or a broken index."""
        low = self.watermarks.low(self.topic, part, deadline)
        if off < low:
            raise EventsExpired(
                session_id,
                seq,
                f"Kafka deleted it: {self.topic}[{part}] now starts at offset {low} and the event was at offset {off} "
                "(the topic's retention.ms / retention.bytes), and no archive holds it",
            )
        raise FormatError("kafka-index", f"session {session_id!r}: event seq {seq} is missing at offset {off}")

    def _consumer(self, which: str) -> Consumer:
        with self._consumers_lock:
            current = self._consumers.get(which)
            if current is None:
                current = self._consumers[which] = self._clients.reading_consumer(committed_only=True)
            return current

    def _catch_up_index(self, part: int, deadline: float, high: int | None = None) -> None:
        # Read up to a high watermark taken after the call began (not the last stable offset): an append
        # that returned before the call is then visible, even while its transaction markers are still
        # being written.
        if high is None:
            high = self.watermarks.high(self.index_topic, part, deadline)
        pos = self._index_pos.get(part, 0)
        if pos >= high:
            return
        consumer = self._consumer("index")
        for msg in read_partition(
            self._clients, consumer, self.index_topic, part, start=pos, end=high, deadline=deadline
        ):
            key = msg.key()
            value = msg.value()
            if key is None or value is None:
                continue
            mark = key.find(CHUNK_MARK)
            if mark >= 0:  # a sealed chunk of offsets: written once, never replaced
                self.remember_chunk(key[:mark].decode(), int(key[mark + 1 :]), decode_chunk(value))
            else:
                # entries only grow (epoch, head); never step back to an older one this process already knows
                self.remember(key.decode(), decode_index(value))
        self._index_pos[part] = high

    def _scan_batch(self, session_id: str, part: int, pending: PendingBatch, deadline: float) -> list[int]:
        """Offsets of the ``pending`` batch: scan forward from its lower bound until all its records are seen."""
        consumer = self._consumer("data")
        want = pending.batch.encode()
        found: list[int] = []
        high = self.watermarks.high(self.topic, part, deadline)
        for msg in read_partition(
            self._clients, consumer, self.topic, part, start=pending.min_offset, end=high, deadline=deadline
        ):
            if header(msg, HEADER_BATCH) == want and header(msg, HEADER_KIND) == KIND_EVENT:
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
