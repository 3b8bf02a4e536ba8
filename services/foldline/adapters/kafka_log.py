"""The Kafka event log: Avro session events on a partitioned topic, one fenced writer per session.

Layout (docs/KAFKA.md has the full argument):

* ``<topic>`` (default ``foldline.session-events``, 12 partitions): one record per event, key = session
  id, value = the self-describing Avro envelope (:mod:`foldline.adapters.avro`), headers
  ``fl-kind=event``, ``fl-epoch``, ``fl-batch``. ``acquire`` writes a ``fl-kind=lease`` record (no value).
* ``<topic>.index`` (compacted, same partition count, same partition per session): the latest entry
  per session — lease epoch, the data offset of every event, and the session's owner (the
  transactional id of the producer allowed to write it).
* ``<topic>.dlq``: records a consumer could not apply, with the reason in headers
  (:mod:`foldline.adapters.kafka_consumer`).

**Group commit.** Appends from any number of threads and sessions are queued and committed together:
one Kafka transaction on this instance's transactional producer (its *writer*) holds every queued
batch's event records and one index record per session. ``append`` returns when that transaction has
committed; a batch is visible to ``read_committed`` readers all at once or never.

**One writer per session.** The index names each session's owner writer. Before a writer appends to
a session it does not own it *takes it over*: through the session's own transactional id
(``<topic>:<session>``, which serializes concurrent take-overs) it fences the previous owner's
producer (``init_transactions`` with the owner's transactional id aborts its open transaction and
rejects everything it sends afterwards), re-reads the session — now exact — and commits an index entry
naming itself. A writer keeps the state of the sessions it owns and checks ``expected_seq`` and the
lease epoch against it before anything is sent; if its producer is fenced the commit fails, nothing of
that transaction becomes visible, and each waiting append takes its session over again and re-checks.

**Reading one session** costs the session's size: the index partition is tailed (one small entry per
session after compaction), then exactly the listed offsets are fetched.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ..core import codec as canonical
from ..core.events import Envelope
from ..core.validation import LogRules
from ..errors import ConfigError, ConflictError, FencedError, FormatError, StoreUnavailable, ValidationError
from ..ports.event_log import EventLog, WriterLease
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
_MAX_RECORD_BYTES = _MAX_MESSAGE_BYTES - 64 * 1024  # room for key, headers and batch overhead
_GROUP_MAX_EVENTS = 20_000  # events per group transaction
_PREPARE_BETWEEN_POLLS = 8  # appends the writer prepares between two polls for delivery reports
_MAX_TAKE_OVERS = 16  # take-overs in flight at once (each opens a producer); more only thrash the coordinator
_MAX_SOLO = 256  # sessions written through their own producer, kept open (LRU)
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


@lru_cache(maxsize=1 << 16)  # every append and read asks; murmur2 in Python costs microseconds
def partition_for(session_id: str, partitions: int) -> int:
    """The partition of a session: Java-compatible ``toPositive(murmur2(key)) % partitions``."""
    return (_murmur2(session_id.encode()) & 0x7FFFFFFF) % partitions


def _error(exc: KafkaException) -> KafkaError | None:
    arg = exc.args[0] if exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def _flush(producer: Producer, timeout: float) -> int:
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
    """A batch an index entry was committed with, without its offsets (entries of older writers)."""

    batch: str
    min_offset: int
    count: int


@dataclass(slots=True)
class _Entry:
    """A session's index entry: epoch, owner, and where its events are.

    The offsets of the first ``sealed`` events are in ``chunks`` chunk records (``<session>\\xff<n>``,
    runs of offsets); the rest are ``tail`` (runs), then a ``pending`` batch (entries of older writers).
    An entry therefore stays small however long the session grows.
    """

    epoch: int = 0
    next_seq: int = 0
    owner: str | None = None
    chunks: int = 0
    sealed: int = 0
    tail: list[list[int]] = field(default_factory=list)
    pending: _Pending | None = None


@dataclass(slots=True)
class _State:
    """A session's state with every event's data offset (by seq): what reads and the owner work with."""

    epoch: int = 0
    offsets: list[int] = field(default_factory=list)
    owner: str | None = None
    chunks: int = 0
    sealed: int = 0
    tail: list[list[int]] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return len(self.offsets)

    def entry(self, epoch: int | None = None, owner: str | None = None) -> _Entry:
        return _Entry(
            self.epoch if epoch is None else epoch,
            len(self.offsets),
            self.owner if owner is None else owner,
            self.chunks,
            self.sealed,
            [list(r) for r in self.tail],
        )


_CHUNK_RUNS = 32  # runs in an entry's tail before they are sealed into a chunk record
_CHUNK_MARK = b"\xff"  # never in UTF-8: chunk keys cannot collide with a session id


def _runs(offsets: Sequence[int], into: list[list[int]] | None = None) -> list[list[int]]:
    runs = into if into is not None else []
    for off in offsets:
        if runs and runs[-1][0] + runs[-1][1] == off:
            runs[-1][1] += 1
        else:
            runs.append([off, 1])
    return runs


def _expand(runs: Iterable[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for start, count in runs:
        out.extend(range(start, start + count))
    return out


def _chunk_key(session_id: str, n: int) -> bytes:
    return session_id.encode() + _CHUNK_MARK + str(n).encode()


def _encode_index(entry: _Entry) -> bytes:
    pending = entry.pending
    value: dict[str, Any] = {
        "v": 2,
        "epoch": entry.epoch,
        "nextSeq": entry.next_seq,
        "chunks": entry.chunks,
        "sealed": entry.sealed,
        "offsets": entry.tail,
        "pending": None
        if pending is None
        else {"batch": pending.batch, "minOffset": pending.min_offset, "count": pending.count},
    }
    if entry.owner is not None:
        value["owner"] = entry.owner
    return canonical.canonical_json(value)


def _encode_chunk(n: int, runs: list[list[int]]) -> bytes:
    return canonical.canonical_json({"v": 2, "chunk": n, "offsets": runs})


def _runs_of(value: Any) -> list[list[int]]:
    runs = [[int(start), int(count)] for start, count in value]
    if any(count < 1 or start < 0 for start, count in runs):
        raise ValueError("bad offset run")
    return runs


def _decode_index(raw: bytes) -> _Entry:
    try:
        value = canonical.loads(raw)
        tail = _runs_of(value["offsets"])
        p = value["pending"]
        pending = None if p is None else _Pending(str(p["batch"]), int(p["minOffset"]), int(p["count"]))
        owner = value.get("owner")
        chunks, sealed = int(value.get("chunks", 0)), int(value.get("sealed", 0))  # v1 entries have neither
        next_seq = int(value["nextSeq"])
        if next_seq != sealed + sum(c for _, c in tail) + (pending.count if pending else 0):
            raise ValueError("nextSeq disagrees with the offsets")
        return _Entry(
            int(value["epoch"]), next_seq, None if owner is None else str(owner), chunks, sealed, tail, pending
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError("kafka-index", f"malformed session index entry: {exc}") from exc


def _decode_chunk(raw: bytes) -> list[list[int]]:
    try:
        return _runs_of(canonical.loads(raw)["offsets"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FormatError("kafka-index", f"malformed session index chunk: {exc}") from exc


def _next_entry(base: _State, epoch: int, owner: str, offsets: Sequence[int]) -> tuple[_Entry, list[list[int]] | None]:
    """The entry after appending ``offsets`` to ``base``, and the chunk to seal with it (if any)."""
    # only the last run can grow: the others are shared with the base entry, never changed
    tail = _runs(offsets, [*base.tail[:-1], list(base.tail[-1])] if base.tail else [])
    next_seq = base.next_seq + len(offsets)
    if len(tail) > _CHUNK_RUNS:
        return _Entry(epoch, next_seq, owner, base.chunks + 1, next_seq, []), tail
    return _Entry(epoch, next_seq, owner, base.chunks, base.sealed, tail), None


# ---------------------------------------------------------------- group commit


class _Retry(Exception):
    """Internal: the writer that was to commit this batch is gone (fenced or replaced); nothing was written."""


class _Done:
    """A one-shot signal from the writer to the appending thread: a lock held until the outcome is set
    (a ``threading.Event`` costs a condition variable and a waiter lock per append)."""

    __slots__ = ("_is_set", "_lock")

    def __init__(self) -> None:
        self._is_set = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        """Wake the waiter (once; only the thread that settles the append calls this)."""
        if not self._is_set:
            self._is_set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._is_set

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class _Request:
    """One append waiting for the group transaction: its events and, once prepared, their records;
    when done, their offsets (or the error, with ``refused`` set when nothing of it was sent)."""

    __slots__ = (
        "base",
        "chunk",
        "done",
        "entry",
        "epoch",
        "error",
        "events",
        "offsets",
        "part",
        "refused",
        "rules",
        "session_id",
        "values",
        "writer",
    )

    def __init__(
        self,
        session_id: str,
        part: int,
        epoch: int,
        base: _State,
        events: Sequence[Envelope],
        rules: LogRules,
        writer: str,
    ) -> None:
        self.session_id = session_id
        self.part = part
        self.epoch = epoch
        self.base = base
        self.events = events
        self.rules = rules
        self.writer = writer
        self.values: list[bytes] = []
        self.offsets: list[int] = []
        self.entry: _Entry | None = None
        self.chunk: list[list[int]] | None = None
        self.error: BaseException | None = None
        self.refused = False
        self.done = _Done()

    def prepare(self, log: KafkaEventLog) -> bool:
        """Encode the events and check them against the session's rules (which then count them).

        False, with the error set, when either refuses the batch: nothing of it is sent and the rules
        are unchanged (the check is all-or-nothing).
        """
        try:
            self.values = log._encode(self.events)
            self.rules.check_batch(self.events)
        except Exception as exc:  # ValidationError / FormatError: handed to the appending thread as is
            self.error, self.refused = exc, True
            return False
        return True


class _Reports:
    """Delivery reports of the records one transaction sent to one partition.

    Only the first and the last record of the partition's run report (each report costs this process a
    trip through the interpreter lock): the run is contiguous iff ``last - first + 1`` is its length.
    With ``every`` set, each record reports its offset.
    """

    __slots__ = ("error", "first", "last", "offsets")

    def __init__(self) -> None:
        self.first: int | None = None
        self.last: int | None = None
        self.error: KafkaError | None = None
        self.offsets: list[int] = []

    def complete(self, total: int, every: bool) -> bool:
        """Whether every report this run asked for has arrived (or one failed)."""
        if self.error is not None:
            return True
        if every:
            return len(self.offsets) == total
        return self.first is not None and (total == 1 or self.last is not None)

    def on_first(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.error = err
        else:
            self.first = msg.offset()

    def on_last(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.error = err
        else:
            self.last = msg.offset()

    def on_each(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.error = err
        else:
            off = msg.offset()
            if off is not None:
                self.offsets.append(off)


class _NotContiguous(Exception):
    """Internal: another producer's records landed between ours; redo the transaction with every offset reported."""


