"""A dispatcher waiting for folds hears of each apply from the projectors (Redis pub/sub) instead of polling,
against the real local Redis; a notice that is lost (or a subscription that drops) delays a wait by the
bounded fallback round, never fails it."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from foldline.adapters.redis_folds import RedisFoldStore
from foldline.config import Config, FoldsConfig, RedisConfig
from foldline.config.factories import fold_store
from foldline.core.fold import FoldDelta, fold_delta
from foldline.dispatcher import FoldWatcher
from foldline.ports.fold_store import FoldTail
from tests.distributed.projector_harness import wait_until
from tests.factories import simple_log

pytestmark = pytest.mark.redis


def _url() -> str:
    url = os.environ.get("FOLDLINE_REDIS_URL")
    if not url:
        pytest.fail("FOLDLINE_REDIS_URL is unset: run `bash deploy/local/up.sh redis` and `source .local/env.sh`")
    return url


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"test:notices:{uuid.uuid4().hex[:10]}:"
    yield value
    client = redis.Redis.from_url(_url())
    try:
        keys = list(client.scan_iter(match=f"{value}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _store(prefix: str, *, notify: bool = True) -> RedisFoldStore:
    store = fold_store(Config(redis=RedisConfig(_url()), folds=FoldsConfig(prefix)))
    assert isinstance(store, RedisFoldStore)
    store.notify = notify
    return store


def _subscribers(channel: str) -> int:
    client = redis.Redis.from_url(_url())
    try:
        return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))
    finally:
        client.close()


LAST_SEQ = len(simple_log()) - 1


def _delta() -> FoldDelta:
    delta = fold_delta(simple_log(), 1)
    assert delta is not None
    return delta


def _apply_session(store: RedisFoldStore, session_id: str) -> None:
    """Fold a small session into ``store`` the way a projector does (one delta)."""
    assert store.apply(session_id, _delta()).status == "applied"


async def _wait_then_apply(
    watcher: FoldWatcher, projector: RedisFoldStore, session_id: str, timeout_s: float
) -> FoldTail:
    """A wait for the session's fold registered (and looked at once) before the projector applies it."""
    waiting = asyncio.ensure_future(watcher.wait(session_id, LAST_SEQ, 30.0, generation=-1, known=0))
    rounds = watcher.rounds
    while watcher.rounds == rounds:  # its first look found no fold
        await asyncio.sleep(0.005)
    assert not waiting.done()
    await asyncio.to_thread(_apply_session, projector, session_id)
    return await asyncio.wait_for(waiting, timeout_s)


def test_a_wait_is_settled_by_the_projectors_notice_not_by_a_poll(prefix: str) -> None:
    projector, dispatcher = _store(prefix), _store(prefix)
    watcher = FoldWatcher(dispatcher, fallback_s=60.0)  # no fallback round within the test's time
    try:
        assert watcher.pushed
        wait_until(lambda: _subscribers(dispatcher.channel) >= 1, 10, "the watcher's subscription")
        tail = asyncio.run(_wait_then_apply(watcher, projector, "s-notice", timeout_s=10.0))
        assert tail.applied_seq == LAST_SEQ
        assert (watcher.settled_on_notice, watcher.settled_on_pause) == (1, 0)
    finally:
        watcher.close()
        projector.close()
        dispatcher.close()


def test_a_lost_notice_still_settles_the_wait_by_the_bounded_fallback_round(prefix: str) -> None:
    projector = _store(prefix, notify=False)  # its applies publish nothing: every notice is lost
    dispatcher = _store(prefix)
    watcher = FoldWatcher(dispatcher, fallback_s=0.2)
    try:
        wait_until(lambda: _subscribers(dispatcher.channel) >= 1, 10, "the watcher's subscription")
        tail = asyncio.run(_wait_then_apply(watcher, projector, "s-lost", timeout_s=10.0))
        assert tail.applied_seq == LAST_SEQ
        assert (watcher.settled_on_notice, watcher.settled_on_pause) == (0, 1)
    finally:
        watcher.close()
        projector.close()
        dispatcher.close()


def test_notices_resume_after_redis_drops_the_subscription(prefix: str) -> None:
    projector, dispatcher = _store(prefix), _store(prefix)
    notices = dispatcher.notices()
    heard: list[list[str] | None] = []
    notices.start(lambda sessions: heard.append(None if sessions is None else list(sessions)))
    admin = redis.Redis.from_url(_url())
    try:
        wait_until(lambda: _subscribers(dispatcher.channel) >= 1, 10, "the subscription")
        assert heard[:1] == [None]  # subscribed: anything before it may have been missed
        _apply_session(projector, "s-before")
        wait_until(lambda: ["s-before"] in heard, 10, "the first notice")
        ours = [c["id"] for c in admin.client_list(_type="pubsub") if c.get("name") == notices.client_name]
        assert len(ours) == 1
        admin.client_kill_filter(_id=ours[0])  # Redis drops this subscriber (the connection closes)
        wait_until(lambda: heard.count(None) >= 2, 10, "the subscription made again (and announced as a gap)")
        wait_until(lambda: _subscribers(dispatcher.channel) >= 1, 10, "the new subscription")
        _apply_session(projector, "s-after")
        wait_until(lambda: ["s-after"] in heard, 10, "a notice after the new subscription")
    finally:
        notices.close()
        admin.close()
        projector.close()
        dispatcher.close()


def test_a_batch_of_applies_is_announced_once_with_its_sessions(prefix: str) -> None:
    projector = _store(prefix)
    listener = redis.Redis.from_url(_url()).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(projector.channel)
    try:
        deltas = [(sid, _delta()) for sid in ("b-2", "b-1", "b-2")]
        projector.apply_many(deltas)
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = listener.get_message(timeout=1.0)
        assert message is not None
        assert message["data"] == b'["b-1","b-2"]'
        assert listener.get_message(timeout=0.2) is None  # one message for the batch
    finally:
        listener.close()
        projector.close()
