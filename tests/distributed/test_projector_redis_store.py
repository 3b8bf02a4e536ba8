"""The fold-store contract against the real local Redis, plus what only the Redis store has."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store, partition_marks
from foldline.core.fold import fold_delta, fold_state
from foldline.core.projection import Session
from foldline.errors import StoreUnavailable
from foldline.ports.fold_store import FoldStore
from foldline.ports.partition_marks import PartitionMarks
from tests.contracts.fold_store import FoldStoreContract
from tests.contracts.partition_marks import PartitionMarksContract
from tests.factories import LogBuilder, simple_log

pytestmark = pytest.mark.redis


def redis_url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


def _drop_prefix(prefix: str) -> None:
    client = redis.Redis.from_url(redis_url())
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"test:fold:{uuid.uuid4().hex[:10]}:"
    yield value
    _drop_prefix(value)


class TestRedisFoldStore(FoldStoreContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, prefix: str) -> None:
        self.prefix = prefix

    def make_store(self) -> FoldStore:
        return fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(self.prefix)))


class TestRedisPartitionMarks(PartitionMarksContract):
    @pytest.fixture(autouse=True)
    def _prefix(self, prefix: str) -> None:
        self.prefix = prefix

    def make_marks(self) -> PartitionMarks:
        return partition_marks(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(self.prefix)))


def test_the_marks_live_with_the_folds_and_are_lost_with_them(prefix: str) -> None:
    """Marks and folds of one prefix share one Redis: whatever loses the folds (a flush, a restart without
    persistence, here their keys dropped) loses the marks — which is how a projector notices."""
    config = Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix))
    store, marks = fold_store(config), partition_marks(config)
    try:
        delta = fold_delta(simple_log(), 1)
        assert delta is not None
        store.apply("s", delta)
        assert marks.set_mark("t", 0, "done")
        _drop_prefix(prefix)
        assert (store.get("s"), marks.marks("t", [0])) == (None, {})
    finally:
        store.close()
        marks.close()


def test_journal_records_every_change(prefix: str) -> None:
    store = fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix)), journal=True)
    log = simple_log(turns=2, steps=2)
    for part in (log[:4], log[:4], log[2:7], log[9:], log[7:]):
        delta = fold_delta(part, 1)
        assert delta is not None
        store.apply("s", delta)
    store.put(fold_state(Session("s", log), 1))
    assert store.journal_of("s") == ["a:0:3", "a:4:6", f"a:7:{len(log) - 1}", f"p:{len(log) - 1}"]
    assert store.rebuilds_of("s") == 1
    store.close()


def test_memory_per_session_is_close_to_the_serialized_fold(prefix: str) -> None:
    store = fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix)))
    b = LogBuilder().header()
    for i in range(200):
        b.user(f"message {i} " + "lorem ipsum " * 15)
    delta = fold_delta(b.events, 1)
    assert delta is not None
    store.apply("s", delta)
    state = store.get("s")
    assert state is not None
    serialized = sum(len(m) for m in state.messages) + len(state.header or b"")
    used = store.memory_usage("s")
    assert serialized < used < 1.3 * serialized, (used, serialized)
    store.close()


def test_unreachable_redis_is_a_typed_error() -> None:
    store = fold_store(
        Config(
            redis=RedisConfig("redis://127.0.0.1:1/0", socket_timeout_s=0.5, connect_timeout_s=0.5),
            folds=FoldsConfig("never:"),
        )
    )
    with pytest.raises(StoreUnavailable, match="check that Redis is running"):
        store.applied_seq("s")
    assert not store.ping()
    store.close()


def test_session_ids_lists_folds_under_the_prefix(prefix: str) -> None:
    store = fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix)))
    log = simple_log(turns=1)
    for sid in ("a", "b:c", "d{e}"):
        delta = fold_delta(log, 1)
        assert delta is not None
        store.apply(sid, delta)
    assert sorted(store.session_ids()) == ["a", "b:c", "d{e}"]
    store.close()


def test_a_fold_that_lost_a_key_is_treated_as_missing(prefix: str) -> None:
    store = fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix)))
    log = simple_log(turns=2)
    first, rest = fold_delta(log[:6], 1), fold_delta(log[6:], 1)
    assert first is not None
    assert rest is not None
    store.apply("s", first)
    client = redis.Redis.from_url(redis_url())
    client.delete(store.keys_of("s")[1])  # e.g. evicted under a maxmemory policy
    client.close()
    assert store.get("s") is None  # never a fold with its messages missing
    result = store.apply("s", rest)
    assert (result.status, result.applied_seq, result.expected_seq) == ("gap", -1, 0)  # -> rebuilt from the log
    assert store.get("s") is None
    store.put(fold_state(Session("s", log), 1))
    assert store.get("s") == fold_state(Session("s", log), 1)
    store.close()


def test_small_meta_hash_stays_compact(prefix: str) -> None:
    store = fold_store(Config(redis=RedisConfig(redis_url()), folds=FoldsConfig(prefix)))
    delta = fold_delta(simple_log(), 1)
    assert delta is not None
    store.apply("s", delta)
    client = redis.Redis.from_url(redis_url())
    assert client.object("encoding", store.keys_of("s")[0]) == b"listpack"
    client.close()
    store.close()
