"""Creating new sessions in batches: one transaction per partition for every session created meanwhile.

A session that has no index entry yet has no owner to fence, so making it this instance's costs no
take-over — but two instances must not both create it. Creation goes through a transactional id per
*partition*, ``<topic>:create:<partition>``, shared by every instance:

1. ``init_transactions`` on it (once, and again after being fenced) fences whichever instance used it
   before: its open transaction is aborted and its later commits fail;
2. this instance then catches its view of the index partition up to the end — every creation committed
   before the ``init`` is in it — and keeps only the sessions that still have no entry. Until another
   instance initialises the id (which fails this instance's next commit, and this starts again at 1), no
   other creation can commit in the partition: the next batches check the view this instance already has
   (with its own creations remembered), without reading the index again;
3. one transaction writes, for each of them, the lease record (epoch 1) and an index entry naming this
   instance's group writer as the owner.

If another instance initialises the same id between 1 and 3, this commit fails (fenced): nothing of it is
visible, and the batch starts again at 1 — after which step 2 sees the other instance's creations. A
session found to exist is answered as such; the caller takes it over the usual way. Concurrent creations
of one partition in this instance wait for the transaction under way and then go together in the next,
so creating a thousand sessions costs tens of transactions, not a thousand take-overs.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import Executor, Future, InvalidStateError
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from ...backoff import Backoff
from ...errors import StoreUnavailable
from .clients import FENCED_CODES, SESSION_PRODUCER, KafkaClients, discard, kafka_error
from .index import IndexEntry, SessionState, encode_index
from .reader import SessionReader
from .records import HEADER_BATCH, HEADER_EPOCH, HEADER_KIND, KIND_LEASE

__all__ = ["SessionCreator"]

# A failed creation transaction (fenced by another instance creating in the same partition) is tried again
# after a random pause of 50 % to 150 % of 10 ms doubling to 200 ms: this schedule at 1.5x, cut by up to 2/3.
_RETRY = Backoff(initial_s=0.015, cap_s=0.3, jitter=2 / 3)


@dataclass(slots=True)
class _Creation:
    session_id: str
    owner: str
    epoch: int
    done: bool = False
    state: SessionState | None = None  # None when done: the session exists already
    error: BaseException | None = None
    future: Future[SessionState | None] | None = None  # a submitted creation's outcome (:meth:`submit`)
    deadline: float = 0.0  # a submitted creation's


class _Partition:
    """One partition's creator: its producer and the creations waiting for the next transaction."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.cond = threading.Condition()
        self.queue: list[_Creation] = []
        self.busy = False
        self.draining = False  # a drain job (:meth:`SessionCreator.submit`) is scheduled or running
        self.producer: Producer | None = None
        self.caught_up = False  # the index view was caught up since ``producer``'s init_transactions


def _settle(future: Future[SessionState | None], c: _Creation) -> None:
    """Give a submitted creation's outcome to its future, unless its caller gave up on it (cancelled: a session
    it created anyway is this instance's; the next acquire of it takes it over at a new epoch)."""
    try:
        if c.error is not None:
            future.set_exception(c.error)
        else:
            future.set_result(c.state)
    except InvalidStateError:
        pass


