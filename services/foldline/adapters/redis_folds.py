"""The Redis fold store (each session's fold in two keys, changed only by Lua scripts fenced by seq and epoch)
and the projectors' partition marks beside it.

Layout per session (``<prefix>`` is the configuration's ``folds.prefix``, ``foldline:fold:`` by default;
the ``{...}`` hash tag keeps a session's keys in one cluster slot):

* ``<prefix>{<session>}:meta`` — a small hash of integers (kept listpack-encoded, so it costs little):
  ``a`` applied seq, ``e`` writer epoch, ``g`` surface generation, ``hs`` the folded header's seq (-1:
  none), ``n`` the length of the list below, ``r`` how many times the fold was replaced whole (rebuilds).
* ``<prefix>{<session>}:msgs`` — a list: entry 0 is the folded header's canonical bytes (empty when
  ``hs`` is -1), then each derived message's canonical bytes, in order.
* ``<prefix>partitions:<topic>`` — a hash: the projectors' mark of each partition of the topic
  (:class:`RedisPartitionMarks`, the other port kept here): ``done`` once the folds of everything the group
  consumed there are in this Redis. A Redis that lost its data lost these too, and projectors re-read the
  partitions whose mark is gone (docs/PROJECTOR.md).
* ``<prefix>applied`` — a pub/sub channel, not a key: after each batch of applies (and each whole-fold
  replace) the store publishes the batch's session ids, as a JSON list, in the same pipelined round trip.
  A dispatcher waiting for folds subscribes to it (:class:`RedisAppliedNotices`) and looks at a fold when
  its session is named, instead of polling every few milliseconds; a notice is a hint (pub/sub delivers at
  most once), so the waiter still reads the fold and looks again after a bounded pause without one.
* ``<prefix>{<session>}:journal`` — only with ``journal=True``: one entry per change, ``a:<from>:<to>``
  for a delta that applied events ``from..to`` and ``p:<seq>`` for a whole-fold replace. Tests read it
  to prove that no event was applied twice or skipped; production leaves it off.

:meth:`RedisFoldStore.apply` runs one Lua script that reads the applied seq and epoch and decides
``duplicate`` / ``gap`` / ``fenced`` / ``applied`` exactly as the port's contract says, appending only
the messages past the applied seq — all inside one atomic script, so concurrent projectors (during a
rebalance) and redelivered batches can never double-apply or roll a fold back. Both scripts first check
that the list holds ``n`` entries: a fold that lost one of its keys (deleted by hand, or evicted — run
Redis with ``maxmemory-policy noeviction``) is deleted and answered as missing, so it is rebuilt from
the log; :meth:`RedisFoldStore.get` returns ``None`` for it meanwhile.
:meth:`RedisFoldStore.apply_many` sends many sessions' deltas in one pipelined round trip (each
session's script is still its own atomic unit). Redis errors reach callers as
:class:`~foldline.errors.StoreUnavailable`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ..core.fold import FoldDelta, FoldState
from ..errors import ConfigError, StoreUnavailable
from ..ports.fold_store import ERASED, AppliedNotices, ApplyResult, ApplyStatus, FoldStore, FoldTail
from ..ports.partition_marks import PartitionMarks

__all__ = ["RedisAppliedNotices", "RedisFoldStore", "RedisPartitionMarks"]
_LOG = logging.getLogger("foldline.folds")
_NOTICES = itertools.count(1)  # numbers the subscriptions of this process (their Redis client names)
_CHUNK = 4000  # Lua's unpack() is bounded by the C stack (8000 in Redis): push at most this many at once

_PUSH = """
local function push(key, first)
  local batch, n = {}, 0
  for i = first, #ARGV do
    n = n + 1
    batch[n] = ARGV[i]
    if n == CHUNK then
      redis.call('RPUSH', key, unpack(batch))
      batch, n = {}, 0
    end
  end
  if n > 0 then redis.call('RPUSH', key, unpack(batch)) end
end
""".replace("CHUNK", str(_CHUNK))

# Both scripts first check that the two keys agree (the list holds ``n`` entries): a fold whose list was
# evicted or deleted on its own is treated as lost — deleted, and reported as missing, so it is rebuilt.
_CONSISTENT = """
local function load()
  local m = redis.call('HMGET', KEYS[1], 'a', 'e', 'n', 'r')
  if m[1] and tonumber(m[3]) ~= redis.call('LLEN', KEYS[2]) then
    redis.call('DEL', KEYS[1], KEYS[2])
    return -1, -1, false, tonumber(m[4]) or 0
  end
  return tonumber(m[1]) or -1, tonumber(m[2]) or -1, m[1] ~= false, tonumber(m[4]) or 0
