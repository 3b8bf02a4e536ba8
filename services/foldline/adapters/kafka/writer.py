"""Committing appends: the group writer (many sessions per transaction) and a session's own writer.

The log hands each append to a :class:`Committer`: either this instance's :class:`GroupWriter` — two
transactional producers taking turns and the thread that commits queued appends in groups — or, for a session taken
over from another instance, that session's :class:`SessionWriter` (``<topic>:<session>``), which
commits one append per transaction in the caller's thread. Both send a group the same way: the events,
partition by partition, then (once their offsets are known) one index entry per session, in one
transaction. docs/KAFKA.md, "Group commit" and "Hand-overs between instances".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ...backoff import Backoff
from ...core.events import Envelope
from ...core.validation import LogRules
from ...errors import StoreUnavailable
from .clients import FENCED_CODES, GROUP_PRODUCER, KafkaClients, discard, flush, kafka_error
from .index import IndexEntry, SessionState, chunk_key, encode_chunk, encode_index, next_entry
from .records import HEADER_BATCH, HEADER_EPOCH, HEADER_KIND, KIND_EVENT

__all__ = [
    "AppendRequest",
    "Committer",
    "GroupWriter",
    "Retry",
    "SessionWriter",
    "WriterContext",
    "WriterIds",
    "WriterTimes",
    "alternate_id",
    "producer_ids",
]

_LOG = logging.getLogger("foldline.kafka")
_GROUP_MAX_EVENTS = 20_000  # events per group transaction
_PREPARE_BETWEEN_POLLS = 8  # appends the writer prepares between two polls for delivery reports


class Retry(Exception):
    """The writer that was to commit this batch is gone (fenced or replaced); nothing was written."""


@dataclass(slots=True)
class WriterIds:
    """Transactional ids this log instance knows about."""

    dead: set[str] = field(default_factory=set)  # known to be fenced: taking their sessions needs no fencing
    mine: set[str] = field(default_factory=set)  # this instance's group writer ids, past and present


@dataclass(frozen=True, slots=True)
class WriterContext:
    """What the writers need from their log: clients, topics, the event encoder, the known writer ids."""

    clients: KafkaClients
    topic: str
    index_topic: str
    encode: Callable[[Sequence[Envelope], Sequence[Envelope]], list[bytes]]  # (events, as stored) -> records
    ids: WriterIds


class _Done:
    """A one-shot signal from the writer to the appending thread: a lock held until the outcome is set
    (a ``threading.Event`` costs a condition variable and a waiter lock per append). ``callback``, when
    given, is called (in the settling thread) once the outcome is set — how an asyncio caller is woken."""

    __slots__ = ("_is_set", "_lock", "callback")

    def __init__(self) -> None:
        self._is_set = False
        self._lock = threading.Lock()
        self._lock.acquire()
        self.callback: Callable[[], object] | None = None

    def set(self) -> None:
        """Wake the waiter (once; only the thread that settles the append calls this)."""
        if not self._is_set:
            self._is_set = True
            self._lock.release()
            if self.callback is not None:
                self.callback()

    def is_set(self) -> bool:
        return self._is_set

    def wait(self, timeout: float) -> bool:
        return self._lock.acquire(timeout=timeout)


class AppendRequest:
    """One append waiting for its transaction: its events and, once prepared, their records;
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
        "queued_at",
        "refused",
        "rules",
        "session_id",
        "stored",
        "values",
        "writer",
    )

    def __init__(
        self,
        session_id: str,
        part: int,
        epoch: int,
        base: SessionState,
        events: Sequence[Envelope],
        rules: LogRules,
        writer: str,
        stored: Sequence[Envelope] | None = None,
    ) -> None:
        self.session_id = session_id
        self.stored = events if stored is None else stored  # the events as recorded (content sealed, or not)
        self.part = part
        self.epoch = epoch
        self.base = base
        self.events = events
        self.rules = rules
        self.writer = writer
        self.values: list[bytes] = []
        self.offsets: list[int] = []
        self.entry: IndexEntry | None = None
        self.chunk: list[list[int]] | None = None
        self.error: BaseException | None = None
        self.refused = False
        self.done = _Done()
        self.queued_at = 0.0  # when the writer took it (perf_counter)

    def prepare(self, encode: Callable[[Sequence[Envelope], Sequence[Envelope]], list[bytes]]) -> bool:
        """Encode the events and check them against the session's rules (which then count them).

        False, with the error set, when either refuses the batch: nothing of it is sent and the rules
        are unchanged (the check is all-or-nothing).
        """
        try:
            self.values = encode(self.events, self.stored)
            self.rules.check_batch(self.events)
        except Exception as exc:  # ValidationError / FormatError: handed to the appending thread as is
            self.error, self.refused = exc, True
            return False
        return True


