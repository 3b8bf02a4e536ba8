"""Reading back what this process appended, from the committed stream rather than one fetch per read.

A :class:`Follower` tails every partition of the event topic with one ``read_committed`` consumer, from
the partitions' ends (``start``) taken before this process appended anything. It decodes the event
records of the sessions this process writes (the ``wanted`` predicate; others are skipped undecoded) and
keeps the most recent ``per_session`` of each (``max_sessions`` sessions, least recently appended first
out), with the offset each was read at.

:meth:`Follower.events` answers a read of seqs whose offsets the caller knows (a session it owns): it
waits, bounded, until the follower's position in the session's partition has passed the last of those
offsets, and returns the events if every one of them is held at exactly its offset; otherwise ``None``
and the caller reads the usual way. The events returned were read back from the broker — committed,
decoded from their stored bytes — like any other read; the follower only saves the round trips of
fetching them one read at a time, which is what lets the invariant companion read its session back on
every step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ...core.events import Envelope
from ...errors import FoldlineError
from .clients import KafkaClients, consume_ready
from .records import HEADER_KIND, KIND_EVENT, header

__all__ = ["Follower"]

_LOG = logging.getLogger("foldline.kafka")


class Follower:
    """Recent committed events of the sessions this process writes (see the module docstring)."""

    def __init__(
        self,
        clients: KafkaClients,
        *,
        topic: str,
        partitions: int,
        decode: Callable[[bytes | None], Envelope],
        wanted: Callable[[str], bool],
        start: Sequence[int],
        per_session: int = 256,
        max_sessions: int = 8192,
        wait_s: float = 10.0,
    ) -> None:
        self._clients = clients
        self._topic = topic
        self._partitions = partitions
        self._decode = decode
        self._wanted = wanted
        self._per_session = per_session
        self._max_sessions = max_sessions
        # the records waited for are committed already: the follower is only behind (a busy process), and
        # catching up is cheaper than fetching them one read at a time, so wait for it long
        self._wait_s = wait_s
        self._cond = threading.Condition()
        self._events: OrderedDict[str, deque[tuple[int, Envelope]]] = OrderedDict()  # session → (offset, event)
        # the next offset to read per partition: from the ends found before this process appended anything
        # (a logical "end" would be resolved on the first fetch, possibly after our own first appends)
        self._positions: list[int] = list(start)
        self._waiters: list[tuple[int, int, asyncio.Future[None], asyncio.AbstractEventLoop]] = []
        self._stop = threading.Event()
        self._consumer: Consumer = clients.following_consumer()
        self._consumer.assign([TopicPartition(topic, p, start[p]) for p in range(partitions)])
        self.failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"foldline-kafka-follower-{topic}", daemon=True)
        self._thread.start()

    def events(self, session_id: str, part: int, from_seq: int, offsets: Sequence[int]) -> list[Envelope] | None:
        """Events ``from_seq ..`` at ``offsets`` (one per seq), once followed; ``None`` if not all are held."""
        if not offsets or self.failed is not None:
            return None
        last = offsets[-1]
        deadline = time.monotonic() + self._wait_s
        with self._cond:
            while self._positions[part] <= last:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed is not None:
                    return None
                self._cond.wait(left)
            return self._held(session_id, from_seq, offsets)

    async def events_async(
        self, session_id: str, part: int, from_seq: int, offsets: Sequence[int]
    ) -> list[Envelope] | None:
        """:meth:`events` for asyncio callers: the wait for the follower is awaited, not blocked on."""
        if not offsets or self.failed is not None:
            return None
        last = offsets[-1]
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._positions[part] > last:
                return self._held(session_id, from_seq, offsets)
            reached: asyncio.Future[None] = loop.create_future()
            self._waiters.append((part, last, reached, loop))
        timer = loop.call_later(self._wait_s, _resolve_all, [reached])  # resolved by the follower, or in time
        try:
            await reached
        finally:
            timer.cancel()
        with self._cond:
            if self.failed is not None or self._positions[part] <= last:
                return None  # failed, or not followed that far in time
            return self._held(session_id, from_seq, offsets)

    def _held(self, session_id: str, from_seq: int, offsets: Sequence[int]) -> list[Envelope] | None:
        """The held events at exactly ``offsets`` (caller holds the condition's lock)."""
        held = self._events.get(session_id)
        if not held:
            return None
        start = from_seq - held[0][1].seq
        if start < 0 or start + len(offsets) > len(held):
            return None
        out: list[Envelope] = []
        for i, off in enumerate(offsets):
            at, env = held[start + i]
            if at != off or env.seq != from_seq + i:
                return None
            out.append(env)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._consumer.close()
        except KafkaException as exc:
            _LOG.warning("closing the Kafka follower of %s failed: %s", self._topic, exc)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                batch = consume_ready(consumer, 2000, 0.05)
                kept: list[tuple[str, int, Envelope]] = []
                for msg in batch:
                    if msg.error() is not None:
                        continue  # end-of-partition and transient fetch errors: the consumer retries itself
                    key = msg.key()
                    if key is None or header(msg, HEADER_KIND) not in (None, KIND_EVENT):
                        continue
                    session_id = key.decode(errors="replace")
                    if not self._wanted(session_id):
                        continue
                    try:
                        env = self._decode(msg.value())
                    except FoldlineError:
                        continue  # not an event of ours to follow: readers get it the usual way (and fail there)
                    kept.append((session_id, msg.offset() or 0, env))
                positions = consumer.position([TopicPartition(self._topic, p) for p in range(self._partitions)])
                with self._cond:
                    for session_id, offset, env in kept:
                        held = self._events.get(session_id)
                        if held is None:
                            held = self._events[session_id] = deque(maxlen=self._per_session)
                        elif held and held[-1][1].seq + 1 != env.seq:
                            held.clear()  # keep one contiguous run per session
                        held.append((offset, env))
                        self._events.move_to_end(session_id)
                    while len(self._events) > self._max_sessions:
                        self._events.popitem(last=False)
                    for tp in positions:
                        if tp.error is None and tp.offset >= 0:
                            self._positions[tp.partition] = tp.offset
                    self._cond.notify_all()
                    self._wake(lambda part, offset: self._positions[part] > offset)
        except Exception as exc:  # a broken follower only costs speed: reads go the usual way
            _LOG.warning("the Kafka follower of %s stopped (%r); reads fetch from the broker instead", self._topic, exc)
            with self._cond:
                self.failed = exc
                self._cond.notify_all()
                self._wake(lambda part, offset: True)

    def _wake(self, due: Callable[[int, int], bool]) -> None:
        """Resolve the asyncio waiters that are due (caller holds the condition's lock): one callback per
        event loop for all of its due waiters, not one wake-up of the loop per waiter."""
        waiting = []
        ready: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for part, offset, future, loop in self._waiters:
            if due(part, offset):
                ready.setdefault(loop, []).append(future)
            else:
                waiting.append((part, offset, future, loop))
        self._waiters = waiting
        for loop, futures in ready.items():
            loop.call_soon_threadsafe(_resolve_all, futures)


def _resolve_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