end
"""

# KEYS: meta, msgs, journal. ARGV: first_seq, last_seq, epoch, header_seq (-1: none), header, journal (0|1),
# then the appended messages' seqs as one space-separated list "s1 s2 ..." in ARGV[7], then the message bytes.
_APPLY = (
    _PUSH
    + _CONSISTENT
    + """
local a, e, exists = load()
local first, last, epoch = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if last <= a then return {'duplicate', a} end
if first > a + 1 then return {'gap', a, a + 1} end
if epoch < e then return {'fenced', a} end
local hs = tonumber(ARGV[4])
if not exists then
  -- the header goes in with the list (an LSET that grows entry 0 later can split the list's first node)
  if hs > a then redis.call('RPUSH', KEYS[2], ARGV[5]) else redis.call('RPUSH', KEYS[2], '') end
  redis.call('HSET', KEYS[1], 'g', 0, 'r', 0, 'hs', -1)
end
local skip = 0
if a >= first then
  for s in string.gmatch(ARGV[7], '%d+') do
    if tonumber(s) <= a then skip = skip + 1 else break end
  end
end
push(KEYS[2], 8 + skip)
if hs > a then
  if exists then redis.call('LSET', KEYS[2], 0, ARGV[5]) end
  redis.call('HSET', KEYS[1], 'hs', hs)
end
if epoch < e then epoch = e end
redis.call('HSET', KEYS[1], 'a', last, 'e', epoch, 'n', redis.call('LLEN', KEYS[2]))
if ARGV[6] == '1' then redis.call('RPUSH', KEYS[3], 'a:' .. (a + 1) .. ':' .. last) end
return {'applied', last, -1, a}
"""
)

# KEYS: meta, msgs, journal. ARGV: applied_seq, epoch, generation, header_seq (-1: none), header, journal,
# then the message bytes.
_PUT = (
    _PUSH
    + _CONSISTENT
    + """
local a, e, exists, r = load()
local seq, epoch = tonumber(ARGV[1]), tonumber(ARGV[2])
if exists then
  if epoch < e then return {'fenced', a} end
  if seq < a then return {'duplicate', a} end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('RPUSH', KEYS[2], ARGV[5])
push(KEYS[2], 7)
redis.call('HSET', KEYS[1], 'a', seq, 'e', epoch, 'g', ARGV[3], 'r', r + 1, 'hs', ARGV[4],
  'n', redis.call('LLEN', KEYS[2]))
if ARGV[6] == '1' then redis.call('RPUSH', KEYS[3], 'p:' .. seq) end
return {'applied', seq}
"""
)

# KEYS: meta, msgs. ARGV: generation, known. A read: the fold's meta, its header entry and the messages past
# ``known`` when the fold is still at ``generation`` and holds that many (else all of them); false without
# a (consistent) fold. One script, so the meta and the list it answers with are of one moment.
_TAIL = """
local m = redis.call('HMGET', KEYS[1], 'a', 'e', 'g', 'hs', 'n')
if not m[1] then return false end
local n = tonumber(m[5])
if n ~= redis.call('LLEN', KEYS[2]) then return false end
local known, offset = tonumber(ARGV[2]), 0
if tonumber(m[3]) == tonumber(ARGV[1]) and n - 1 >= known then offset = known end
return {m[1], m[2], m[3], m[4], offset, redis.call('LINDEX', KEYS[2], 0), redis.call('LRANGE', KEYS[2], offset + 1, -1)}
"""

# KEYS: meta, msgs. ARGV: epoch.
_RAISE_EPOCH = (
    _CONSISTENT
    + """
local a, e, exists = load()
local epoch = tonumber(ARGV[1])
if exists and epoch > e then redis.call('HSET', KEYS[1], 'e', epoch) end
return e
"""
)


def _int(raw: Any) -> int:
    return int(raw.decode() if isinstance(raw, bytes) else raw)


class RedisFoldStore(FoldStore):
    """:class:`~foldline.ports.fold_store.FoldStore` on Redis; see the module docstring.

    ``url`` is a redis-py URL (``redis://host:port/db``); ``socket_timeout_s`` bounds each command and
    ``connect_timeout_s`` each connect, after which the call raises :class:`~foldline.errors.StoreUnavailable`;
    the pool holds at most ``max_connections`` connections (a caller beyond them fails fast with
    StoreUnavailable). ``prefix`` is the key prefix of the folds (projectors and dispatchers must agree).
    Processes build the store from their configuration (:func:`foldline.config.factories.fold_store`),
    which holds the defaults of all of these.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        socket_timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        journal: bool = False,
        notify: bool = True,
        client: redis.Redis | None = None,
    ) -> None:
        if not prefix:
            raise ConfigError("the Redis fold store needs a non-empty key prefix (e.g. 'foldline:fold:')")
        self.url = _without_password(url)  # as it appears in messages
        self.prefix = prefix
        self.journal = journal
        self.notify = notify  # publish the sessions of each apply on ``channel`` (tests turn it off)
        self.channel = prefix + "applied"
        self._redis: redis.Redis = client or _client(url, socket_timeout_s, connect_timeout_s, max_connections)
        self._apply: Script = self._redis.register_script(_APPLY)
        self._put: Script = self._redis.register_script(_PUT)
        self._raise_epoch: Script = self._redis.register_script(_RAISE_EPOCH)
        self._tail: Script = self._redis.register_script(_TAIL)

    # ---------------------------------------------------------------- keys

    def keys_of(self, session_id: str) -> tuple[str, str, str]:
        """The meta, messages and journal keys of a session."""
        base = f"{self.prefix}{{{session_id}}}"
        return base + ":meta", base + ":msgs", base + ":journal"

    # ---------------------------------------------------------------- FoldStore

    def apply(self, session_id: str, delta: FoldDelta) -> ApplyResult:
        return self.apply_many([(session_id, delta)])[0]

    def apply_many(self, deltas: Sequence[tuple[str, FoldDelta]]) -> list[ApplyResult]:
        """Apply deltas of many sessions in one round trip; each session's delta is atomic on its own."""
        if not deltas:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for session_id, delta in deltas:
            header_seq, header = delta.header if delta.header is not None else (-1, b"")
            args: list[Any] = [
                delta.first_seq,
                delta.last_seq,
                delta.epoch,
                header_seq,
                header,
                1 if self.journal else 0,
                " ".join(str(s) for s, _ in delta.messages),
            ]
            args.extend(m for _, m in delta.messages)
            self._apply(keys=list(self.keys_of(session_id)), args=args, client=pipe)
        if self.notify:  # after the scripts, on the same connection: a subscriber that hears it finds them applied
            pipe.publish(self.channel, orjson.dumps(sorted({sid for sid, _ in deltas})))
        replies = self._execute(pipe, f"applying {len(deltas)} fold delta(s)")
        return [_result(reply) for reply in replies[: len(deltas)]]

    def raise_epoch(self, session_id: str, epoch: int) -> None:
        self.raise_epochs({session_id: epoch})

    def raise_epochs(self, epochs: Mapping[str, int]) -> None:
        """:meth:`raise_epoch` for many sessions in one round trip."""
        if not epochs:
            return
        pipe = self._redis.pipeline(transaction=False)
        for session_id, epoch in epochs.items():
            self._raise_epoch(keys=list(self.keys_of(session_id)[:2]), args=[epoch], client=pipe)
        self._execute(pipe, f"raising the epoch of {len(epochs)} fold(s)")

    def put(self, state: FoldState) -> ApplyResult:
        header_seq = state.header_seq if state.header is not None and state.header_seq is not None else -1
        args: list[Any] = [
            state.applied_seq,
            state.epoch,
            state.generation,
            header_seq,
            state.header or b"",
            1 if self.journal else 0,
            *state.messages,
        ]
        pipe = self._redis.pipeline(transaction=False)
        self._put(keys=list(self.keys_of(state.session_id)), args=args, client=pipe)
        if self.notify:
            pipe.publish(self.channel, orjson.dumps([state.session_id]))
        replies = self._execute(pipe, f"replacing the fold of {state.session_id!r}")
        return _result(replies[0])

    def get(self, session_id: str) -> FoldState | None:
        meta_key, msgs_key, _ = self.keys_of(session_id)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hgetall(meta_key)
        pipe.lrange(msgs_key, 0, -1)
        meta, entries = self._execute(pipe, f"reading the fold of {session_id!r}")
        if not meta or len(entries) != _int(meta.get(b"n", b"-1")):
            return None  # no fold, or its keys disagree (the next apply deletes it and it is rebuilt)
        header_seq = _int(meta[b"hs"])
        return FoldState(
            session_id=session_id,
            applied_seq=_int(meta[b"a"]),
            epoch=_int(meta[b"e"]),
            generation=_int(meta[b"g"]),
            header=entries[0] if header_seq >= 0 else None,
            header_seq=header_seq if header_seq >= 0 else None,
            messages=tuple(entries[1:]),
        )

    def tail(self, session_id: str, *, generation: int, known: int) -> FoldTail | None:
        """:meth:`get` minus the ``known`` messages the caller holds: one script, so O(new messages)."""
        return self.tails([(session_id, generation, known)])[0]

    def tails(self, requests: Sequence[tuple[str, int, int]]) -> list[FoldTail | None]:
        """:meth:`tail` of many sessions in one pipelined round trip (each its own atomic script)."""
        if not requests:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for session_id, generation, known in requests:
            meta_key, msgs_key, _ = self.keys_of(session_id)
            self._tail(keys=[meta_key, msgs_key], args=[generation, known], client=pipe)
        replies = self._execute(pipe, f"reading {len(requests)} fold(s)")
        return [_tail_of(sid, reply) for (sid, _, _), reply in zip(requests, replies, strict=True)]

    def applied_seq(self, session_id: str) -> int:
        raw = self._call(lambda: self._redis.hget(self.keys_of(session_id)[0], "a"), "reading an applied seq")
        return -1 if raw is None else _int(raw)

    def applied_seqs(self, session_ids: Sequence[str]) -> dict[str, int]:
        """Applied seqs of many sessions in one round trip (-1 where there is no fold)."""
        pipe = self._redis.pipeline(transaction=False)
        for sid in session_ids:
            pipe.hget(self.keys_of(sid)[0], "a")
        replies = self._execute(pipe, f"reading {len(session_ids)} applied seqs")
        return {sid: (-1 if raw is None else _int(raw)) for sid, raw in zip(session_ids, replies, strict=True)}

    def delete(self, session_id: str) -> None:
        keys = self.keys_of(session_id)
        self._call(lambda: self._redis.delete(*keys), f"deleting the fold of {session_id!r}")

    def erase(self, session_id: str) -> None:
        """The erased tombstone, in one MULTI/EXEC: the fold's keys (and journal) deleted, then a meta hash with
        applied seq and epoch :data:`~foldline.ports.fold_store.ERASED` and a list holding one empty entry."""
        meta, msgs, journal = self.keys_of(session_id)

        def run() -> None:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(meta, msgs, journal)
                pipe.rpush(msgs, b"")
                pipe.hset(meta, mapping={"a": ERASED, "e": ERASED, "g": 0, "hs": -1, "n": 1, "r": 0})
                pipe.execute()

        self._call(run, f"erasing the fold of {session_id!r}")

    def rewrite_persistence(self) -> list[str]:
        """Ask Redis to rewrite its persistence files, so no copy of an erased fold stays in them: an
        append-only-file rewrite when ``appendonly`` is on, a snapshot when ``save`` rules are set. Returns what
        was asked (nothing when Redis persists nothing); one already running is left to finish. A Redis that
        refuses ``CONFIG`` (a managed one) is left to its own schedule, and that is what is returned."""
        asked: list[str] = []

        def config(name: str) -> str:
            value = self._redis.config_get(name).get(name, "")
            return value.decode() if isinstance(value, bytes) else str(value)

        def run() -> None:
            try:
                appendonly, save = config("appendonly"), config("save")
            except ResponseError as exc:  # a managed Redis may refuse CONFIG: its own schedule rewrites them
                asked.append(f"none (CONFIG refused: {exc})")
                return
            if appendonly == "yes":
                with contextlib.suppress(ResponseError):  # one in progress: it rewrites what is there now
                    self._redis.bgrewriteaof()
                asked.append("BGREWRITEAOF")
            if save.strip():
                with contextlib.suppress(ResponseError):
                    self._redis.bgsave(schedule=True)
                asked.append("BGSAVE")

        self._call(run, "asking for a rewrite of the persistence files")
        return asked

    def close(self) -> None:
        self._redis.close()

    # ---------------------------------------------------------------- inspection (tools, tests, benchmarks)

    def journal_of(self, session_id: str) -> list[str]:
        """The session's change journal (empty unless the store was opened with ``journal=True``)."""
        raw = self._call(lambda: self._redis.lrange(self.keys_of(session_id)[2], 0, -1), "reading a journal")
        return [r.decode() for r in raw]

    def rebuilds_of(self, session_id: str) -> int:
        """How many times the session's fold was replaced whole since it was created in this Redis."""
        raw = self._call(lambda: self._redis.hget(self.keys_of(session_id)[0], "r"), "reading a rebuild count")
        return 0 if raw is None else _int(raw)

    def memory_usage(self, session_id: str) -> int:
        """Bytes Redis spends on the session's fold keys (``MEMORY USAGE ... SAMPLES 0``: exact)."""
        meta_key, msgs_key, _ = self.keys_of(session_id)
        total = 0
        for key in (meta_key, msgs_key):
            used = self._call(lambda k=key: self._redis.memory_usage(k, samples=0), "measuring memory")
            total += int(used or 0)
        return total

    def session_ids(self) -> Iterator[str]:
        """Sessions that have a fold in this store (SCAN over the prefix)."""
        start = len(self.prefix) + 1
        try:
            for key in self._redis.scan_iter(match=f"{self.prefix}{{*}}:meta", count=1000):
                name = key.decode()
                yield name[start : -len("}:meta")]
        except RedisError as exc:
            raise _unavailable(self.url, "listing folds", exc) from exc

    def notices(self) -> RedisAppliedNotices:
        """A subscription to ``channel`` (its own connection and thread, started by ``start``)."""
        return RedisAppliedNotices(self._redis, self.channel, self.url)

    def ping(self) -> bool:
        try:
            return bool(self._redis.ping())
        except RedisError:
            return False

    # ---------------------------------------------------------------- internals

    def _execute(self, pipe: Any, what: str) -> list[Any]:
        return list(self._call(pipe.execute, what))

    def _call(self, fn: Any, what: str) -> Any:
        return _translated(self.url, fn, what)


class RedisAppliedNotices(AppliedNotices):
    """The fold store's ``<prefix>applied`` channel, read by one thread on a connection of its own.

    Each message (a JSON list of session ids) is handed to ``on_applied``; ``on_applied(None)`` after every
    (re)subscription, since messages published while the subscription was down are lost. A Redis that does
    not answer is tried again every ``retry_s``, until :meth:`close`."""

    def __init__(self, client: redis.Redis, channel: str, url: str, *, retry_s: float = 0.5) -> None:
        # a connection of its own, named, so that it shows as this subscription in Redis's CLIENT LIST
        self.client_name = f"foldline-fold-notices-{os.getpid()}-{next(_NOTICES):d}"
        pool = client.connection_pool
        self._redis = redis.Redis(
            connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=2,
                **{**pool.connection_kwargs, "client_name": self.client_name},
            )
        )
        self.channel = channel
        self.url = url
        self.retry_s = retry_s
        self.received = 0  # messages delivered (tests, metrics)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_applied: Callable[[Sequence[str] | None], None]) -> None:
        if self._thread is not None:
            raise RuntimeError("these notices were started already")
        self._thread = threading.Thread(target=self._run, args=(on_applied,), name="foldline-fold-notices", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._redis.close()

    def _run(self, on_applied: Callable[[Sequence[str] | None], None]) -> None:
        pubsub: Any = None
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.channel)
                    on_applied(None)  # anything published before this moment was not heard
                message = pubsub.get_message(timeout=0.5)
                if message is None or message.get("type") != "message":
                    continue
                try:
                    sessions = orjson.loads(message["data"])
                except orjson.JSONDecodeError:
                    _LOG.warning("ignoring a malformed fold notice on %s: %r", self.channel, message["data"][:200])
                    continue
                if isinstance(sessions, list):
                    self.received += 1
                    on_applied([s for s in sessions if isinstance(s, str)])
            except RedisError as exc:
                _LOG.info("fold notices from %s interrupted (%s); subscribing again", self.url, exc)
                _close_pubsub(pubsub)
                pubsub = None
                self._stop.wait(self.retry_s)
        _close_pubsub(pubsub)