class Committer(Protocol):
    """What the log hands an append to (a :class:`GroupWriter` or a :class:`SessionWriter`)."""

    @property
    def writer_id(self) -> str | None:
        """The transactional id appends are committed under; None once the producer was dropped."""

    def send(self, request: AppendRequest) -> None:
        """Take the append; ``request.done`` is set once its outcome (offsets or error) is on it."""

    def replace(self, writer_id: str, *, fenced: bool) -> None:
        """Stop using the producer ``writer_id``: fenced by a take-over, or its last outcome unknown."""

    def close(self) -> None: ...


@dataclass(slots=True)
class WriterTimes:
    """Where a group writer's appends spent their time, summed over appends (divide by ``appends`` for the
    mean per append): ``queued`` from ``send`` to its group's start (waiting for the previous group's commit,
    and being prepared), ``acked`` from the group's start to every record acknowledged and the index entries
    produced, ``committed`` in ``commit_transaction``, ``woken`` from the commit's end to the waiting append
    being told (the writer thread finishing what it was doing)."""

    groups: int = 0
    appends: int = 0
    queued_s: float = 0.0
    acked_s: float = 0.0
    committed_s: float = 0.0
    woken_s: float = 0.0

    def add(self, other: WriterTimes) -> None:
        self.groups += other.groups
        self.appends += other.appends
        self.queued_s += other.queued_s
        self.acked_s += other.acked_s
        self.committed_s += other.committed_s
        self.woken_s += other.woken_s

    def subtract(self, other: WriterTimes) -> None:
        self.groups -= other.groups
        self.appends -= other.appends
        self.queued_s -= other.queued_s
        self.acked_s -= other.acked_s
        self.committed_s -= other.committed_s
        self.woken_s -= other.woken_s

    def to_json(self) -> dict[str, float | int]:
        """Counts, and each part's mean per append in milliseconds."""
        n = max(self.appends, 1)
        return {
            "groups": self.groups,
            "appends": self.appends,
            "appends_per_group": round(self.appends / max(self.groups, 1), 2),
            "queued_ms": round(1000 * self.queued_s / n, 3),
            "acked_ms": round(1000 * self.acked_s / n, 3),
            "committed_ms": round(1000 * self.committed_s / n, 3),
            "woken_ms": round(1000 * self.woken_s / n, 3),
        }


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
    """Another producer's records landed between ours; redo the transaction with every offset reported."""


class _Abort(Exception):
    def __init__(self, err: KafkaError | None, message: str) -> None:
        self.err = err
        super().__init__(f"{message}: {err}" if err is not None else message)


def _copy_error(exc: BaseException) -> BaseException:
    """A fresh exception per waiting append (one instance must not be raised in several threads)."""
    if isinstance(exc, Retry):
        return Retry()
    if isinstance(exc, StoreUnavailable):
        return StoreUnavailable(str(exc))
    return StoreUnavailable(f"Kafka writer failed: {exc!r}; the outcome is unknown — re-read the session head")


# ---------------------------------------------------------------- one transaction


