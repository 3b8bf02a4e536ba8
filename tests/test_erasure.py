"""Erasure on the embedded default, through the command: the canary is nowhere afterwards, the structure stays,
every other session verifies, and each fault (a lost key, an unknown session, a running loop, an interrupted
erasure) ends the way docs/ERASURE.md says."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app
from foldline.config import Config, open_stores
from foldline.core.events import InboxClaim, SessionErased
from foldline.core.header import CallConfig
from foldline.errors import ContentErased, KeyMissing
from foldline.loop import Agent, AgentOptions, Toolset, inject
from foldline.providers.emulated import emulated_provider

from .erasure_helpers import canary_session, put_request_bodies, scan

CANARY = "canary-4b1e0d77"


def run(*args: str, data_dir: Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A data directory with the demo's sessions and one imported session full of the canary (with its image and
    its archived request bodies), and an export of it made before the erasure; returns the data directory."""
    data = tmp_path / "data"
    export = canary_session(tmp_path / "scratch", "secret-1", CANARY, tmp_path / "secret-1.jsonl")
    code, _, err = run("demo", "--sessions", "2", "--steps", "2", data_dir=data)
    assert code == 0, err
    code, _, err = run("import", str(tmp_path / "secret-1.jsonl"), "--attachments", str(export), data_dir=data)
    assert code == 0, err
    stores = open_stores(Config(data_dir=data))
    try:
        assert len(put_request_bodies(stores, "secret-1")) >= 2
    finally:
        stores.close()
    # the inbox: one message injected and claimed by a step (now a sealed user/message), one still pending
    code, out, err = run("inject", "secret-1", f"Remember {CANARY} too.", "--json", data_dir=data)
    assert code == 0, err
    claimed = json.loads(out)["entry"]
    code, _, err = run("resume", "secret-1", "--steps", "1", data_dir=data)
    assert code == 0, err
    code, out, err = run("inject", "secret-1", f"Still waiting: {CANARY}.", "--json", data_dir=data)
    assert code == 0, err
    pending = json.loads(out)["entry"]
    stores = open_stores(Config(data_dir=data))
    try:
        claims = [e.data for e in stores.log.read("secret-1") if isinstance(e.data, InboxClaim)]
        assert [c.entries for c in claims] == [(claimed,)]
        [entry] = stores.log.inbox().entries("secret-1")  # opened as the writer reads it
        assert (entry.id, entry.sealed) == (pending, None)
        assert CANARY in entry.item.content[0].text  # type: ignore[union-attr]
    finally:
        stores.close()
    db = sqlite3.connect(data / "log.sqlite3")
    [(body,)] = db.execute("SELECT body FROM inbox WHERE session_id = 'secret-1'").fetchall()
    db.close()
    assert b'"sealed":{' in bytes(body)
    assert CANARY.encode() not in bytes(body)  # stored sealed
    code, _, err = run("export", "secret-1", "--out", str(tmp_path / "before.jsonl"), data_dir=data)
    assert code == 0, err
    assert CANARY.encode() in (tmp_path / "before.jsonl").read_bytes()  # an export holds the content, opened
    assert scan(data, CANARY.encode()) != []  # the image object and the request bodies hold it, before
    return data


