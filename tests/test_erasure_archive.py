"""Erasure and the embedded log's session archive, in a directory and in the real local S3 server (deploy/local): a
session archived turn by turn, its segments merged as they accumulate, is erased like any other — no merged, retired
or new segment holds its content, the archive keeps only its structure, a restore from it reads as erased — and
content that reached the archive in the clear is refused before anything changes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.adapters.archive import ArchiveAppender, SessionArchive
from foldline.archiver.engine import ArchivePolicy, Archiver
from foldline.archiver.log_feed import LogFeed
from foldline.archiver.restore import restore_session
from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.config.factories import archive_store, sqlite_log
from foldline.core.events import SessionErased
from foldline.core.header import CallConfig
from foldline.loop import Agent, AgentOptions
from foldline.ports.archive import ArchiveStore
from foldline.providers.emulated import emulated_provider

from .erasure_helpers import canary_session, inflated, scan

CANARY = "canary-7a3f90c2"


def run(*args: str, data_dir: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


class Clock:
    """The archiver's clock: a little past the wall clock, so that every turn just logged is idle."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def idle(self, seconds: float) -> None:
        self.now = max(self.now, time.time()) + seconds


@pytest.fixture(params=["dir", pytest.param("s3", marks=pytest.mark.s3)])
def archive_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The embedded log's archive, as ``FOLDLINE_ARCHIVE`` configures it for the commands: a directory in the data
    directory, or a bucket of the local S3 server made for the test (emptied and deleted afterwards)."""
    kind: str = request.param
    monkeypatch.setenv("FOLDLINE_ARCHIVE", kind)
    if kind == "dir":
        yield kind
        return
    import boto3

    endpoint = os.environ.get("FOLDLINE_S3_ENDPOINT")
    if not endpoint:
        pytest.fail("FOLDLINE_S3_ENDPOINT is unset: `bash deploy/local/up.sh s3` and `source .local/env.sh`")
    bucket = f"foldline-erase-arch-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("FOLDLINE_ARCHIVE_BUCKET", bucket)
    yield kind
    s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
        s3.delete_bucket(Bucket=bucket)
    finally:
        s3.close()


def _store(data: Path) -> ArchiveStore:
    store = archive_store(Config.from_env().overridden(data_dir=data))
    assert store is not None
    ensure = getattr(store, "ensure_bucket", None)
    if callable(ensure):
        ensure()
    return store


def archive_holds(data: Path, needle: bytes) -> list[str]:
    """Every object of the configured archive (segments — their records decoded — and manifests) holding ``needle``,
    read through the store itself: the same search for a directory and a bucket."""
    store = _store(data)
    try:
        return [k for k in store.keys(prefix="") if needle in inflated(store.fetch(k) or b"")]
    finally:
        store.close()


class TurnArchiver:
    """An archiver of ``data``'s log into the configured archive, merging above two segments per session and
    keeping what a merge replaced for a day."""

    def __init__(self, data: Path) -> None:
        self.archive = SessionArchive(_store(data))
        policy = ArchivePolicy(idle_s=1, max_delay_s=60, max_segments=2, grace_s=86_400)
        self.clock = Clock()
        self.feed = LogFeed(sqlite_log(Config(data_dir=data)), self.archive, policy)
        self.engine = Archiver(ArchiveAppender(self.archive), self.feed, policy, concurrency=1, clock=self.clock)

    def catch_up(self, idle_s: float = 2) -> None:
        """Archive what is new, as after ``idle_s`` without an event (past ``max_delay_s``: whatever the last
        event is, not only a ``turn/end``)."""
        self.engine.offer(self.feed.poll())
        self.clock.idle(idle_s)
        for _ in range(2):  # the flush and its merge, then the jobs that came due
            self.engine.step()
            self.engine.collect(wait=True)

    def close(self) -> None:
        self.engine.close()
        self.feed.close()
        self.archive.close()


def _grow(data: Path, session_id: str, archiver: TurnArchiver, turns: int, secret: str) -> None:
    """``turns`` turns of a sealed session holding ``secret``, the archiver catching up after each."""
    stores = open_stores(Config(data_dir=data))
    provider = emulated_provider()
    options = AgentOptions(
        config=CallConfig("anthropic", "claude-emulated", max_tokens=64), system=f"You guard {secret}."
    )

    async def go() -> None:
        agent = Agent(session_id, stores.log, provider, options, attachments=stores.attachments)
        for t in range(turns):
            await agent.run_turn(f"Turn {t}: remember {secret}.")
            archiver.catch_up()
        await provider.aclose()

    try:
        asyncio.run(go())
    finally:
        stores.close()


def _restored(data: Path, into: Path, session_id: str) -> None:
    """A new data directory with ``data``'s key store as it is now and the session restored from the archive."""
    into.mkdir()
    shutil.copy(data / "keys.sqlite3", into / "keys.sqlite3")
    stores = open_stores(Config(data_dir=into))
    archive = SessionArchive(_store(data))
    try:
        assert restore_session(archive, stores.log, session_id).appended > 0
    finally:
        archive.close()
        stores.close()