class _TransactionalWriter:
    """A transactional producer and how it commits one group of prepared appends."""

    def __init__(self, context: WriterContext, producer: Producer | None, writer_id: str | None) -> None:
        self._context = context
        self._init_lock = threading.Lock()
        self._producer = producer
        self.writer_id = writer_id
        self._batch = 0  # batch ids: <writer id>#<n>

    def producer(self) -> Producer | None:
        return self._producer

    def replace(self, writer_id: str, *, fenced: bool) -> None:
        raise NotImplementedError

    def _prepare_one(self) -> bool:
        """Prepare one more queued append while a transaction waits for the broker (the group writer's)."""
        return False

    def _commit(self, producer: Producer, writer_id: str, requests: list[AppendRequest]) -> None:
        """One transaction, start to end, in the calling thread."""
        self._end(producer, writer_id, self._send(producer, writer_id, requests))

    def _send(self, producer: Producer, writer_id: str, requests: list[AppendRequest]) -> float:
        """Begin a transaction with every request's events and index entry; returns its deadline."""
        try:
            return self._produce(producer, writer_id, requests, every=False)
        except _NotContiguous:
            return self._produce(producer, writer_id, requests, every=True)

    def _produce(self, producer: Producer, writer_id: str, requests: list[AppendRequest], *, every: bool) -> float:
        """Every request's events, then (once their offsets are known) its index entry; not committed."""
        ctx = self._context
        deadline = time.monotonic() + ctx.clients.timeout_s
        by_part: dict[int, list[AppendRequest]] = {}
        for r in requests:
            by_part.setdefault(r.part, []).append(r)
        with self._failures(producer, writer_id):
            producer.begin_transaction()
            produce, topic = producer.produce, ctx.topic
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
                elif flush(producer, max(0.0, deadline - time.monotonic())):
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
                r.entry, r.chunk = next_entry(r.base, r.epoch, writer_id, r.offsets)
                if r.chunk is not None:
                    producer.produce(
                        ctx.index_topic,
                        value=encode_chunk(r.base.chunks, r.chunk),
                        key=chunk_key(r.session_id, r.base.chunks),
                        partition=r.part,
                    )
                producer.produce(ctx.index_topic, value=encode_index(r.entry), key=r.session_id, partition=r.part)
        return deadline

    def _end(self, producer: Producer, writer_id: str, deadline: float) -> None:
        with self._failures(producer, writer_id):
            producer.commit_transaction(max(0.001, deadline - time.monotonic()))

    @contextmanager
    def _failures(self, producer: Producer, writer_id: str) -> Iterator[None]:
        """What a failure inside the open transaction means for the writer, raised as what callers see."""
        clients = self._context.clients
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
            if exc.err is not None and (exc.err.code() in FENCED_CODES or exc.err.fatal()):
                self.replace(writer_id, fenced=exc.err.code() in FENCED_CODES)
                if exc.err.code() in FENCED_CODES:
                    raise Retry() from exc
                raise StoreUnavailable(f"Kafka writer failed ({exc}); nothing was written — retry") from None
            self._abort(producer, writer_id)
            raise StoreUnavailable(
                f"append was not acknowledged ({exc}); it was aborted and nothing was written — retry"
            ) from None
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is not None and err.code() in FENCED_CODES:
                self.replace(writer_id, fenced=True)
                raise Retry() from exc
            if err is not None and err.txn_requires_abort() and not err.fatal():
                self._abort(producer, writer_id)
                raise clients.unavailable("appending (aborted; nothing was written — retry)", exc) from exc
            # Timed out or failed while committing: the outcome is unknown until this producer is fenced,
            # which the next writer does before it starts; the sessions are then re-read.
            self.replace(writer_id, fenced=False)
            raise StoreUnavailable(
                f"Kafka did not confirm the append within {clients.timeout_s:g}s ({exc}); the outcome is unknown — "
                "re-read the session head before retrying"
            ) from exc
        except BufferError as exc:
            self._abort(producer, writer_id)
            raise StoreUnavailable(f"the producer queue is full ({exc}); nothing was written — retry") from exc

    def _abort(self, producer: Producer, writer_id: str) -> None:
        try:
            producer.abort_transaction(min(self._context.clients.timeout_s, 5.0))
        except KafkaException:
            self.replace(writer_id, fenced=False)  # the next writer fences it, which aborts it