def test_the_canary_is_nowhere_after_an_erasure_and_everything_else_still_verifies(world: Path) -> None:
    data = world
    code, out, err = run("verify", data_dir=data)
    assert code == 0, out + err
    code, out, err = run(
        "erase", "secret-1", "--reason", "asked by the user", "--by", "dpo@example", "--json", data_dir=data
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["sessions"] == ["secret-1"]
    assert report["keysDestroyed"] == 1
    assert report["exportsRemoved"] == [str((data.parent / "before.jsonl").resolve())]
    assert len(report["objectsRemoved"]) >= 3  # the image and the archived request bodies
    assert not (data.parent / "before.jsonl").exists()
    [pending] = report["inboxRemoved"]  # the entry still pending; the claimed one was removed when it was taken
    assert pending.startswith("secret-1/")
    stores = open_stores(Config(data_dir=data))
    try:
        assert stores.log.inbox().stored("secret-1") == []
        with pytest.raises(ContentErased):  # nothing more enters the inbox of an erased session
            inject(stores.log, "secret-1", "too late")
    finally:
        stores.close()
    # the SQLite files (free pages and journals included), the key store, the attachments: no canary anywhere
    assert scan(data, CANARY.encode()) == []
    # the structure stays, the content says erased
    code, out, _ = run("show", "secret-1", data_dir=data)
    assert code == 0
    assert "[erased]" in out
    assert "session/erased" in out
    assert CANARY not in out
    code, out, err = run("requests", "secret-1", "--json", data_dir=data)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows
    assert all(r["erased"] and r["body"] is None and r["recordedDigest"].startswith("sha256:") for r in rows)
    # an export after the erasure: structure, no content; it cannot be imported
    code, _, err = run("export", "secret-1", "--out", str(data.parent / "after.jsonl"), data_dir=data)
    assert code == 0, err
    after = (data.parent / "after.jsonl").read_bytes()
    assert CANARY.encode() not in after
    assert b'"sealed":{' in after
    code, _, err = run("import", str(data.parent / "after.jsonl"), "--as", "again", data_dir=data)
    assert code == 2
    assert "sealed content" in err
    # verify: erased is its own status and exit code; every other session verifies as before
    code, out, _ = run("verify", "--json", data_dir=data)
    assert code == 5
    verdict = json.loads(out)
    assert verdict["status"] == "erased"
    assert verdict["erased"] == ["secret-1"]
    statuses = {s["id"]: s["status"] for s in verdict["sessions"]}
    assert statuses.pop("secret-1") == "erased"
    assert set(statuses.values()) == {"verified"}
    code, _, _ = run("verify", "demo-000", data_dir=data)
    assert code == 0
    # the erasure record and the session's own mark
    code, out, _ = run("erasures", "--json", data_dir=data)
    [record] = json.loads(out)["erasures"]
    assert record["state"] == "done"
    assert record["inbox"] == [pending]  # planned before anything was destroyed
    assert record["report"]["inboxRemoved"] == [pending]
    assert record["by"] == "dpo@example"
    assert record["reason"] == "asked by the user"
    stores = open_stores(Config(data_dir=data), read_only=True)
    try:
        marks = [e for e in stores.log.read("secret-1") if isinstance(e.data, SessionErased)]
    finally:
        stores.close()
    assert [m.data.erasure for m in marks] == [record["id"]]  # type: ignore[union-attr]
    assert marks[0].ignorable
    # run again: already erased, nothing more to do
    code, out, _ = run("erase", "secret-1", data_dir=data)
    assert code == 0
    assert "already erased" in out


def test_content_logged_before_encryption_is_sealed_in_place_and_leaves_no_plaintext_in_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    canary_session(tmp_path / "scratch", "old-1", CANARY, tmp_path / "old-1.jsonl")
    monkeypatch.setenv("FOLDLINE_ENCRYPTION", "off")
    code, _, err = run("import", str(tmp_path / "old-1.jsonl"), data_dir=data)
    assert code == 0, err
    code, out, err = run("inject", "old-1", f"Pending, in the clear: {CANARY}.", "--json", data_dir=data)
    assert code == 0, err
    entry = json.loads(out)["entry"]
    db = sqlite3.connect(data / "log.sqlite3")
    [(body,)] = db.execute("SELECT body FROM inbox WHERE session_id = 'old-1'").fetchall()
    db.close()
    assert CANARY.encode() in bytes(body)  # an inbox entry put with encryption off: in the clear
    assert CANARY.encode() in (data / "log.sqlite3").read_bytes()  # logged in the clear
    monkeypatch.setenv("FOLDLINE_ENCRYPTION", "on")
    code, out, err = run("erase", "old-1", "--json", data_dir=data)
    assert code == 0, err
    assert json.loads(out)["sealedInPlace"] > 0
    report = json.loads(out)
    # secure_delete, a truncated WAL and VACUUM: not in the file, its free pages or its journal (the events sealed
    # in place, the inbox row deleted)
    assert scan(data, CANARY.encode()) == []
    assert report["inboxRemoved"] == [f"old-1/{entry}"]
    code, out, _ = run("verify", "old-1", data_dir=data)
    assert code == 5


def test_a_lost_key_is_a_loud_error_never_taken_for_an_erasure(world: Path) -> None:
    db = sqlite3.connect(world / "keys.sqlite3")
    db.execute("DELETE FROM keys WHERE session_id = 'secret-1'")
    db.commit()
    db.close()
    for command in (["verify", "secret-1"], ["show", "secret-1"], ["export", "secret-1", "--out", "-"]):
        code, out, err = run(*command, data_dir=world)
        assert code == 2, (command, out, err)
        assert "KeyMissing" in err
        assert "lost" in err
        assert "erased" not in err.split("KeyMissing")[0]
    code, _, err = run("erase", "secret-1", data_dir=world)
    assert code == 2
    assert "KeyMissing" in err
    stores = open_stores(Config(data_dir=world))
    try:  # the pending inbox entry is sealed with the lost key: KeyMissing too, never an empty inbox
        with pytest.raises(KeyMissing):
            stores.log.inbox().entries("secret-1")
    finally:
        stores.close()


def test_erasing_what_does_not_exist_is_a_typed_error(world: Path) -> None:
    code, _, err = run("erase", "no-such-session", data_dir=world)
    assert code == 2
    assert "NothingToErase" in err
    code, _, err = run("erase", "--subject", "nobody@example", data_dir=world)
    assert code == 2
    assert "NothingToErase" in err
    code, _, err = run("erase", data_dir=world)
    assert code == 2
    code, _, err = run("erase", "demo-000", "--subject", "x", data_dir=world)
    assert code == 2


def test_a_subject_spans_sessions_and_its_forks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for sid in ("alice-1", "alice-2"):
        images = canary_session(tmp_path / f"scratch-{sid}", sid, CANARY, tmp_path / f"{sid}.jsonl")
        bound = ("--subject", "alice@example.com", "--attachments", str(images))
        code, _, err = run("import", str(tmp_path / f"{sid}.jsonl"), *bound, data_dir=data)
        assert code == 0, err
    images = canary_session(tmp_path / "scratch-bob", "bob-1", "bob-only-content", tmp_path / "bob-1.jsonl")
    assert run("import", str(tmp_path / "bob-1.jsonl"), "--attachments", str(images), data_dir=data)[0] == 0
    code, _, err = run("fork", "alice-1", "--at", "8", "--as", "alice-1-fork", data_dir=data)
    assert code == 0, err
    code, out, err = run("erase", "--subject", "alice@example.com", "--json", data_dir=data)
    assert code == 0, err
    assert json.loads(out)["sessions"] == ["alice-1", "alice-1-fork", "alice-2"]
    assert scan(data, CANARY.encode()) == []
    assert run("verify", "bob-1", data_dir=data)[0] == 0
    code, out, _ = run("erasures", "--json", data_dir=data)
    [record] = json.loads(out)["erasures"]
    assert record["scope"] == "subject"
    assert "alice" not in record["target"]  # the subject id is kept only as its digest


def test_a_loop_running_when_its_session_is_erased_stops_with_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = Config(data_dir=data)
    started, go_on = threading.Event(), threading.Event()
    tools = Toolset()

    @tools.tool
    def wait_here(topic: str) -> str:
        """Wait until told to go on."""
        started.set()
        go_on.wait(30)
        return f"done with {topic}"

    outcome: list[BaseException | None] = []

    def loop() -> None:
        stores = open_stores(config)
        provider = emulated_provider()
        options = AgentOptions(config=CallConfig("anthropic", "claude-emulated", max_tokens=256), tools=tools)

        async def go() -> None:
            agent = Agent("running", stores.log, provider, options, attachments=stores.attachments)
            try:
                await agent.run_turn(f"Please wait for {CANARY}.")
            finally:
                await provider.aclose()

        try:
            asyncio.run(go())
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        finally:
            stores.close()

    thread = threading.Thread(target=loop)
    thread.start()
    assert started.wait(30)
    code, _, err = run("erase", "running", "--reason", "mid-turn", data_dir=data)
    assert code == 0, err
    go_on.set()
    thread.join(60)
    [error] = outcome
    assert isinstance(error, ContentErased), error
    assert "erased" in str(error)
    assert "nothing of this step was written" in str(error)
    # nothing half-written: the log is a valid log (the rules hold) ending in the erasure's mark
    stores = open_stores(config, read_only=True)
    try:
        events = stores.log.read_stored("running")
    finally:
        stores.close()
    from foldline.core.validation import check_log

    check_log(events)
    assert isinstance(events[-1].data, SessionErased)
    assert scan(data, CANARY.encode()) == []


_KILLED_ERASE = """
import os, signal, sys
import foldline.erasure as erasure
step = sys.argv[1]
real = getattr(erasure, step)
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(erasure, step, die)
from foldline.cli.main import app
sys.argv = ["foldline", "erase", "secret-1", "--reason", "interrupted", "--data-dir", sys.argv[2]]
app()
"""


@pytest.mark.parametrize("step", ["_erase_one", "_purge_objects", "_purge_exports"])
def test_an_erasure_killed_midway_completes_when_run_again(world: Path, step: str) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_ERASE, step, str(world)], check=False, capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    code, out, _ = run("erasures", "--json", data_dir=world)
    [pending] = json.loads(out)["erasures"]
    assert pending["state"] == "pending"
    code, out, err = run("erase", "secret-1", "--json", data_dir=world)
    assert code == 0, err
    finished = json.loads(out)
    assert finished["resumed"] is True
    assert finished["erasure"] == pending["id"]
    assert scan(world, CANARY.encode()) == []
    assert not (world.parent / "before.jsonl").exists()
    code, out, _ = run("erasures", "--json", data_dir=world)
    [done] = json.loads(out)["erasures"]
    assert done["state"] == "done"
    assert run("verify", "demo-000", data_dir=world)[0] == 0