def _copy_error(exc: BaseException) -> BaseException:
    """A fresh exception per waiting append (one instance must not be raised in several threads)."""
    if isinstance(exc, _Retry):
        return _Retry()
    if isinstance(exc, StoreUnavailable):
        return StoreUnavailable(str(exc))
    return StoreUnavailable(f"Kafka writer failed: {exc!r}; the outcome is unknown — re-read the session head")


class _Writer:
    """This instance's transactional producer and the thread that commits queued appends in groups.

    The writer thread prepares (encodes and checks) the appends queued since its last turn while the
    broker commits the previous group on a second thread, then waits for that outcome and sends the
    prepared group. Appending threads only queue and wait, so the interpreter lock has two users
    while a group is under way (many appending threads contending for it slow every delivery report).

    ``writer_id`` (the producer's ``transactional.id``) changes whenever the producer is replaced: after
    it was fenced, or after a commit whose outcome is unknown. Requests carry the id they were checked
    under; a request for an older id fails with :class:`_Retry` and is taken over again by its caller.
    """

    def __init__(self, log: KafkaEventLog, number: int) -> None:
        self._log = log
        self.number = number
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._init_lock = threading.Lock()
        self._producer: Producer | None = None
        self.writer_id: str | None = None
        self._to_fence: list[str] = []  # replaced ids whose last transaction may still be open
        self._closed = False
        self._batch = 0  # batch ids: <writer id>#<n>
        self._prepared: deque[_Request] = deque()  # the writer thread's: checked and encoded, for the next group
        self._prepared_events = 0
        self._committer = ThreadPoolExecutor(1, thread_name_prefix=f"foldline-kafka-commit-{number}-{log.topic}")
        self._thread = threading.Thread(
            target=self._run, name=f"foldline-kafka-writer-{number}-{log.topic}", daemon=True
        )
        self._thread.start()

    # -- callers

    def current(self, deadline: float) -> str:
        """The live writer id, initializing a producer (and fencing replaced ones first) when needed."""
        writer_id = self.writer_id
        if writer_id is not None and self._producer is not None:
            return writer_id
        with self._init_lock:
            if self._producer is not None and self.writer_id is not None:
                return self.writer_id
            for old in list(self._to_fence):
                self._log._fence(old, deadline)
                self._to_fence.remove(old)
                self._log._dead.add(old)
            writer_id = f"{self._log.topic}/writer/{self.number}/{uuid.uuid4().hex}"
            producer = self._log._new_producer(writer_id, self._log._group_config)
            try:
                producer.init_transactions(self._log._remaining(deadline))
            except KafkaException as exc:
                producer.flush(0)
                raise self._log._unavailable("initializing the transactional writer", exc) from exc
            self._producer, self.writer_id = producer, writer_id
            self._log._mine.add(writer_id)
            return writer_id

    def submit(self, request: _Request) -> None:
        with self._cond:
            if self._closed:
                raise StoreUnavailable("this KafkaEventLog is closed")
            self._queue.append(request)
            self._cond.notify()

    def producer(self) -> Producer | None:
        return self._producer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._committer.shutdown()
        with self._init_lock:
            if self._producer is not None:
                self._producer.flush(0)
            self._producer = None

    # -- the writer thread

    def _run(self) -> None:
        committing: tuple[Future[None], list[_Request], str] | None = None
        while True:
            group: list[_Request] = []
            try:
                with self._cond:
                    while not self._queue and not self._prepared and not self._closed and committing is None:
                        self._cond.wait()
                while self._prepare_one():
                    pass
                if committing is not None:
                    settling, committing = committing, None
                    self._settle(*settling)
                events = 0
                while self._prepared and (not group or events + len(self._prepared[0].values) <= _GROUP_MAX_EVENTS):
                    group.append(self._prepared.popleft())
                    events += len(group[-1].values)
                self._prepared_events -= events
                if group:
                    committing = self._start(group)
                elif self._closed:
                    with self._cond:
                        if not self._queue:
                            return  # closed, and nothing is queued or under way
            except Exception as exc:  # a fault of the writer itself: fail what it holds, never leave appends hanging
                held = [*group, *self._prepared, *(committing[1] if committing is not None else [])]
                committing = None
                self._fault(exc, held)

    def _fault(self, exc: Exception, requests: list[_Request]) -> None:
        _LOG.error("the Kafka writer failed (%r); failing the %d appends it held", exc, len(requests))
        self._prepared.clear()
        self._prepared_events = 0
        writer_id = self.writer_id
        if writer_id is not None:
            self._replace(writer_id, fenced=False)  # its transaction's state is unknown: the next writer fences it
        for r in requests:
            if not r.done.is_set():
                r.error = StoreUnavailable(
                    f"the Kafka writer failed ({exc!r}); the outcome is unknown — re-read the session head "
                    "before retrying"
                )
                r.done.set()

    def _prepare_one(self) -> bool:
        """Prepare the next queued append for the next group; False when none is queued (or enough are ready)."""
        with self._cond:
            if not self._queue or self._prepared_events >= _GROUP_MAX_EVENTS:
                return False
            request = self._queue.popleft()
        if request.prepare(self._log):
            self._prepared.append(request)
            self._prepared_events += len(request.values)
        else:
            request.done.set()
        return True

    def _start(self, batch: list[_Request]) -> tuple[Future[None], list[_Request], str] | None:
        """Send a prepared group and hand its commit to the committing thread (None: settled already)."""
        producer, writer_id = self._producer, self.writer_id
        live = [r for r in batch if producer is not None and r.writer == writer_id]
        for r in batch:
            if r not in live:
                r.error = _Retry()
                r.done.set()
        if not live or producer is None or writer_id is None:
            return None
        try:
            deadline = self._send(producer, writer_id, live)
        except BaseException as exc:
            self._failed(writer_id, live, exc)
            return None
        return self._committer.submit(self._end, producer, writer_id, deadline), live, writer_id

    def _settle(self, commit: Future[None], requests: list[_Request], writer_id: str) -> None:
        try:
            commit.result()
        except BaseException as exc:
            self._failed(writer_id, requests, exc)
            return
        for r in requests:
            r.done.set()

    def _failed(self, writer_id: str, requests: list[_Request], exc: BaseException) -> None:
        """Every waiting append learns the outcome."""
        if not isinstance(exc, (_Retry, StoreUnavailable)):
            self._replace(writer_id, fenced=False)  # its transaction's state is unknown
        for r in requests:
            r.error = _copy_error(exc)
            r.done.set()

    def _replace(self, writer_id: str, *, fenced: bool) -> None:
        """Stop using the producer ``writer_id``: fenced by a take-over, or its last outcome unknown."""
        with self._init_lock:
            if self.writer_id != writer_id:
                return
            producer, self._producer, self.writer_id = self._producer, None, None
            if fenced:
                self._log._dead.add(writer_id)
            else:
                self._to_fence.append(writer_id)
        if producer is not None:
            try:
                producer.flush(0)
            except KafkaException as exc:
                _LOG.debug("discarding writer %s: %s", writer_id, exc)

    def _commit(self, producer: Producer, writer_id: str, requests: list[_Request]) -> None:
        """One transaction, start to end, in the calling thread."""
        self._end(producer, writer_id, self._send(producer, writer_id, requests))

    def _send(self, producer: Producer, writer_id: str, requests: list[_Request]) -> float:
        """Begin a transaction with every request's events and index entry; returns its deadline."""
        try:
            return self._produce(producer, writer_id, requests, every=False)
        except _NotContiguous:
            return self._produce(producer, writer_id, requests, every=True)

    def _produce(self, producer: Producer, writer_id: str, requests: list[_Request], *, every: bool) -> float:
        """Every request's events, then (once their offsets are known) its index entry; not committed."""
        log = self._log
        deadline = time.monotonic() + log.timeout_s
        by_part: dict[int, list[_Request]] = {}
        for r in requests:
            by_part.setdefault(r.part, []).append(r)
        with self._failures(producer, writer_id):
            producer.begin_transaction()
            produce, topic = producer.produce, log.topic
            reports: dict[int, _Reports] = {}
            for part, group in by_part.items():
                rep = reports[part] = _Reports()
                last_i = sum(len(r.values) for r in group) - 1
                i = 0
                for r in group:
                    self._batch += 1
                    headers: list[tuple[str, str | bytes | None]] = [
                        (HEADER_KIND, KIND_EVENT),
                        (HEADER_EPOCH, str(r.epoch).encode()),
                        (HEADER_BATCH, f"{writer_id}#{self._batch}".encode()),
                    ]
                    for value in r.values:
                        if every:
                            cb: Any = rep.on_each
                        else:
                            cb = rep.on_first if i == 0 else rep.on_last if i == last_i else None
                        produce(topic, value=value, key=r.session_id, partition=part, headers=headers, on_delivery=cb)
                        i += 1
            # The index entries name the events' offsets, so they follow the events' acknowledgements.
            # Until those arrive, the next group is prepared (serving reports between appends).
            totals = {part: sum(len(r.values) for r in group) for part, group in by_part.items()}
            while not all(reports[p].complete(totals[p], every) for p in by_part):
                if time.monotonic() >= deadline:
                    raise _Abort(None, "the broker did not acknowledge the batch in time")
                # each poll hands the interpreter lock to whichever thread wants it: not after every append
                if all(self._prepare_one() for _ in range(_PREPARE_BETWEEN_POLLS)):
                    producer.poll(0)
                elif _flush(producer, max(0.0, deadline - time.monotonic())):
                    raise _Abort(None, "the broker did not acknowledge the batch in time")
            for part, group in by_part.items():
                rep = reports[part]
                if rep.error is not None:
                    raise _Abort(rep.error, "the broker rejected a record")
                total = sum(len(r.values) for r in group)
                if every:
                    if len(rep.offsets) != total:
                        raise _Abort(None, "missing delivery reports")
                    offsets = rep.offsets
                else:
                    first = rep.first
                    last = first if total == 1 else rep.last
                    if first is None or last is None:
                        raise _Abort(None, "missing delivery reports")
                    if last - first + 1 != total:
                        raise _NotContiguous()
                    offsets = list(range(first, first + total))
                at = 0
                for r in group:
                    r.offsets = offsets[at : at + len(r.values)]
                    at += len(r.values)
            for r in requests:
                r.entry, r.chunk = _next_entry(r.base, r.epoch, writer_id, r.offsets)
                if r.chunk is not None:
                    producer.produce(
                        log.index_topic,
                        value=_encode_chunk(r.base.chunks, r.chunk),
                        key=_chunk_key(r.session_id, r.base.chunks),
                        partition=r.part,
                    )
                producer.produce(log.index_topic, value=_encode_index(r.entry), key=r.session_id, partition=r.part)
        return deadline

    def _end(self, producer: Producer, writer_id: str, deadline: float) -> None:
        with self._failures(producer, writer_id):
            producer.commit_transaction(max(0.001, deadline - time.monotonic()))

    @contextmanager
    def _failures(self, producer: Producer, writer_id: str) -> Iterator[None]:
        """What a failure inside the open transaction means for the writer, raised as what callers see."""
        log = self._log
        try:
            yield
        except _NotContiguous:
            self._abort(producer, writer_id)
            if self.writer_id != writer_id:
                raise StoreUnavailable(
                    "the group transaction could not be aborted; nothing was written — retry"
                ) from None
            raise
        except _Abort as exc:
            if exc.err is not None and (exc.err.code() in _FENCED_CODES or exc.err.fatal()):
                self._replace(writer_id, fenced=exc.err.code() in _FENCED_CODES)
                if exc.err.code() in _FENCED_CODES:
                    raise _Retry() from exc
                raise StoreUnavailable(f"Kafka writer failed ({exc}); nothing was written — retry") from None
            self._abort(producer, writer_id)
            raise StoreUnavailable(
                f"append was not acknowledged ({exc}); it was aborted and nothing was written — retry"
            ) from None
        except KafkaException as exc:
            err = _error(exc)
            if err is not None and err.code() in _FENCED_CODES:
                self._replace(writer_id, fenced=True)
                raise _Retry() from exc
            if err is not None and err.txn_requires_abort() and not err.fatal():
                self._abort(producer, writer_id)
                raise log._unavailable("appending (aborted; nothing was written — retry)", exc) from exc
            # Timed out or failed while committing: the outcome is unknown until this producer is fenced,
            # which the next writer does before it starts; the sessions are then re-read.
            self._replace(writer_id, fenced=False)
            raise StoreUnavailable(
                f"Kafka did not confirm the append within {log.timeout_s:g}s ({exc}); the outcome is unknown — "
                "re-read the session head before retrying"
            ) from exc
        except BufferError as exc:
            self._abort(producer, writer_id)
            raise StoreUnavailable(f"the producer queue is full ({exc}); nothing was written — retry") from exc

    def _abort(self, producer: Producer, writer_id: str) -> None:
        try:
            producer.abort_transaction(min(self._log.timeout_s, 5.0))
        except KafkaException:
            self._replace(writer_id, fenced=False)  # the next writer fences it, which aborts it