class SessionCreator:
    """Creates new sessions of one log's topics in batched transactions (see the module docstring)."""

    def __init__(self, clients: KafkaClients, reader: SessionReader, *, topic: str, index_topic: str) -> None:
        self._clients = clients
        self._reader = reader
        self._topic = topic
        self._index_topic = index_topic
        self._lock = threading.Lock()
        self._parts: dict[int, _Partition] = {}
        self.transactions = 0  # committed creation transactions (observability, tests)
        self._rng = random.Random()

    def create(self, session_id: str, part: int, owner: str, epoch: int, deadline: float) -> SessionState | None:
        """Create ``session_id`` (in partition ``part``) owned by ``owner`` at lease ``epoch``.

        Returns its state, or ``None`` when the session turned out to exist (another instance created it).
        """
        p = self._partition(part)
        mine = _Creation(session_id, owner, epoch)
        with p.cond:
            p.queue.append(mine)
            while not mine.done and p.busy:
                if not p.cond.wait(timeout=self._clients.remaining(deadline)):
                    raise StoreUnavailable(
                        f"creating session {session_id!r}: the creation transaction of partition {part} under way "
                        f"did not finish within {self._clients.timeout_s:g}s"
                    )
            if mine.done:
                return self._outcome(mine)
            batch, p.queue, p.busy = p.queue, [], True
        self._run_batch(p, part, batch, deadline, mine)
        return self._outcome(mine)

    def submit(
        self, session_id: str, part: int, owner: str, epoch: int, deadline: float, executor: Executor
    ) -> Future[SessionState | None]:
        """:meth:`create` without a waiting thread: the creation joins the partition's queue and its outcome
        comes as the future's (the state, ``None`` for a session that exists, or the error).

        A caller of :meth:`create` that commits a batch commits the submitted creations in it too; when no
        transaction of the partition is under way, one job on ``executor`` commits the queue batch after
        batch until it is empty. So a thousand sessions opened at once by one event loop wait on no thread
        each, and go in a few transactions per partition (every creation queued while one commits goes in
        the next) instead of batches as large as the number of threads that could wait.
        """
        p = self._partition(part)
        mine = _Creation(session_id, owner, epoch, future=Future(), deadline=deadline)
        assert mine.future is not None
        with p.cond:
            p.queue.append(mine)
            start = not p.draining
            p.draining = True
        if start:
            try:
                executor.submit(self._drain, p, part)
            except RuntimeError as exc:  # the executor was shut down: the log is closing
                with p.cond:
                    p.draining = False
                    if mine in p.queue:
                        p.queue.remove(mine)
                raise StoreUnavailable(f"creating session {session_id!r}: the log is closed") from exc
        return mine.future

    def start(self, part: int, deadline: float) -> None:
        """Start the partition's transactional producer now (its ``init_transactions``), as its first creation
        would: a process that calls it before it takes sessions (``KafkaEventLog.warm``) does not have its first
        sessions wait for it. Nothing happens when the partition has a producer or a creation under way (that
        one starts it); the index is caught up by the first creation, as after any init."""
        p = self._partition(part)
        with p.cond:
            if p.busy or p.producer is not None:
                return
            p.busy = True
        try:
            producer = self._clients.transactional_producer(p.transactional_id, SESSION_PRODUCER)
            try:
                producer.init_transactions(self._clients.remaining(deadline))
            except KafkaException as exc:
                discard(producer, f"the session creator {p.transactional_id}")
                raise self._clients.unavailable(f"starting the session creator of partition {part}", exc) from exc
            p.producer, p.caught_up = producer, False
        finally:
            with p.cond:
                p.busy = False
                p.cond.notify_all()

    def _drain(self, p: _Partition, part: int) -> None:
        """Commit the partition's queued creations, batch after batch, until none is left (see :meth:`submit`).
        Whatever happens, the partition is left without a drain, so the next submission starts one."""
        try:
            while True:
                with p.cond:
                    while p.busy:  # a create() caller commits a batch: it takes what is queued, ours included
                        p.cond.wait(timeout=0.05)
                    if not p.queue:
                        p.draining = False
                        return
                    batch, p.queue, p.busy = p.queue, [], True
                deadline = max((c.deadline for c in batch if c.future is not None), default=self._clients.deadline())
                self._run_batch(p, part, batch, deadline, None)
        finally:
            with p.cond:
                p.draining = False

    def _run_batch(
        self, p: _Partition, part: int, batch: list[_Creation], deadline: float, mine: _Creation | None
    ) -> None:
        """Commit ``batch`` (taken from the queue with ``busy`` set), then settle every creation in it: the
        waiting ``create`` callers are woken, the submitted ones' futures get their outcome."""
        try:
            self._commit(p, part, batch, deadline)
        except BaseException as exc:
            for c in batch:
                if not c.done:
                    c.error, c.done = exc if c is mine else StoreUnavailable(str(exc)), True
        finally:
            with p.cond:
                p.busy = False
                p.cond.notify_all()
            for c in batch:
                if c.future is not None and c.done:
                    _settle(c.future, c)

    def close(self) -> None:
        with self._lock:
            parts, self._parts = list(self._parts.values()), {}
        for p in parts:
            with p.cond:
                queued, p.queue = p.queue, []
            for c in queued:  # submitted creations no drain will commit now: nothing of them was written
                if c.future is not None:
                    c.error = StoreUnavailable(f"creating session {c.session_id!r}: the log was closed")
                    _settle(c.future, c)
            discard(p.producer, f"the session creator {p.transactional_id}")

    # ------------------------------------------------------------------ internals

    def _partition(self, part: int) -> _Partition:
        with self._lock:
            p = self._parts.get(part)
            if p is None:
                p = self._parts[part] = _Partition(f"{self._topic}:create:{part}")
            return p

    @staticmethod
    def _outcome(c: _Creation) -> SessionState | None:
        if c.error is not None:
            raise c.error
        return c.state

    def _commit(self, p: _Partition, part: int, batch: list[_Creation], deadline: float) -> None:
        clients = self._clients
        waits = _RETRY.until(deadline - time.monotonic(), rng=self._rng)
        while True:
            if p.producer is None:
                producer = clients.transactional_producer(p.transactional_id, SESSION_PRODUCER)
                try:
                    producer.init_transactions(clients.remaining(deadline))
                except KafkaException as exc:
                    discard(producer, f"the session creator {p.transactional_id}")
                    pause = waits.next()
                    if pause is not None:  # e.g. another instance's transaction still aborting
                        time.sleep(pause)
                        continue
                    raise clients.unavailable(f"starting the session creator of partition {part}", exc) from exc
                p.producer, p.caught_up = producer, False
            producer = p.producer
            # every creation committed before our init is in the index now; none can commit after it but ours
            known = self._reader.known_entries([c.session_id for c in batch], part, deadline, catch_up=not p.caught_up)
            p.caught_up = True
            fresh: list[_Creation] = []
            named: set[str] = set()
            for c in batch:
                # exists, or an earlier creation of this batch makes it (one whose caller gave up, then opened
                # it again): the caller takes it over
                if c.session_id in known or c.session_id in named:
                    c.done = True
                else:
                    named.add(c.session_id)
                    fresh.append(c)
            if not fresh:
                return
            entries = [IndexEntry(c.epoch, 0, c.owner) for c in fresh]
            try:
                producer.begin_transaction()
                for c, entry in zip(fresh, entries, strict=True):
                    if c.epoch > 0:
                        producer.produce(
                            self._topic,
                            value=None,
                            key=c.session_id,
                            partition=part,
                            headers=[
                                (HEADER_KIND, KIND_LEASE),
                                (HEADER_EPOCH, str(c.epoch).encode()),
                                (HEADER_BATCH, uuid.uuid4().hex.encode()),
                            ],
                        )
                    producer.produce(self._index_topic, value=encode_index(entry), key=c.session_id, partition=part)
                producer.commit_transaction(clients.remaining(deadline))
            except (KafkaException, BufferError) as exc:
                p.producer = None
                discard(producer, f"the session creator {p.transactional_id}")
                # Fenced (another instance creates sessions of this partition: it initialised the id, which
                # aborted this transaction — seen as a fenced producer, or as a produce refused in a
                # transaction that must now abort), or any other failure: a new attempt is always safe, since
                # it looks at the index again after its own init. Back off a random while so two instances
                # creating at once let each other's transaction through instead of fencing it again.
                pause = waits.next()
                if pause is not None:
                    time.sleep(pause)
                    continue
                err = kafka_error(exc) if isinstance(exc, KafkaException) else None
                if err is not None and err.code() in FENCED_CODES:
                    raise StoreUnavailable(
                        f"creating {len(fresh)} session(s) in partition {part}: other instances kept creating "
                        f"sessions of the same partition for {clients.timeout_s:g}s (each fenced this one's "
                        "transaction); nothing of it was committed — try again"
                    ) from exc
                raise clients.unavailable(
                    f"creating {len(fresh)} session(s) in partition {part} (the creation may or may not have "
                    "committed; the next attempt settles it)",
                    exc,
                ) from exc
            self.transactions += 1
            for c, entry in zip(fresh, entries, strict=True):
                self._reader.remember(c.session_id, entry)
                c.state, c.done = SessionState(entry.epoch, [], entry.owner), True
            return
