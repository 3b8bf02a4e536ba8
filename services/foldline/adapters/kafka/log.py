"""The Kafka event log: Avro session events on a partitioned topic, one fenced writer per session.

Layout (docs/KAFKA.md has the full argument):

* ``<topic>`` (default ``foldline.session-events``, 12 partitions): one record per event, key = session
  id, value = the self-describing Avro envelope (:mod:`foldline.adapters.avro`), headers
  ``fl-kind=event``, ``fl-epoch``, ``fl-batch``. ``acquire`` writes a ``fl-kind=lease`` record (no value).
* ``<topic>.index`` (compacted, same partition count, same partition per session): the latest entry
  per session — lease epoch, the data offset of every event, and the session's owner (the
  transactional id of the producer allowed to write it) (:mod:`.index`).
* ``<topic>.dlq``: records a consumer could not apply, with the reason in headers (:mod:`.dead_letters`).

**Group commit.** Appends from any number of threads and sessions are queued and committed together:
one Kafka transaction on this instance's transactional producer (its *writer*, :mod:`.writer`) holds every
queued batch's event records and one index record per session. ``append`` returns when that transaction
has committed; a batch is visible to ``read_committed`` readers all at once or never.

**One writer per session.** The index names each session's owner writer. Before a writer appends to
a session it does not own it *takes it over*: through the session's own transactional id
(``<topic>:<session>``, which serializes concurrent take-overs) it fences the previous owner's
producer (``init_transactions`` with the owner's transactional id aborts its open transaction and
rejects everything it sends afterwards), re-reads the session — now exact — and commits an index entry
naming itself. A writer keeps the state of the sessions it owns and checks ``expected_seq`` and the
lease epoch against it before anything is sent; if its producer is fenced the commit fails, nothing of
that transaction becomes visible, and each waiting append takes its session over again and re-checks.

**Creating a session** costs no take-over: new sessions are created in batches, one transaction per
partition for all the sessions created meanwhile, through a transactional id per partition that every
instance shares (:mod:`.creator`), so two instances can never both create one.

**Reading one session** costs the session's size (:mod:`.reader`): the index partition is tailed (one
small entry per session after compaction), then exactly the listed offsets are fetched. Reading seqs of a
session this instance writes needs neither: their offsets are known, and with ``follow=True`` a follower
of the committed stream (:mod:`.follower`) has usually decoded them already. With an archive
(``archive``), the seqs below a session's archive watermark are read from it instead, the tail from Kafka
(:mod:`.archive_tail`): the log outlives the topic's retention.

**Topics** are created with, and checked against, the log's :class:`~.retention.TopicPolicy` before
anything is written: a setting that could delete events not yet archived is refused (:mod:`.retention`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from confluent_kafka import KafkaException

from ...collector import collector_paused
from ...core.events import Envelope
from ...core.limits import check_event_size
from ...core.validation import LogRules, check_session_id
from ...core.wire import encode_event
from ...errors import ConfigError, ConflictError, FencedError, StoreUnavailable, ValidationError
from ...ports.archive import ArchiveReader
from ...ports.event_log import EventLog, WriterLease, opened
from ...ports.inbox import InboxStore, SealedInbox
from ...ports.key_store import Sealer
from ..avro import AvroCodec
from .archive_tail import ArchiveAndTail
from .clients import FENCED_CODES, SESSION_PRODUCER, KafkaClients, discard, kafka_error
from .creator import SessionCreator
from .follower import Follower
from .inbox import KafkaInboxStore
from .index import SessionState, encode_index
from .partitioning import partition_for
from .reader import SessionReader
from .records import (
    HEADER_BATCH,
    HEADER_EPOCH,
    HEADER_KIND,
    KIND_LEASE,
    MAX_RECORD_BYTES,
    dlq_topic,
    index_topic,
)
from .retention import TopicCheck, TopicPolicy
from .topics import ensure_topics
from .writer import (
    AppendRequest,
    Committer,
    GroupWriter,
    Retry,
    SessionWriter,
    WriterContext,
    WriterIds,
    WriterTimes,
    producer_ids,
)

__all__ = ["KafkaEventLog"]

_T = TypeVar("_T")
#: worker threads of one log for its blocking calls from asyncio (each mostly waits on the broker)
_BLOCKING_THREADS = 256
_MAX_TAKE_OVERS = 16  # take-overs in flight at once (each opens a producer); more only thrash the coordinator
_MAX_SOLO = 256  # sessions written through their own producer, kept open (LRU)


def _append_wait_s(timeout_s: float) -> float:
    """How long an append waits for its transaction's outcome before it calls the client stuck."""
    return 2 * (timeout_s + 5.0) + 1.0


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Wakes:
    """Futures of one event loop that other threads resolve, in bursts: the first of a burst schedules one
    callback (a ``call_soon_threadsafe``, which writes to the loop's self-pipe) that resolves all of them,
    so a group transaction settling many appends wakes their loop once, not once per append."""

    __slots__ = ("_due", "_lock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._due: list[asyncio.Future[None]] = []

    def resolve(self, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` in its loop (from any thread)."""
        with self._lock:
            self._due.append(future)
            first = len(self._due) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: nothing awaits these any more
                with self._lock:
                    self._due = []
                raise

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for future in due:
            _resolve(future)


class _SessionLock:
    """One session's lock in :attr:`KafkaEventLog._session_locks`, dropped when its last user leaves."""

    __slots__ = ("_lock", "_log", "_session_id")

    def __init__(self, log: KafkaEventLog, session_id: str) -> None:
        self._log = log
        self._session_id = session_id
        self._lock: threading.Lock | None = None

    def __enter__(self) -> None:
        self.acquire(blocking=True)

    def acquire(self, *, blocking: bool) -> bool:
        """Take the session's lock; without ``blocking``, False (and nothing held) when another holds it."""
        locks = self._log._session_locks
        with self._log._locks_lock:
            lock, users = locks.get(self._session_id, (None, 0))
            if lock is None:
                lock = threading.Lock()
            locks[self._session_id] = (lock, users + 1)
        if lock.acquire(blocking=blocking):
            self._lock = lock
            return True
        self._forget(lock)
        return False

    def __exit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()
        self._forget(self._lock)

    def _forget(self, lock: threading.Lock) -> None:
        locks = self._log._session_locks
        with self._log._locks_lock:
            _, users = locks[self._session_id]
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
    state: SessionState
    rules: LogRules | None = None
    solo: SessionWriter | None = None

    def live(self, group_writer: str) -> bool:
        if self.solo is not None:
            return self.solo.writer_id is not None
        return self.writer == group_writer


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

    ``archive`` is the session archive reads consult below each session's archive watermark (closed with
    the log); ``policy`` the topics' settings (default: ``replication_factor``, ``min.insync.replicas`` 1,
    infinite retention).
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        topic: str,
        partitions: int,
        replication_factor: int = 1,
        timeout_s: float = 10.0,
        registry_url: str | None = None,
        codec: AvroCodec | None = None,
        transaction_timeout_ms: int = 5_000,
        max_writers: int = 4096,
        create_topics: bool = True,
        client_config: Mapping[str, Any] | None = None,
        writers: int = 1,
        archive: ArchiveReader | None = None,
        policy: TopicPolicy | None = None,
        follow: bool = False,
        sealer: Sealer | None = None,
    ) -> None:
        if partitions < 1:
            raise ConfigError("partitions must be >= 1")
        if max_writers < 1:
            raise ConfigError("max_writers must be >= 1")
        if writers < 1:
            raise ConfigError("writers must be >= 1")
        self._writer_count = writers
        self.sealer = sealer
        self.bootstrap = bootstrap
        self.topic = topic
        self.index_topic = index_topic(topic)
        self.dlq_topic = dlq_topic(topic)
        self.partitions = partitions
        self.policy = policy if policy is not None else TopicPolicy(replication_factor=replication_factor)
        self.replication_factor = self.policy.replication_factor
        self.archive = archive
        self.topic_checks: list[TopicCheck] = []
        self.timeout_s = timeout_s
        self.codec = codec or AvroCodec(registry_url=registry_url, subject=f"{topic}-value")
        self._max_writers = max_writers
        self._create_topics = create_topics
        self._clients = KafkaClients(
            bootstrap, timeout_s=timeout_s, client_config=client_config, transaction_timeout_ms=transaction_timeout_ms
        )
        self._reader = SessionReader(
            self._clients,
            topic=topic,
            index_topic=self.index_topic,
            partitions=partitions,
            decode=self.codec.decode,
        )
        self._events = ArchiveAndTail(self._reader, archive)
        self._ids = WriterIds()
        self._context = WriterContext(self._clients, topic, self.index_topic, self._encode, self._ids)
        self._ready_lock = threading.Lock()
        self._closed = False
        self._owned_lock = threading.Lock()
        self._locks_lock = threading.Lock()
        self._session_locks: dict[str, tuple[threading.Lock, int]] = {}
        self._taking_over = threading.BoundedSemaphore(_MAX_TAKE_OVERS)
        self._owned: OrderedDict[str, _Owned] = OrderedDict()
        self._writers: list[GroupWriter] = []
        self._wakes: _Wakes | None = None  # the event loop whose appends the writers settle (append_async)
        self._creator = SessionCreator(self._clients, self._reader, topic=topic, index_topic=self.index_topic)
        self._follow = follow
        self._follower: Follower | None = None
        self._executor = ThreadPoolExecutor(_BLOCKING_THREADS, thread_name_prefix="foldline-kafka")
        self._starting: dict[int, asyncio.Future[str]] = {}  # writers being started for asyncio callers
        self._inbox: SealedInbox | None = None

    # -------------------------------------------------------------- EventLog

    def append(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        if not events:
            return self.head(session_id)
        check_session_id(session_id)
        stored = self.sealer.seal(session_id, events) if self.sealer is not None else events
        self._ensure_ready()
        deadline = self._clients.deadline()
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
                request = AppendRequest(session_id, part, state.epoch, state, events, owned.rules, owned.writer, stored)
                committer: Committer = owned.solo if owned.solo is not None else writer
                try:
                    committer.send(request)
                except BaseException:
                    self._disown(session_id)
                    raise
                if not request.done.wait(_append_wait_s(self.timeout_s)):
                    self._stuck(session_id, committer, owned)
                if isinstance(request.error, Retry):
                    # Our writer was fenced by another instance's take-over: nothing of it was written.
                    self._disown(session_id)
                    if time.monotonic() >= deadline:
                        raise StoreUnavailable(
                            f"append to session {session_id!r}: the writer was fenced again and again for "
                            f"{self.timeout_s:g}s (other instances keep taking the session over); nothing was written"
                        )
                    fresh = True
                    continue
                return self._settle(session_id, state, request)

    async def append_async(
        self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
    ) -> int:
        """:meth:`append` for asyncio callers: an owned session's batch joins the group transaction and the
        caller awaits its commit without a thread; anything else (a take-over, a session's own producer,
        a refusal to re-check) runs :meth:`append` on a worker thread. A new session's key still being made
        (:meth:`~foldline.adapters.sealing.ContentSealer.make_ahead`) is awaited first, without a thread."""
        sealer = self.sealer
        if sealer is not None and events and not sealer.cached(session_id):
            making = sealer.making(session_id)
            if making is not None:
                with contextlib.suppress(Exception):  # a failure: the blocking path asks the store again, and raises
                    await asyncio.wrap_future(making)
        part = partition_for(session_id, self.partitions)
        owned = self._owned.get(session_id)
        writer = self._writers[part % len(self._writers)] if self._writers and not self._closed else None
        if (
            not events
            or writer is None
            or owned is None
            or owned.solo is not None
            or owned.rules is None
            or not owned.live(writer.writer_id or "")
            or expected_seq != owned.state.next_seq
            or (lease is not None and lease.epoch != owned.state.epoch)
            or (self.sealer is not None and not self.sealer.cached(session_id))  # the key store is asked there
        ):
            return await self._blocking(self.append, session_id, expected_seq, events, lease=lease)
        lock = self._session_lock(session_id)
        if not lock.acquire(blocking=False):
            return await self._blocking(self.append, session_id, expected_seq, events, lease=lease)
        try:
            state = owned.state
            stored = self.sealer.seal(session_id, events) if self.sealer is not None else events
            request = AppendRequest(session_id, part, state.epoch, state, events, owned.rules, owned.writer, stored)
            loop = asyncio.get_running_loop()
            wakes = self._wakes
            if wakes is None or wakes.loop is not loop:
                wakes = self._wakes = _Wakes(loop)
            done: asyncio.Future[None] = loop.create_future()
            request.done.callback = functools.partial(wakes.resolve, done)
            try:
                writer.send(request)
            except BaseException:
                self._disown(session_id)
                raise
            # resolved by the outcome or, failing that, by the timer (a bare future and a timer cost far
            # less per append than wait_for and shield)
            timer = loop.call_later(_append_wait_s(self.timeout_s), _resolve, done)
            try:
                await done
            finally:
                timer.cancel()
            if not request.done.is_set():
                self._stuck(session_id, writer, owned)
            if isinstance(request.error, Retry):  # fenced meanwhile: nothing written; take it over again
                self._disown(session_id)
            else:
                return self._settle(session_id, state, request)
        finally:
            lock.__exit__(None, None, None)
        return await self._blocking(self.append, session_id, expected_seq, events, lease=lease)

    def _stuck(self, session_id: str, committer: Committer, owned: _Owned) -> NoReturn:
        """The commit thread bounds every transaction, so no outcome in time is a stuck client: give up on
        this writer (the next one fences it, which settles the transaction) and report."""
        self._disown(session_id)
        committer.replace(owned.writer, fenced=False)
        raise StoreUnavailable(
            f"Kafka did not confirm the append to session {session_id!r}; the outcome is unknown — "
            "re-read the session head before retrying"
        )

    def _settle(self, session_id: str, state: SessionState, request: AppendRequest) -> int:
        """The outcome of a settled append: its error, or the session's state moved past its events."""
        if request.refused:
            assert request.error is not None
            raise request.error
        if request.error is not None:
            self._disown(session_id)  # its rules already count the batch
            raise request.error
        entry = request.entry
        assert entry is not None
        if request.chunk is not None:
            self._reader.remember_chunk(session_id, state.chunks, request.chunk)
        state.offsets.extend(request.offsets)
        state.chunks, state.sealed, state.tail = entry.chunks, entry.sealed, entry.tail
        self._reader.remember(session_id, entry)
        return state.next_seq

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        self._ensure_ready()
        deadline = self._clients.deadline()
        owned = self._owned.get(session_id)
        if owned is not None and to_seq is not None and to_seq <= owned.state.next_seq:
            # Seqs this instance has seen committed: their offsets are known and events never change.
            return self._read_known(session_id, owned.state, max(from_seq, 0), to_seq, deadline)
        state = self._load_state(session_id, deadline)
        end = state.next_seq if to_seq is None else min(to_seq, state.next_seq)
        if from_seq >= end:
            return []
        return self._opened(session_id, self._events.events(session_id, state, max(from_seq, 0), end, deadline))

    def read_prefixes(self, ends: Mapping[str, int]) -> dict[str, list[Envelope]]:
        """Events ``0 .. end`` of many sessions at once (opened): the index caught up once per partition and each
        partition's records read in one pass, not one read per session — how a consumer taking partitions over
        anchors the sessions it meets mid-stream. A session whose prefix is not all in Kafka (retention deleted
        some: the archive holds them) or not yet committed to ``end`` is left out: read it with :meth:`read`."""
        self._ensure_ready()
        deadline = self._clients.deadline()
        states = self._reader.states(list(ends), deadline)
        wanted = {sid: (states[sid], end) for sid, end in ends.items() if end > 0 and states[sid].next_seq >= end}
        out: dict[str, list[Envelope]] = {}
        decode = self.codec.decode
        for sid, records in self._reader.records_of(wanted, deadline).items():
            values = [r.value() for r in records]
            events = [decode(v) for v in values if v is not None]
            if len(events) != len(values) or any(e.seq != seq for seq, e in enumerate(events)):
                continue  # read alone, it raises what is wrong
            out[sid] = self._opened(sid, events)
        return out

    def read_stored(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        self._ensure_ready()
        deadline = self._clients.deadline()
        state = self._load_state(session_id, deadline)
        end = state.next_seq if to_seq is None else min(to_seq, state.next_seq)
        if from_seq >= end:
            return []
        return self._events.events(session_id, state, max(from_seq, 0), end, deadline)

    async def read_async(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        """:meth:`read` for asyncio callers: seqs this instance appended come from the follower without
        blocking the event loop; anything else is read on a worker thread."""
        owned = self._owned.get(session_id)
        if self._follower is not None and owned is not None and to_seq is not None and to_seq <= owned.state.next_seq:
            start = max(from_seq, 0)
            if start >= to_seq:
                return []
            part = partition_for(session_id, self.partitions)
            followed = await self._follower.events_async(session_id, part, start, owned.state.offsets[start:to_seq])
            if followed is not None and (self.sealer is None or self.sealer.cached(session_id)):
                return self._opened(session_id, followed)
        return await self._blocking(self.read, session_id, from_seq, to_seq)

    async def acquire_and_read_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        """:meth:`acquire_and_read` for asyncio callers. A session this instance has never seen is most likely
        new: it is created without a worker thread (its creation awaits the partition's next batched
        transaction, :meth:`SessionCreator.submit`), so a thousand sessions opened at once are not bounded
        by the worker threads. Anything else — a session that exists (a take-over), one this instance
        knows, a log or writer not started yet — runs :meth:`acquire_and_read` on a worker thread."""
        opened = await self._create_async(session_id)
        if opened is not None:
            return opened
        return await self._blocking(self.acquire_and_read, session_id)

    async def _create_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]] | None:
        """The new session's lease and (no) events, or ``None`` when it is not one this path creates."""
        check_session_id(session_id)
        part = partition_for(session_id, self.partitions)
        writer_id = await self._started_writer(part)
        if writer_id is None or self._reader.knows(session_id) or session_id in self._owned:
            return None
        lock = self._session_lock(session_id)
        if not lock.acquire(blocking=False):  # another call of this session is under way
            return None
        try:
            self._disown(session_id)
            deadline = self._clients.deadline()
            created = await asyncio.wrap_future(
                self._creator.submit(session_id, part, writer_id, 1, deadline, self._executor)
            )
            if created is None:  # another instance created it meanwhile: a take-over, on a fresh read
                return None
            # a created session is empty: its rules are fresh ones, and there is nothing to read
            self._keep(session_id, _Owned(writer_id, created, LogRules()))
            return WriterLease(session_id, created.epoch), []
        finally:
            lock.__exit__(None, None, None)

    async def _started_writer(self, part: int) -> str | None:
        """The id of the partition's writer, once the log is ready and that writer's producer started: one
        worker thread starts them for every caller waiting meanwhile. ``None`` if that failed (the caller
        then goes the blocking way, which raises the error) or the log is closed."""
        if self._writers and not self._closed:
            ready = self._writer_for(part).ready_id()
            if ready is not None:
                return ready
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        number = part % min(self._writer_count, self.partitions)
        starting = self._starting.get(number)
        if starting is None or starting.get_loop() is not loop or starting.done():
            starting = self._starting[number] = loop.run_in_executor(self._executor, self._start_writer, part)
        try:
            return await asyncio.shield(starting)
        except (StoreUnavailable, KafkaException, ConfigError):
            return None

    def _start_writer(self, part: int) -> str:
        self._ensure_ready()
        return self._writer_for(part).current(self._clients.deadline())

    async def _blocking(self, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``call`` on this log's own worker threads (:data:`_BLOCKING_THREADS`): a thousand sessions'
        take-overs, creations and reads wait on the broker side by side, not six at a time in the
        event loop's default executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(call, *args, **kwargs))

    def head(self, session_id: str) -> int:
        self._ensure_ready()
        return self._load_state(session_id, self._clients.deadline()).next_seq

    def sessions(self) -> list[str]:
        self._ensure_ready()
        return self._reader.sessions(self._clients.deadline())

    def heads(self) -> dict[str, int]:
        self._ensure_ready()
        return self._reader.heads(self._clients.deadline())

    def acquire(self, session_id: str) -> WriterLease:
        return self.acquire_and_read(session_id)[0]

    def acquire_and_read(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
        """The lease and the session's events as the take-over (or the creation) found them: exact, with no
        second read of the index. The validation rules the next append checks against are built from the
        same events (a loaded session is not read again at its first append)."""
        check_session_id(session_id)
        self._ensure_ready()
        deadline = self._clients.deadline()
        with self._session_lock(session_id):
            owned, _ = self._own(session_id, deadline, new_epoch=True)
            state = owned.state
            lease = WriterLease(session_id, state.epoch)
            events = self._read_known(session_id, state, 0, state.next_seq, deadline)
            if owned.rules is None:
                # the session's rules (seqs, calls, surface) from the events just read; their values were
                # checked when they were appended, and the index names only records this log wrote
                rules = LogRules()
                with collector_paused():
                    rules.check_batch(events, values_checked=True)
                owned.rules = rules
            return lease, events

    def inbox(self) -> InboxStore:
        """The sessions' inboxes on ``<topic>.inbox`` (:mod:`.inbox`), opened on first use with this log's
        clients and topic policy; entries sealed and opened by this log's sealer."""
        with self._ready_lock:
            if self._closed:
                raise StoreUnavailable("this KafkaEventLog is closed")
            if self._inbox is None:
                self._inbox = SealedInbox(
                    KafkaInboxStore(
                        self._clients,
                        topic=self.topic,
                        partitions=self.partitions,
                        policy=self.policy,
                        create_topic=self._create_topics,
                    ),
                    lambda _reading: self.sealer,
                )
            return self._inbox

    def warm(self) -> None:
        """Start the topics' check, every group writer's producers, the follower and every partition's session
        creator, and read every inbox partition once — what a new process's first sessions would otherwise wait
        for on first use, one after another (each producer's ``init_transactions``, the inbox's reading
        consumer). A loop process calls it before it takes sessions (``foldline fleet`` does, and reports how
        long it took). StoreUnavailable when the broker does not answer."""
        self._ensure_ready()
        deadline = self._clients.deadline()
        for writer in self._writers:
            writer.current(deadline)
        for part in range(self.partitions):
            self._creator.start(part, deadline)
        inbox = self.inbox()
        store = inbox.inner if isinstance(inbox, SealedInbox) else inbox
        if isinstance(store, KafkaInboxStore):
            store.prime()

    def writer_times(self) -> WriterTimes:
        """Where this instance's group writers' appends spent their time so far (summed over the writers)."""
        total = WriterTimes()
        for writer in list(self._writers):
            total.add(writer.times)
        return total

    def close(self) -> None:
        with self._ready_lock:
            if self._closed:
                return
            self._closed = True
            inbox, self._inbox = self._inbox, None
        if inbox is not None:
            inbox.close()
        if self._follower is not None:
            self._follower.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for writer in self._writers:
            writer.close()
        self._creator.close()
        with self._owned_lock:
            solos = [o.solo for o in self._owned.values() if o.solo is not None]
            self._owned.clear()
        for solo in solos:
            solo.close()
        try:
            self._reader.close()
        finally:
            if self.archive is not None:
                self.archive.close()

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
        part = partition_for(session_id, self.partitions)
        writer = self._writer_for(part)
        # A session opened that this instance's view of the index has never seen is most likely new: the
        # creator settles it (it catches its view up after fencing the partition's other creators, and
        # answers None for a session that exists), which spares a catch-up of the index per new session.
        maybe_new = new_epoch and expected_seq is None and lease is None and not self._reader.knows(session_id)
        while True:
            writer_id = writer.current(deadline)
            with self._owned_lock:
                owned = self._owned.get(session_id)
                if owned is not None and owned.live(writer_id) and not new_epoch:
                    self._owned.move_to_end(session_id)
                    return owned, False
            self._disown(session_id)
            state = SessionState() if maybe_new else self._load_state(session_id, deadline)
            maybe_new = False
            if state.owner is None and state.next_seq == 0 and state.epoch == 0:
                # A new session: created in a batched transaction, no take-over (see .creator)
                created = self._creator.create(session_id, part, writer_id, 1 if new_epoch else 0, deadline)
                if created is None:
                    continue  # another instance created it meanwhile: take it over below, on a fresh read
                # an empty session's rules are fresh ones: its first append needs no read to build them
                rules = LogRules() if created.next_seq == 0 else None
                return self._keep(session_id, _Owned(writer_id, created, rules)), True
            if state.owner == writer_id and not new_epoch:
                # Nobody took it over since our writer last committed to it (a take-over fences our
                # writer first, and the next commit would fail): the committed state is exact.
                return self._keep(session_id, _Owned(writer_id, state)), True
            # Epochs and heads never go back: these refusals need no take-over.
            if lease is not None and lease.epoch != state.epoch:
                raise FencedError(session_id, lease.epoch, state.epoch)
            if expected_seq is not None and expected_seq < state.next_seq:
                raise ConflictError(session_id, expected_seq, state.next_seq)
            if not self._taking_over.acquire(timeout=self._clients.remaining(deadline)):
                raise StoreUnavailable(
                    f"taking session {session_id!r} over: {_MAX_TAKE_OVERS} other take-overs kept every slot busy "
                    f"for {self.timeout_s:g}s"
                )
            try:
                state, solo = self._take_over(session_id, writer_id, deadline, expected_seq, lease, new_epoch)
            except Retry:
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
    ) -> tuple[SessionState, SessionWriter | None]:
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
        session taken from another instance stays on its own producer (returned as a
        :class:`~.writer.SessionWriter`), so that handing it back and forth fences only that session.
        """
        clients = self._clients
        part = partition_for(session_id, self.partitions)
        session_txid = f"{self.topic}:{session_id}"
        producer = clients.transactional_producer(session_txid, SESSION_PRODUCER)
        keep = False
        try:
            try:
                producer.init_transactions(clients.remaining(deadline))
            except KafkaException as exc:
                raise clients.unavailable(f"taking session {session_id!r} over", exc) from exc
            state = self._load_state(session_id, deadline)
            previous = state.owner
            if previous not in (None, writer_id, session_txid) and previous not in self._ids.dead:
                assert previous is not None
                for txid in producer_ids(previous):  # a group writer commits through two producers
                    clients.fence(txid, deadline)
                self._ids.dead.add(previous)
                state = self._load_state(session_id, deadline)
            if not new_epoch:
                if lease is not None and lease.epoch != state.epoch:
                    raise FencedError(session_id, lease.epoch, state.epoch)
                if expected_seq is not None and expected_seq != state.next_seq:
                    raise ConflictError(session_id, expected_seq, state.next_seq)
            solo = previous is not None and previous not in self._ids.mine
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
                producer.produce(self.index_topic, value=encode_index(entry), key=session_id, partition=part)
                producer.commit_transaction(clients.remaining(deadline))
            except (KafkaException, BufferError) as exc:
                err = kafka_error(exc) if isinstance(exc, KafkaException) else None
                if err is not None and err.code() in FENCED_CODES:
                    raise Retry() from exc  # a concurrent take-over of this session won; read again
                raise clients.unavailable(
                    f"taking session {session_id!r} over (the take-over may or may not have committed; "
                    "the next attempt settles it)",
                    exc,
                ) from exc
            self._reader.remember(session_id, entry)
            state.epoch, state.owner = entry.epoch, owner
            keep = solo
            return state, SessionWriter(self._context, producer, session_txid) if solo else None
        finally:
            if not keep:
                discard(producer, f"the take-over producer of {session_id!r}")

    def _encode(self, events: Sequence[Envelope], stored: Sequence[Envelope]) -> list[bytes]:
        """The records of ``events``, as ``stored`` (the same events, their content sealed when a sealer seals)."""
        encode = self.codec.encode
        values = []
        for e, kept in zip(events, stored, strict=True):
            if e.sealed is None:  # on the canonical form, as every log's (one given sealed was checked already)
                check_event_size(len(encode_event(e)), e.seq)
            value = encode(kept)
            if len(value) > MAX_RECORD_BYTES:
                raise ValidationError(
                    "record-size",
                    f"event seq {e.seq} encodes to {len(value):,} bytes, over the {MAX_RECORD_BYTES:,}-byte Kafka "
                    "record limit; keep large content in attachments",
                    seq=e.seq,
                )
            values.append(value)
        return values

    def _read_known(
        self, session_id: str, state: SessionState, from_seq: int, to_seq: int, deadline: float
    ) -> list[Envelope]:
        """Events ``from_seq .. to_seq`` of a session whose offsets ``state`` holds (from the follower if it has
        them, else from the archive and by offset)."""
        if from_seq >= to_seq:
            return []
        if self._follower is not None:
            part = partition_for(session_id, self.partitions)
            followed = self._follower.events(session_id, part, from_seq, state.offsets[from_seq:to_seq])
            if followed is not None:
                return self._opened(session_id, followed)
        return self._opened(session_id, self._events.events(session_id, state, from_seq, to_seq, deadline))

    def _opened(self, session_id: str, events: list[Envelope]) -> list[Envelope]:
        return opened(f"the Kafka log {self.topic}", session_id, self.sealer, events)

    def _rules_for(self, session_id: str, state: SessionState, deadline: float) -> LogRules:
        rules = LogRules()
        if state.next_seq:
            events = self._opened(session_id, self._events.events(session_id, state, 0, state.next_seq, deadline))
            with collector_paused():
                rules.check_batch(events)
        return rules

    def _load_state(self, session_id: str, deadline: float) -> SessionState:
        """The session's committed state: its latest index entry with every event's offset."""
        return self._reader.state(session_id, deadline)

    # -------------------------------------------------------------- topics and writers

    def check_topics(self) -> list[TopicCheck]:
        """Create the topics if they are missing and check them (:mod:`.retention`): the checks made.

        Raises :class:`~foldline.errors.UnsafeRetention` for a setting that could lose events. Runs once per
        instance, before its first read or write; call it at start-up to fail before anything else.
        """
        self._ensure_ready()
        return self.topic_checks

    def _ensure_ready(self) -> None:
        if self._writers and not self._closed:
            return  # set once, under the lock below
        with self._ready_lock:
            if self._closed:
                raise StoreUnavailable("this KafkaEventLog is closed")
            if self._writers:
                return
            self.topic_checks = ensure_topics(
                self._clients, self.topic, partitions=self.partitions, policy=self.policy, create=self._create_topics
            )
            self._writers = [GroupWriter(self._context, k) for k in range(min(self._writer_count, self.partitions))]
            if self._follow:
                marks = self._reader.watermarks
                self._follower = Follower(
                    self._clients,
                    topic=self.topic,
                    partitions=self.partitions,
                    decode=self.codec.decode,
                    wanted=self._owned.__contains__,
                    start=[marks.high(self.topic, p) for p in range(self.partitions)],
                )

    def _writer_for(self, part: int) -> GroupWriter:
        """The writer of a partition: writer ``k`` commits partitions ``p`` with ``p % writers == k``."""
        return self._writers[part % len(self._writers)]