# ---------------------------------------------------------------- the group writer


class GroupWriter(_TransactionalWriter):
    """This instance's transactional producers and the thread that commits queued appends in groups.

    The writer thread prepares (encodes and checks) the appends queued since its last turn, sends them as
    one group — events, their acknowledgements, the index entries — and hands the group's
    ``commit_transaction`` to a committing thread. It has **two** producers and alternates between them:
    the next group is sent on the other producer while the broker commits the previous one, so an append
    that arrives during a commit does not wait for it, and a producer never begins a transaction while the
    coordinator still completes its previous one (which the broker answers ``CONCURRENT_TRANSACTIONS``,
    and librdkafka retries only after a fixed 20 ms). Appending threads only queue and wait, so the
    interpreter lock has few users while a group is under way (many appending threads contending for it
    slow every delivery report).

    Both producers commit under one **writer id**, ``writer_id`` (the first producer's ``transactional.id``;
    the second's is :func:`alternate_id` of it): index entries name it, and fencing it fences both
    (:func:`producer_ids`). It changes whenever the producers are replaced: after one was fenced, or after a
    commit whose outcome is unknown. Requests carry the id they were checked under; a request for an older
    id fails with :class:`Retry` and is taken over again by its caller. The events of two groups never
    interleave in a partition: a group is sent only once the previous one's events were acknowledged.
    """

    def __init__(self, context: WriterContext, number: int) -> None:
        super().__init__(context, None, None)
        self.number = number
        self._alternate: Producer | None = None  # the second producer (``alternate_id(writer_id)``)
        self._next = 0  # which producer the next group goes on (0: ``_producer``, 1: ``_alternate``)
        self._cond = threading.Condition()
        self._queue: deque[AppendRequest] = deque()
        self._to_fence: list[str] = []  # replaced ids whose last transaction may still be open
        self._closed = False
        self._prepared: deque[AppendRequest] = deque()  # the writer thread's: checked and encoded, for the next group
        self._prepared_events = 0
        self.times = WriterTimes()
        self._committer = ThreadPoolExecutor(2, thread_name_prefix=f"foldline-kafka-commit-{number}-{context.topic}")
        self._thread = threading.Thread(
            target=self._run, name=f"foldline-kafka-writer-{number}-{context.topic}", daemon=True
        )
        self._thread.start()

    # -- callers

    def ready_id(self) -> str | None:
        """The transactional id appends are committed under now, if its producer is started (no wait)."""
        writer_id = self.writer_id
        return writer_id if writer_id is not None and self._producer is not None else None

    def current(self, deadline: float) -> str:
        """The live writer id, initializing the producers (and fencing replaced ones first) when needed."""
        writer_id = self.writer_id
        if writer_id is not None and self._producer is not None:
            return writer_id
        ctx = self._context
        with self._init_lock:
            if self._producer is not None and self.writer_id is not None:
                return self.writer_id
            for old in list(self._to_fence):
                for txid in producer_ids(old):
                    ctx.clients.fence(txid, deadline)
                self._to_fence.remove(old)
                ctx.ids.dead.add(old)
            writer_id = f"{ctx.topic}/writer/{self.number}/{uuid.uuid4().hex}"
            producers: list[Producer] = []
            try:
                for txid in producer_ids(writer_id):
                    producers.append(ctx.clients.transactional_producer(txid, GROUP_PRODUCER))
                    _init(producers[-1], ctx.clients, deadline)
            except KafkaException as exc:
                for producer in producers:
                    discard(producer, f"writer {writer_id}")
                raise ctx.clients.unavailable("initializing the transactional writer", exc) from exc
            self._producer, self._alternate = producers
            self.writer_id = writer_id
            ctx.ids.mine.add(writer_id)
            return writer_id

    def send(self, request: AppendRequest) -> None:
        request.queued_at = time.perf_counter()
        with self._cond:
            if self._closed:
                raise StoreUnavailable("this KafkaEventLog is closed")
            self._queue.append(request)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._committer.shutdown()
        with self._init_lock:
            producers, self._producer, self._alternate = (self._producer, self._alternate), None, None
        for producer in producers:
            discard(producer, f"writer {self.writer_id}")

    def replace(self, writer_id: str, *, fenced: bool) -> None:
        with self._init_lock:
            if self.writer_id != writer_id:
                return
            producers = (self._producer, self._alternate)
            self._producer, self._alternate, self.writer_id = None, None, None
            if fenced:
                self._context.ids.dead.add(writer_id)
            else:
                self._to_fence.append(writer_id)
        for producer in producers:
            discard(producer, f"writer {writer_id}")

    # -- the writer thread

    def _run(self) -> None:
        committing: deque[_Commit] = deque()  # at most one per producer, oldest first
        while True:
            group: list[AppendRequest] = []
            try:
                with self._cond:
                    # wake for: a commit to settle, or appends to send while a producer is free
                    while (
                        not self._closed
                        and not (committing and committing[0].future.done())
                        and not ((self._queue or self._prepared) and len(committing) < 2)
                    ):
                        self._cond.wait()
                while self._prepare_one():
                    pass
                while committing and (committing[0].future.done() or self._closed):
                    committing.popleft().future.result()  # settled on its thread; a fault of it raises here
                events = 0
                while (
                    len(committing) < 2
                    and self._prepared
                    and (not group or events + len(self._prepared[0].values) <= _GROUP_MAX_EVENTS)
                ):
                    group.append(self._prepared.popleft())
                    events += len(group[-1].values)
                self._prepared_events -= events
                if group:
                    started = self._start(group)
                    if started is not None:
                        started.future.add_done_callback(self._wake)
                        committing.append(started)
                elif self._closed and not committing:
                    with self._cond:
                        if not self._queue:
                            return  # closed, and nothing is queued or under way
            except Exception as exc:  # a fault of the writer itself: fail what it holds, never leave appends hanging
                held = [*group, *self._prepared, *(r for c in committing for r in c.requests)]
                committing.clear()
                self._fault(exc, held)

    def _wake(self, _future: object) -> None:
        with self._cond:
            self._cond.notify()

    def _fault(self, exc: Exception, requests: list[AppendRequest]) -> None:
        _LOG.error("the Kafka writer failed (%r); failing the %d appends it held", exc, len(requests))
        self._prepared.clear()
        self._prepared_events = 0
        writer_id = self.writer_id
        if writer_id is not None:
            self.replace(writer_id, fenced=False)  # its transaction's state is unknown: the next writer fences it
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
        if request.prepare(self._context.encode):
            self._prepared.append(request)
            self._prepared_events += len(request.values)
        else:
            request.done.set()
        return True

    def _start(self, batch: list[AppendRequest]) -> _Commit | None:
        """Send a prepared group on the next producer and hand its commit to a committing thread (None:
        settled already). The caller has settled that producer's previous group."""
        started = time.perf_counter()
        with self._init_lock:
            writer_id = self.writer_id
            producer = self._producer if self._next == 0 else self._alternate
        live = [r for r in batch if producer is not None and r.writer == writer_id]
        for r in batch:
            if r not in live:
                r.error = Retry()
                r.done.set()
        if not live or producer is None or writer_id is None:
            return None
        self._next = 1 - self._next
        try:
            deadline = self._send(producer, writer_id, live)
        except BaseException as exc:
            self._failed(writer_id, live, exc)
            return None
        acked = time.perf_counter()
        with self._cond:
            times = self.times
            times.groups += 1
            times.appends += len(live)
            times.queued_s += sum(started - r.queued_at for r in live)
            times.acked_s += (acked - started) * len(live)
        future = self._committer.submit(self._commit_group, producer, writer_id, deadline, acked, live)
        return _Commit(future, live, writer_id)

    def _commit_group(
        self, producer: Producer, writer_id: str, deadline: float, began: float, requests: list[AppendRequest]
    ) -> None:
        """The group's commit, on a committing thread, and its appends told the outcome there at once (the
        writer thread may be waiting for another group's acknowledgements meanwhile)."""
        try:
            self._end(producer, writer_id, deadline)
        except BaseException as exc:
            self._failed(writer_id, requests, exc)
            return
        ended = time.perf_counter()
        for r in requests:
            r.done.set()
        woken = time.perf_counter()
        with self._cond:
            self.times.committed_s += (ended - began) * len(requests)
            self.times.woken_s += (woken - ended) * len(requests)

    def _failed(self, writer_id: str, requests: list[AppendRequest], exc: BaseException) -> None:
        """Every waiting append learns the outcome."""
        if not isinstance(exc, (Retry, StoreUnavailable)):
            self.replace(writer_id, fenced=False)  # its transaction's state is unknown
        for r in requests:
            r.error = _copy_error(exc)
            r.done.set()