def test_erasure_covers_a_session_whose_archive_segments_were_merged(tmp_path: Path, archive_kind: str) -> None:
    data = tmp_path / "data"
    archiver = TurnArchiver(data)
    try:
        _grow(data, "other-1", archiver, 2, "nothing-secret-here")
        _grow(data, "secret-1", archiver, 6, CANARY)
        manifest = archiver.archive.manifest("secret-1", refresh=True)
        assert manifest is not None
        assert archiver.engine.merges >= 2
        assert manifest.retired  # the segments merges replaced, kept for readers for the grace period
        assert len(manifest.segments) <= 2
        assert any(ref.end - ref.first > 8 for ref in manifest.segments)  # a merged segment, several turns long
        assert archive_holds(data, CANARY.encode()) == []  # merged from sealed records, never opened
        # before the erasure, a restore from the merged segments (with the keys) rebuilds every request
        _restored(data, tmp_path / "restored-before", "secret-1")
        assert run("verify", "secret-1", data_dir=tmp_path / "restored-before")[0] == 0

        code, out, err = run("erase", "secret-1", "--reason", "merged archive", "--json", data_dir=data)
        assert code == 0, err
        assert json.loads(out)["keysDestroyed"] == 1
        # the erasure's mark is archived and merged like any other event
        merges = archiver.engine.merges
        stores = open_stores(Config(data_dir=data), read_only=True)
        try:
            head = stores.log.head("secret-1")
        finally:
            stores.close()
        archiver.catch_up(61)  # the mark is no turn/end: archived within max_delay_s
        assert archiver.archive.watermark("secret-1", refresh=True) == head
        after = archiver.archive.manifest("secret-1", refresh=True)
        assert after is not None
        assert len(after.segments) <= 2
        assert archiver.engine.merges > merges

        # no segment — merged, retired or new — and no other file of the data directory holds the content
        assert archive_holds(data, CANARY.encode()) == []
        assert scan(data, CANARY.encode()) == []
        fresh = SessionArchive(_store(data))
        try:
            archived = fresh.read("secret-1", 0, head)
        finally:
            fresh.close()
        stores = open_stores(Config(data_dir=data), read_only=True)
        try:
            assert archived == stores.log.read_stored("secret-1")
        finally:
            stores.close()
        assert isinstance(archived[-1].data, SessionErased)
        # a restore from the merged archive reads as erased (never as a lost key), structure intact
        _restored(data, tmp_path / "restored-after", "secret-1")
        code, out, _ = run("verify", "--json", data_dir=tmp_path / "restored-after")
        assert code == 5, out
        assert {s["id"]: s["status"] for s in json.loads(out)["sessions"]} == {"secret-1": "erased"}
        code, out, _ = run("show", "secret-1", data_dir=tmp_path / "restored-after")
        assert code == 0
        assert "[erased]" in out
        assert CANARY not in out
        # every other session verifies as before
        code, out, _ = run("verify", "--json", data_dir=data)
        assert code == 5
        assert {s["id"]: s["status"] for s in json.loads(out)["sessions"]} == {
            "secret-1": "erased",
            "other-1": "verified",
        }
    finally:
        archiver.close()


def test_content_already_archived_in_the_clear_is_not_erasable_and_nothing_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive_kind: str
) -> None:
    """The embedded log could seal its rows in place, but the archive keeps the segments it already wrote: the
    erasure is refused, before the key or anything else is touched."""
    data = tmp_path / "data"
    images = canary_session(tmp_path / "scratch", "old-1", CANARY, tmp_path / "old-1.jsonl")
    monkeypatch.setenv("FOLDLINE_ENCRYPTION", "off")
    code, _, err = run("import", str(tmp_path / "old-1.jsonl"), "--attachments", str(images), data_dir=data)
    assert code == 0, err
    archiver = TurnArchiver(data)
    try:
        archiver.catch_up()
    finally:
        archiver.close()
    assert archive_holds(data, CANARY.encode()) != []  # archived in the clear
    monkeypatch.setenv("FOLDLINE_ENCRYPTION", "on")
    code, _, err = run("erase", "old-1", data_dir=data)
    assert code == 2
    assert "NotErasable" in err
    assert "archive" in err
    assert CANARY.encode() in (data / "log.sqlite3").read_bytes()  # not sealed in place: nothing changed
    code, out, _ = run("erasures", "--json", data_dir=data)
    assert json.loads(out)["erasures"] == []
    assert run("verify", "old-1", data_dir=data)[0] == 0