def _close_pubsub(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(RedisError):
            pubsub.close()


# KEYS: the marks hash. ARGV: partition, mark, expected mark. Sets the mark only while it is the expected one.
_SET_MARK_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


class RedisPartitionMarks(PartitionMarks):
    """:class:`~foldline.ports.partition_marks.PartitionMarks` on Redis: ``<prefix>partitions:<topic>``, a hash
    of each partition's mark, under the prefix of the folds it vouches for (so a Redis that lost the folds lost
    the marks too). Built from the configuration by :func:`foldline.config.factories.partition_marks`."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        socket_timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        client: redis.Redis | None = None,
    ) -> None:
        if not prefix:
            raise ConfigError("the Redis partition marks need a non-empty key prefix (that of the folds)")
        self.url = _without_password(url)
        self.prefix = prefix
        self._redis: redis.Redis = client or _client(url, socket_timeout_s, connect_timeout_s, max_connections)
        self._set_mark_if: Script = self._redis.register_script(_SET_MARK_IF)

    def marks(self, topic: str, partitions: Sequence[int]) -> dict[int, str]:
        if not partitions:
            return {}
        key = f"{self.prefix}partitions:{topic}"
        raw = _translated(
            self.url, lambda: self._redis.hmget(key, [str(p) for p in partitions]), "reading partition marks"
        )
        return {p: v.decode() for p, v in zip(partitions, raw, strict=True) if v is not None}

    def set_mark(self, topic: str, partition: int, mark: str, *, expect: str | None = None) -> bool:
        key = f"{self.prefix}partitions:{topic}"
        if expect is None:
            _translated(self.url, lambda: self._redis.hset(key, str(partition), mark), "setting a partition mark")
            return True
        done = _translated(
            self.url, lambda: self._set_mark_if(keys=[key], args=[partition, mark, expect]), "setting a partition mark"
        )
        return bool(done)

    def close(self) -> None:
        self._redis.close()


def _client(url: str, socket_timeout_s: float, connect_timeout_s: float, max_connections: int) -> redis.Redis:
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            max_connections=max_connections,
            health_check_interval=30,
        )
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL (FOLDLINE_REDIS_URL): {exc}") from exc


def _translated(url: str, fn: Any, what: str) -> Any:
    """``fn()``, a Redis error turned into :class:`~foldline.errors.StoreUnavailable` naming ``what``."""
    try:
        return fn()
    except NoScriptError as exc:  # pragma: no cover - redis-py reloads scripts itself
        raise _unavailable(url, what, exc) from exc
    except ResponseError as exc:
        raise StoreUnavailable(f"Redis at {url} refused {what}: {exc}") from exc
    except RedisError as exc:
        raise _unavailable(url, what, exc) from exc


_STATUSES: dict[str, ApplyStatus] = {s: s for s in ("applied", "duplicate", "gap", "fenced")}


def _tail_of(session_id: str, reply: Any) -> FoldTail | None:
    if not reply:
        return None  # no fold, or its keys disagree (the next apply deletes it and it is rebuilt)
    applied, epoch, gen, header_seq, offset, header, messages = reply
    hs = _int(header_seq)
    return FoldTail(
        session_id=session_id,
        applied_seq=_int(applied),
        epoch=_int(epoch),
        generation=_int(gen),
        header=header if hs >= 0 else None,
        header_seq=hs if hs >= 0 else None,
        offset=_int(offset),
        messages=tuple(messages),
    )


def _result(reply: Any) -> ApplyResult:
    raw = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    status = _STATUSES.get(raw)
    if status is None:
        raise StoreUnavailable(f"the fold script answered {reply!r}")
    expected = _int(reply[2]) if len(reply) > 2 and _int(reply[2]) >= 0 else None
    previous = _int(reply[3]) if len(reply) > 3 else None
    return ApplyResult(status, _int(reply[1]), expected, previous)


def _without_password(url: str) -> str:
    """The URL as messages may show it: ``redis://user:***@host:port/db``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _unavailable(url: str, what: str, exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(
        f"Redis at {url} failed while {what}: {type(exc).__name__}: {exc}; check that Redis is running "
        "(folds are a cache: a lost Redis is rebuilt from the log)"
    )