def _init(producer: Producer, clients: KafkaClients, deadline: float) -> None:
    """``init_transactions``, tried again while the broker answers that it may succeed later (a coordinator
    still loading its partition of the transaction log, as on a fresh broker), until ``deadline``."""
    pauses = Backoff(0.05, 0.5).pauses()
    while True:
        try:
            producer.init_transactions(clients.remaining(deadline))
            return
        except KafkaException as exc:
            err = kafka_error(exc)
            pause = pauses.next()
            if err is None or not err.retriable() or time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)


@dataclass(frozen=True, slots=True)
class _Commit:
    """A group whose commit runs on a committing thread."""

    future: Future[None]
    requests: list[AppendRequest]
    writer_id: str


def alternate_id(writer_id: str) -> str:
    """The ``transactional.id`` of a group writer's second producer."""
    return writer_id + "/alt"


def producer_ids(owner: str) -> tuple[str, ...]:
    """The transactional ids that commit as ``owner``: a group writer's two producers, else ``owner`` alone.

    Fencing an owner fences each of them (a take-over, a replaced writer)."""
    if "/writer/" in owner and not owner.endswith("/alt"):
        return owner, alternate_id(owner)
    return (owner,)


# ---------------------------------------------------------------- a session's own writer


class SessionWriter(_TransactionalWriter):
    """One session's own transactional producer (``<topic>:<session>``), committing that session alone.

    A session taken over from another instance is written this way: when two instances hand a session
    back and forth (a loop and its dispatcher), each hand-over then fences only that session's producer
    — one ``init_transactions`` — instead of the other instance's whole group writer.
    """

    def send(self, request: AppendRequest) -> None:
        """Commit one append in its own transaction, in the caller's thread; the outcome lands on it."""
        self._commit_one(request)
        request.done.set()

    def _commit_one(self, request: AppendRequest) -> None:
        producer, writer_id = self._producer, self.writer_id
        if producer is None or writer_id is None:
            request.error = Retry()
            return
        if not request.prepare(self._context.encode):
            return
        try:
            self._commit(producer, writer_id, [request])
        except (Retry, StoreUnavailable) as exc:
            request.error = exc

    def replace(self, writer_id: str, *, fenced: bool) -> None:
        # the next init_transactions on this id (the next take-over) settles whatever is open
        producer, self._producer, self.writer_id = self._producer, None, None
        discard(producer, f"session producer {writer_id}")

    def close(self) -> None:
        if self.writer_id is not None:
            self.replace(self.writer_id, fenced=False)