class _Abort(Exception):
    def __init__(self, err: KafkaError | None, message: str) -> None:
        self.err = err
        super().__init__(f"{message}: {err}" if err is not None else message)


class _Solo(_Writer):
    """One session's own transactional producer (``<topic>:<session>``), committing that session alone.

    A session taken over from another instance is written this way: when two instances hand a session
    back and forth (a loop and its dispatcher), each hand-over then fences only that session's producer
    — one ``init_transactions`` — instead of the other instance's whole group writer.
    """

    def __init__(self, log: KafkaEventLog, producer: Producer, transactional_id: str) -> None:
        self._log = log
        self.number = -1
        self._init_lock = threading.Lock()
        self._producer = producer
        self.writer_id = transactional_id
        self._to_fence = []
        self._closed = False
        self._batch = 0

    def commit(self, request: _Request) -> None:
        """Commit one append in its own transaction (in the caller's thread); the outcome lands on it."""
        producer, writer_id = self._producer, self.writer_id
        if producer is None or writer_id is None:
            request.error = _Retry()
            return
        if not request.prepare(self._log):
            return
        try:
            self._commit(producer, writer_id, [request])
        except (_Retry, StoreUnavailable) as exc:
            request.error = exc

    def _prepare_one(self) -> bool:
        return False  # one append at a time, prepared by ``commit``

    def _replace(self, writer_id: str, *, fenced: bool) -> None:
        # the next init_transactions on this id (the next take-over) settles whatever is open
        producer, self._producer, self.writer_id = self._producer, None, None
        if producer is not None:
            try:
                producer.flush(0)
            except KafkaException as exc:
                _LOG.debug("discarding session producer %s: %s", writer_id, exc)

    def close(self) -> None:
        if self.writer_id is not None:
            self._replace(self.writer_id, fenced=False)


class _SessionLock:
    """One session's lock in :attr:`KafkaEventLog._session_locks`, dropped when its last user leaves."""

    __slots__ = ("_lock", "_log", "_session_id")

    def __init__(self, log: KafkaEventLog, session_id: str) -> None:
        self._log = log
        self._session_id = session_id
        self._lock: threading.Lock | None = None

    def __enter__(self) -> None:
        locks = self._log._session_locks
        with self._log._locks_lock:
            lock, users = locks.get(self._session_id, (None, 0))
            if lock is None:
                lock = threading.Lock()
            locks[self._session_id] = (lock, users + 1)
        self._lock = lock
        lock.acquire()

    def __exit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()
        locks = self._log._session_locks
        with self._log._locks_lock:
            lock, users = locks[self._session_id]
            if users == 1:
                del locks[self._session_id]
            else:
                locks[self._session_id] = (lock, users - 1)


@dataclass(slots=True)
class _Owned:
    """A session this instance owns: its exact state and validation rules, valid while its writer lives.

    ``writer`` is the group writer's id, or (with ``solo``) the session's own transactional id.
    """

    writer: str
    state: _State
    rules: LogRules | None = None
    solo: _Solo | None = None

    def live(self, group_writer: str) -> bool:
        if self.solo is not None:
            return self.solo.writer_id is not None
        return self.writer == group_writer


# ---------------------------------------------------------------- the adapter


class KafkaEventLog(EventLog):
    """:class:`~foldline.ports.event_log.EventLog` on Kafka; see the module docstring and docs/KAFKA.md.

    Thread-safe: appends from many threads (any sessions) are committed together. ``timeout_s`` bounds
    every broker wait of one call (metadata, take-over, reads) and every group transaction: a broker
    that does not answer makes the call fail with :class:`~foldline.errors.StoreUnavailable` (an
    append within about ``2 * timeout_s``). ``max_writers`` is how many owned sessions keep their state
    and validation rules warm (LRU); a session evicted from it is re-read on its next append.
    ``writers`` transactional producers share the partitions (writer ``k`` commits partitions
    ``p % writers == k``): more writers mean more transactions in flight and a smaller share of
    sessions disturbed when another instance takes one over.
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
        max_writers: int = 4096,
        create_topics: bool = True,
        client_config: Mapping[str, Any] | None = None,
        writers: int = 1,
    ) -> None:
        if partitions < 1:
            raise ConfigError("partitions must be >= 1")
        if max_writers < 1:
            raise ConfigError("max_writers must be >= 1")
        if writers < 1:
            raise ConfigError("writers must be >= 1")
        self._writer_count = writers
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
            "socket.nagle.disable": True,
            # librdkafka's own log lines (e.g. "fenced by a newer instance") go to Python logging;
            # every failure reaches callers as a typed exception instead.
            "logger": _LOG,
            **(client_config or {}),
        }
        # the group writer batches (linger) and keeps many records in flight; take-over and fencing
        # producers send one small transaction each
        self._group_config: dict[str, Any] = {
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }
        self._session_config: dict[str, Any] = {"linger.ms": 0}
        self._ready_lock = threading.Lock()
        self._ready = False
        self._closed = False
        self._read_lock = threading.RLock()  # the reading consumers and the index position
        self._consumers_lock = threading.Lock()  # opening consumers (watermarks are asked outside the read lock)
        self._index_lock = threading.Lock()  # _index entries
        self._owned_lock = threading.Lock()
        self._locks_lock = threading.Lock()
        self._session_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._taking_over = threading.BoundedSemaphore(_MAX_TAKE_OVERS)
        self._owned: OrderedDict[str, _Owned] = OrderedDict()
        self._index: dict[str, _Entry] = {}
        self._chunks: dict[str, dict[int, list[list[int]]]] = {}
        self._index_pos: dict[int, int] = {}
        self._consumers: dict[str, Consumer] = {}
        self._writers: list[_Writer] = []
        self._dead: set[str] = set()  # writer ids known to be fenced: taking their sessions needs no fencing
        self._mine: set[str] = set()  # this instance's group writer ids, past and present

    # -------------------------------------------------------------- EventLog

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if not events:
            return self.head(session_id)
        self._ensure_ready()
        deadline = time.monotonic() + self.timeout_s
        part = partition_for(session_id, self.partitions)
        writer = self._writer_for(part)
        with self._session_lock(session_id):
            fresh = False
            while True:
                owned, loaded = self._own(session_id, deadline, expected_seq=expected_seq, lease=lease)
                fresh = fresh or loaded
                state = owned.state
                if (lease is not None and lease.epoch != state.epoch) or expected_seq != state.next_seq:
                    if not fresh:
                        # This state may predate another instance's take-over: read it again first.
                        self._disown(session_id)
                        fresh = True
                        continue
                    if lease is not None and lease.epoch != state.epoch:
                        raise FencedError(session_id, lease.epoch, state.epoch)
                    raise ConflictError(session_id, expected_seq, state.next_seq)
                if owned.rules is None:
                    owned.rules = self._rules_for(session_id, state, deadline)
                # encoded and checked by the writer: a refused batch sends nothing and leaves the rules as they were
                request = _Request(session_id, part, state.epoch, state, events, owned.rules, owned.writer)
                if owned.solo is not None:
                    owned.solo.commit(request)
                    request.done.set()
                else:
                    try:
                        writer.submit(request)
                    except BaseException:
                        self._disown(session_id)
                        raise
                if not request.done.wait(2 * (self.timeout_s + 5.0) + 1.0):
                    # The commit thread bounds every transaction, so this is a stuck client: give up on
                    # this writer (the next one fences it, which settles the transaction) and report.
                    self._disown(session_id)
                    writer._replace(owned.writer, fenced=False)
                    raise StoreUnavailable(
                        f"Kafka did not confirm the append to session {session_id!r}; the outcome is unknown — "
                        "re-read the session head before retrying"
                    )
                if isinstance(request.error, _Retry):
                    # Our writer was fenced by another instance's take-over: nothing of it was written.
                    self._disown(session_id)
                    if time.monotonic() >= deadline:
                        raise StoreUnavailable(
                            f"append to session {session_id!r}: the writer was fenced again and again for "
                            f"{self.timeout_s:g}s (other instances keep taking the session over); nothing was written"
                        )
                    fresh = True
                    continue
                if request.refused:
                    assert request.error is not None
                    raise request.error
                if request.error is not None:
                    self._disown(session_id)  # its rules already count the batch
                    raise request.error
                entry = request.entry
                assert entry is not None
                if request.chunk is not None:
                    with self._index_lock:
                        self._chunks.setdefault(session_id, {})[state.chunks] = request.chunk
                state.offsets.extend(request.offsets)
                state.chunks, state.sealed, state.tail = entry.chunks, entry.sealed, entry.tail
                self._remember(session_id, entry)
                return state.next_seq

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        self._ensure_ready()
        deadline = time.monotonic() + self.timeout_s
        state = self._load_state(session_id, deadline)
        end = state.next_seq if to_seq is None else min(to_seq, state.next_seq)
        if from_seq >= end:
            return []
        with self._read_lock:
            return self._fetch(session_id, state, max(from_seq, 0), end, deadline)

    def head(self, session_id: str) -> int:
        self._ensure_ready()
        return self._load_state(session_id, time.monotonic() + self.timeout_s).next_seq

    def sessions(self) -> list[str]:
        self._ensure_ready()
        with self._read_lock:
            deadline = time.monotonic() + self.timeout_s
            for p in range(self.partitions):
                self._catch_up_index(p, deadline)
            with self._index_lock:
                return sorted(s for s, st in self._index.items() if st.next_seq > 0)

    def acquire(self, session_id: str) -> WriterLease:
        self._ensure_ready()
        deadline = time.monotonic() + self.timeout_s
        with self._session_lock(session_id):
            owned, _ = self._own(session_id, deadline, new_epoch=True)
            return WriterLease(session_id, owned.state.epoch)

    def close(self) -> None:
        with self._ready_lock:
            if self._closed:
                return
            self._closed = True
        for writer in self._writers:
            writer.close()
        with self._owned_lock:
            solos = [o.solo for o in self._owned.values() if o.solo is not None]
            self._owned.clear()
        for solo in solos:
            solo.close()
        with self._read_lock:
            for consumer in self._consumers.values():
                consumer.close()

    # -------------------------------------------------------------- owning sessions

    def _session_lock(self, session_id: str) -> _SessionLock:
        """Serializes this instance's appends and take-overs of one session (other sessions go on)."""
        return _SessionLock(self, session_id)

    def _disown(self, session_id: str) -> None:
        with self._owned_lock:
            owned = self._owned.pop(session_id, None)
        if owned is not None and owned.solo is not None:
            owned.solo.close()

    def _own(
        self,
        session_id: str,
        deadline: float,
        *,
        expected_seq: int | None = None,
        lease: WriterLease | None = None,
        new_epoch: bool = False,
    ) -> tuple[_Owned, bool]:
        """The session's exact state under this instance's live writer, taking the session over if needed.

        Returns the owned entry and whether its state was read now. Raises :class:`FencedError` /
        :class:`ConflictError` when the committed state already rules the append out (before fencing
        anyone: a stale writer never disturbs the rightful one).
        """
        writer = self._writer_for(partition_for(session_id, self.partitions))
        while True:
            writer_id = writer.current(deadline)
            with self._owned_lock:
                owned = self._owned.get(session_id)
                if owned is not None and owned.live(writer_id) and not new_epoch:
                    self._owned.move_to_end(session_id)
                    return owned, False
            self._disown(session_id)
            state = self._load_state(session_id, deadline)
            if state.owner == writer_id and not new_epoch:
                # Nobody took it over since our writer last committed to it (a take-over fences our
                # writer first, and the next commit would fail): the committed state is exact.
                return self._keep(session_id, _Owned(writer_id, state)), True
            # Epochs and heads never go back: these refusals need no take-over.
            if lease is not None and lease.epoch != state.epoch:
                raise FencedError(session_id, lease.epoch, state.epoch)
            if expected_seq is not None and expected_seq < state.next_seq:
                raise ConflictError(session_id, expected_seq, state.next_seq)
            if not self._taking_over.acquire(timeout=self._remaining(deadline)):
                raise StoreUnavailable(
                    f"taking session {session_id!r} over: {_MAX_TAKE_OVERS} other take-overs kept every slot busy "
                    f"for {self.timeout_s:g}s"
                )
            try:
                state, solo = self._take_over(session_id, writer_id, deadline, expected_seq, lease, new_epoch)
            except _Retry:
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"taking session {session_id!r} over did not settle within {self.timeout_s:g}s: other "
                        "instances keep taking it over at the same time"
                    ) from None
                continue
            finally:
                self._taking_over.release()
            if solo is not None:
                return self._keep(session_id, _Owned(solo.writer_id or "", state, solo=solo)), True
            return self._keep(session_id, _Owned(writer_id, state)), True

    def _keep(self, session_id: str, owned: _Owned) -> _Owned:
        evicted: list[_Owned] = []
        with self._owned_lock:
            self._owned[session_id] = owned
            self._owned.move_to_end(session_id)
            while len(self._owned) > self._max_writers:
                evicted.append(self._owned.popitem(last=False)[1])
            solos = [sid for sid, o in self._owned.items() if o.solo is not None]
            for sid in solos[: max(0, len(solos) - _MAX_SOLO)]:
                if sid != session_id and sid not in self._session_locks:  # not in the middle of an append
                    evicted.append(self._owned.pop(sid))
        for o in evicted:
            if o.solo is not None:
                o.solo.close()
        return owned

    def _take_over(
        self,
        session_id: str,
        writer_id: str,
        deadline: float,
        expected_seq: int | None,
        lease: WriterLease | None,
        new_epoch: bool,
    ) -> tuple[_State, _Solo | None]:
        """Make this instance the session's owner (and, for ``acquire``, raise the lease epoch).

        1. ``init_transactions`` on the session's transactional id: concurrent take-overs of this session
           are serialized (the older one is fenced and fails its commit) and none is left half done;
           a previous owner writing through this same id is fenced by it.
        2. Read the session; fence its owner's producer if that is another one (``init_transactions``
           with the owner's id), which aborts the owner's open transaction and rejects all it sends
           from now on.
        3. Read the session again — exact now — check, and commit the new index entry (and the lease
           record) in the session's transaction.

        A new session, or one last written by this instance's group writer, joins the group writer. A
        session taken from another instance stays on its own producer (returned as ``_Solo``), so that
        handing it back and forth fences only that session.
        """
        part = partition_for(session_id, self.partitions)
        session_txid = f"{self.topic}:{session_id}"
        producer = self._new_producer(session_txid, self._session_config)
        keep = False
        try:
            try:
                producer.init_transactions(self._remaining(deadline))
            except KafkaException as exc:
                raise self._unavailable(f"taking session {session_id!r} over", exc) from exc
            state = self._load_state(session_id, deadline)
            previous = state.owner
            if previous not in (None, writer_id, session_txid) and previous not in self._dead:
                assert previous is not None
                self._fence(previous, deadline)
                self._dead.add(previous)
                state = self._load_state(session_id, deadline)
            if not new_epoch:
                if lease is not None and lease.epoch != state.epoch:
                    raise FencedError(session_id, lease.epoch, state.epoch)
                if expected_seq is not None and expected_seq != state.next_seq:
                    raise ConflictError(session_id, expected_seq, state.next_seq)
            solo = previous is not None and previous not in self._mine
            owner = session_txid if solo else writer_id
            entry = state.entry(state.epoch + (1 if new_epoch else 0), owner)
            try:
                producer.begin_transaction()
                if new_epoch:
                    producer.produce(
                        self.topic,
                        value=None,
                        key=session_id,
                        partition=part,
                        headers=[
                            (HEADER_KIND, KIND_LEASE),
                            (HEADER_EPOCH, str(entry.epoch).encode()),
                            (HEADER_BATCH, uuid.uuid4().hex.encode()),
                        ],
                    )
                producer.produce(self.index_topic, value=_encode_index(entry), key=session_id, partition=part)
                producer.commit_transaction(self._remaining(deadline))
            except KafkaException as exc:
                err = _error(exc)
                if err is not None and err.code() in _FENCED_CODES:
                    raise _Retry() from exc  # a concurrent take-over of this session won; read again
                raise self._unavailable(
                    f"taking session {session_id!r} over (the take-over may or may not have committed; "
                    "the next attempt settles it)",
                    exc,
                ) from exc
            self._remember(session_id, entry)
            state.epoch, state.owner = entry.epoch, owner
            keep = solo
            return state, _Solo(self, producer, session_txid) if solo else None
        finally:
            if not keep:
                producer.flush(0)

    def _fence(self, writer_id: str, deadline: float) -> None:
        """Fence the producer ``writer_id``: its open transaction is aborted, its later sends rejected."""
        producer = self._new_producer(writer_id, self._session_config)
        try:
            producer.init_transactions(self._remaining(deadline))
        except KafkaException as exc:
            raise self._unavailable(f"fencing the previous writer {writer_id}", exc) from exc
        finally:
            producer.flush(0)

    def _encode(self, events: Sequence[Envelope]) -> list[bytes]:
        encode = self.codec.encode
        values = []
        for e in events:
            value = encode(e)
            if len(value) > _MAX_RECORD_BYTES:
                raise ValidationError(
                    "record-size",
                    f"event seq {e.seq} encodes to {len(value):,} bytes, over the {_MAX_RECORD_BYTES:,}-byte Kafka "
                    "record limit; keep large content in attachments",
                    seq=e.seq,
                )
            values.append(value)
        return values

    def _rules_for(self, session_id: str, state: _State, deadline: float) -> LogRules:
        rules = LogRules()
        if state.next_seq:
            with self._read_lock:
                rules.check_batch(self._fetch(session_id, state, 0, state.next_seq, deadline))
        return rules

    def _remember(self, session_id: str, entry: _Entry) -> None:
        with self._index_lock:
            known = self._index.get(session_id)
            if known is None or (entry.epoch, entry.next_seq) >= (known.epoch, known.next_seq):
                self._index[session_id] = entry

    # -------------------------------------------------------------- topics and clients

    def _ensure_ready(self) -> None:
        if self._writers and not self._closed:
            return  # set once, under the lock below
        with self._ready_lock:
            if self._closed:
                raise StoreUnavailable("this KafkaEventLog is closed")
            if self._writers:
                return
            self._create_or_check_topics()
            self._writers = [_Writer(self, k) for k in range(min(self._writer_count, self.partitions))]

    def _writer_for(self, part: int) -> _Writer:
        """The writer of a partition: writer ``k`` commits partitions ``p`` with ``p % writers == k``."""
        return self._writers[part % len(self._writers)]

    def _create_or_check_topics(self) -> None:
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

    def _new_producer(self, transactional_id: str, extra: Mapping[str, Any]) -> Producer:
        try:
            return Producer(
                {
                    **self._base,
                    "transactional.id": transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "retry.backoff.ms": 2,
                    "retry.backoff.max.ms": 5,
                    # connect to the brokers at once: with sparse connections the coordinator lookup of
                    # init_transactions waited for the learned broker's connection (a reconnect backoff,
                    # 50 ms) or for librdkafka's 500 ms coordinator-query timer; 2 ms this way
                    "enable.sparse.connections": False,
                    "transaction.timeout.ms": self._transaction_timeout_ms,
                    "message.max.bytes": _MAX_MESSAGE_BYTES,
                    "message.timeout.ms": min(self._transaction_timeout_ms, max(1000, int(self.timeout_s * 1000))),
                    **extra,
                }
            )
        except KafkaException as exc:
            raise ConfigError(f"invalid Kafka producer configuration: {exc}") from exc

    # -------------------------------------------------------------- reading

    def _consumer(self, which: str) -> Consumer:
        with self._consumers_lock:
            return self._consumers.get(which) or self._open_consumer(which)

    def _open_consumer(self, which: str) -> Consumer:
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
                    # a read ends at the partition's end: the broker's answer that nothing follows the last
                    # record (and its transaction marker) should not wait long
                    "fetch.wait.max.ms": 1,
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
        """The session's committed state: its latest index entry with every event's offset.

        The index's end is taken before waiting for the read lock: a caller that finds another thread
        already caught up past it (readers waiting behind one catch-up) reads no further.
        """
        part = partition_for(session_id, self.partitions)
        high = self._watermark(part, deadline, self.index_topic)
        with self._read_lock:
            self._catch_up_index(part, deadline, high)
            with self._index_lock:
                entry = self._index.get(session_id)
                chunks = dict(self._chunks.get(session_id, {}))
            if entry is None:
                return _State()
            offsets: list[int] = []
            for n in range(entry.chunks):
                runs = chunks.get(n)
                if runs is None:
                    raise FormatError("kafka-index", f"session {session_id!r}: index chunk {n} is missing")
                offsets.extend(_expand(runs))
            if len(offsets) != entry.sealed:
                raise FormatError(
                    "kafka-index",
                    f"session {session_id!r}: index chunks hold {len(offsets)} offsets, not {entry.sealed}",
                )
            tail = [list(r) for r in entry.tail]
            offsets.extend(_expand(tail))
            if entry.pending is not None:
                found = self._scan_batch(session_id, part, entry.pending, deadline)
                offsets.extend(found)
                _runs(found, tail)
            return _State(entry.epoch, offsets, entry.owner, entry.chunks, entry.sealed, tail)

    def _catch_up_index(self, part: int, deadline: float, high: int | None = None) -> None:
        # Read up to a high watermark taken after the call began (not the last stable offset): an append
        # that returned before the call is then visible, even while its transaction markers are still
        # being written.
        if high is None:
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
            mark = key.find(_CHUNK_MARK)
            if mark >= 0:  # a sealed chunk of offsets: written once, never replaced
                chunk = _decode_chunk(value)
                with self._index_lock:
                    self._chunks.setdefault(key[:mark].decode(), {})[int(key[mark + 1 :])] = chunk
            else:
                # entries only grow (epoch, head); never step back to an older one this process already knows
                self._remember(key.decode(), _decode_index(value))
        self._index_pos[part] = high

    def _consume(
        self, consumer: Consumer, topic: str, part: int, *, start: int, end: int, deadline: float
    ) -> Iterable[Message]:
        """Committed records of ``topic[part]`` from ``start`` until the read position reaches ``end``."""
        consumer.assign([TopicPartition(topic, part, start)])
        try:
            while True:
                # consume() waits for the whole batch or the timeout, whichever comes first: a short timeout
                # returns what the last fetch brought (a read is usually a few records, then end of partition)
                batch = consumer.consume(1000, timeout=min(0.001, max(0.0, self._remaining(deadline))))
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

    # -------------------------------------------------------------- helpers

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailable(f"Kafka at {self.bootstrap} did not answer within {self.timeout_s:g}s")
        return left

    def _unavailable(self, what: str, exc: KafkaException) -> StoreUnavailable:
        return StoreUnavailable(f"Kafka at {self.bootstrap} failed while {what}: {exc}")
