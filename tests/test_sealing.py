"""Sealed content: every field marked content is sealed, nothing else is; tokens are bound to their place; an erased
key leaves the structure readable and nothing buildable; a lost key is a loud error of its own."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_keys import MemoryKeyStore
from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.sealing import ContentSealer, b64url, kek_from_text, unb64url
from foldline.adapters.sqlite_keys import SqliteKeyStore
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core.content import (
    EncryptedReasoningBlock,
    ImageBlock,
    ImageRef,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    Usage,
)
from foldline.core.events import (
    EVENT_TYPES,
    AssistantChunk,
    AssistantMessage,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    StepStart,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
)
from foldline.core.frozen import OrderedObject
from foldline.core.header import CallConfig, ToolSpec, make_header
from foldline.core.inbox import InboxDecision, InboxEntry, InboxMessage, encode_entry
from foldline.core.limits import MAX_EVENT_BYTES, check_stored_size
from foldline.core.projection import Session, fold_messages
from foldline.core.sealing import (
    ERASED,
    SEALED_KEY,
    associated_data,
    content_fields,
    content_paths,
    erased_view,
    has_content,
    open_event,
)
from foldline.core.validation import check_log
from foldline.core.wire import decode_event, encode_event
from foldline.errors import ConfigError, ContentCorrupt, ContentErased, KeyMissing, StoreUnavailable
from foldline.ports.key_store import SessionKey, subject_digest

CANARY = "canary-7f3a9c"
IMG = ImageRef("sha256:" + "ab" * 32, "image/png", 1234, 640, 480, name=f"{CANARY}.png")
HEADER = make_header(
    CallConfig(
        "anthropic",
        "claude-x",
        max_tokens=512,
        output_schema={"type": "object", "properties": {"z": {"const": CANARY}, "a": {"type": "string"}}},
        output_name="Reading",
    ),
    f"You help {CANARY}.",
    [ToolSpec("read", f"Read a file of {CANARY}", {"type": "object", "properties": {"p": {"enum": [CANARY]}}})],
)
ARGS = '{"p": "' + CANARY + '"}'


def every_content() -> list[Envelope]:
    """A valid session holding every content field of the catalog, each with the canary."""
    answer = AssistantMessage(
        "a1",
        (
            ReasoningBlock(f"thinking {CANARY}", f"sig-{CANARY}"),
            RedactedReasoningBlock(f"redacted-{CANARY}"),
            EncryptedReasoningBlock("rs_1", (f"one {CANARY}", f"two {CANARY}"), f"enc-{CANARY}"),
            TextBlock(f"calling {CANARY}"),
            ToolCallBlock("c1", "read", ARGS),
        ),
        Usage(10, 5, 100, 7),
        "tool_use",
    )
    data: list[EventData] = [
        TurnStart(0),
        StepStart(0, 0),
        UserMessage("u1", (TextBlock(f"hello {CANARY}"), ImageBlock(IMG))),
        RequestHeader(HEADER, "initial"),
        RequestDispatch(0, 0, "anthropic-messages", 3, "sha256:" + "0f" * 32, 999),
        answer,
        ToolCall(0, 0, "c1", "read", ARGS),
        ToolResult("c1", "read", (TextBlock(f"result {CANARY}"), ImageBlock(IMG))),
        CompactionStart(0, 1, 100),
        CompactionSummary(f"summary {CANARY}", "anthropic", "claude-x", 256),
        UserMessage(
            "u2",
            (TextBlock(f"[Summary of the earlier conversation]\nsummary {CANARY}"),),
            "compaction",
            ReplaceOp(0, 1),
            (2, 5),
        ),
    ]
    events = [Envelope(i, 1000 + i, d) for i, d in enumerate(data)]
    events.append(Envelope(len(events), 2000, AssistantChunk(0, 0, 1, 0, f"delta {CANARY}"), ignorable=True))
    return events


def _sealer(keys: MemoryKeyStore | None = None, **kw: object) -> ContentSealer:
    return ContentSealer(keys or MemoryKeyStore(), **kw)  # type: ignore[arg-type]


def test_every_content_field_is_sealed_and_nothing_else() -> None:
    events = every_content()
    sealer = _sealer()
    sealed = sealer.seal("s1", events)
    for plain, env in zip(events, sealed, strict=True):
        stored = encode_event(env)
        assert CANARY.encode() not in stored, stored  # no content is left in the clear
        if has_content(type(plain.data)) and content_paths(plain):
            assert env.sealed is not None
            assert env.sealed.v == 1
            # the structure stays: the same paths, the same non-content values
            assert content_paths(env) == content_paths(plain)
            assert erased_view(env).data == erased_view(msgspec.structs.replace(plain, sealed=env.sealed)).data
        else:
            assert env is plain  # no content, no marker: written as it always was
    assert sealer.open("s1", sealed) == events
    # what the marks seal, the content field list names: the sealed paths of every event end in one of them
    fields = {f.split(".", 1)[1] for f in content_fields(*EVENT_TYPES)}
    ends = {p.rsplit(".", 1)[-1].split("[")[0] for e in events for p in content_paths(e)}
    assert ends == fields


def test_structure_stays_readable_after_erasure_and_nothing_can_be_built_from_it() -> None:
    keys = MemoryKeyStore()
    sealer = _sealer(keys)
    sealed = sealer.seal("s1", every_content())
    keys.destroy("s1", "erasure-1", 5)
    sealer.forget("s1")
    back = sealer.open("s1", sealed)
    assert back == sealed  # erased: the tokens stay, the marker says so
    answer = back[5].data
    assert isinstance(answer, AssistantMessage)
    assert answer.usage == Usage(10, 5, 100, 7)
    assert answer.stop_reason == "tool_use"
    assert [type(b).__name__ for b in answer.content][-1] == "ToolCallBlock"
    assert isinstance(back[4].data, RequestDispatch)
    assert back[4].data.digest == "sha256:" + "0f" * 32
    shown = erased_view(back[2]).data
    assert isinstance(shown, UserMessage)
    assert shown.content[0] == TextBlock(ERASED)
    check_log(back)  # the log rules hold of the structure (tool/call arguments are not compared then)
    with pytest.raises(ContentErased):
        Session("s1", back)
    with pytest.raises(ContentErased):
        fold_messages(back)


def test_a_lost_key_is_key_missing_never_an_erasure() -> None:
    keys = MemoryKeyStore()
    sealed = _sealer(keys).seal("s1", every_content())
    with pytest.raises(KeyMissing, match="lost"):
        _sealer(MemoryKeyStore()).open("s1", sealed)  # another (empty) key store
    other = MemoryKeyStore()
    _sealer(other).seal("s1", every_content())  # a new key under the same session id
    with pytest.raises(KeyMissing, match="the store's key is"):
        _sealer(other).open("s1", sealed)


def test_tokens_are_bound_to_session_seq_type_and_field() -> None:
    keys = MemoryKeyStore()
    sealer = _sealer(keys)
    env = sealer.seal("s1", [Envelope(2, 1, UserMessage("u", (TextBlock("a"), TextBlock("b"))))])[0]
    assert env.sealed is not None
    data = env.data
    assert isinstance(data, UserMessage)
    swapped = msgspec.structs.replace(env, data=msgspec.structs.replace(data, content=data.content[::-1]))
    with pytest.raises(ContentCorrupt, match=r"content\[0\]\.text"):
        sealer.open("s1", [swapped])
    moved = msgspec.structs.replace(env, seq=3)
    with pytest.raises(ContentCorrupt):
        sealer.open("s1", [moved])
    held = keys.get("s1")
    assert held is not None
    keys.create(dataclasses.replace(held, session_id="s2"))
    with pytest.raises(ContentCorrupt):
        sealer.open("s2", [env])  # the same key, another session: the associated data differs
    token = data.content[0].text  # type: ignore[union-attr]
    raw = unb64url(token)
    assert raw is not None
    flipped = b64url(raw[:-1] + bytes([raw[-1] ^ 1]))
    broken = msgspec.structs.replace(
        env, data=msgspec.structs.replace(data, content=(TextBlock(flipped), data.content[1]))
    )
    with pytest.raises(ContentCorrupt):
        sealer.open("s1", [broken])


def test_every_seal_draws_a_fresh_nonce_so_a_retried_append_never_reuses_one() -> None:
    sealer = _sealer()
    event = Envelope(0, 1, UserMessage("u", (TextBlock("the same text"),)))
    first, again = sealer.seal("s", [event])[0], sealer.seal("s", [event])[0]
    assert encode_event(first) != encode_event(again)
    assert sealer.open("s", [first]) == sealer.open("s", [again]) == [event]
    tokens = [unb64url(e.data.content[0].text) for e in (first, again)]  # type: ignore[union-attr]
    assert tokens[0] is not None
    assert tokens[1] is not None
    assert tokens[0][:12] != tokens[1][:12]


def test_the_associated_data_and_the_token_format_are_what_format_md_says() -> None:
    assert associated_data("s", "ab" * 16, 4, "user/message", "content[0].text") == (
        b'["foldline-sealed",1,"s","' + b"ab" * 16 + b'",4,"user/message","content[0].text"]'
    )
    env = _sealer().seal("s", [Envelope(0, 1, RequestHeader(HEADER, "initial"))])[0]
    assert isinstance(env.data, RequestHeader)
    assert env.data.header.tools is not None
    schema = env.data.header.tools[0].input_schema
    assert list(schema) == [SEALED_KEY]
    token = schema[SEALED_KEY]
    assert isinstance(token, str)
    raw = unb64url(token)
    assert raw is not None
    assert len(raw) == 12 + len(b'{"properties":{"p":{"enum":["canary-7f3a9c"]}},"type":"object"}') + 16


def test_a_sealed_event_opens_only_with_its_own_version() -> None:
    env = _sealer().seal("s", [Envelope(0, 1, UserMessage("u", (TextBlock("x"),)))])[0]
    assert env.sealed is not None
    future = msgspec.structs.replace(env, sealed=msgspec.structs.replace(env.sealed, v=2))
    with pytest.raises(Exception, match="version 2"):
        open_event(future, "s", lambda token, aad: b"x")


def test_events_without_content_need_no_key_and_an_erased_session_takes_no_content() -> None:
    keys = MemoryKeyStore()
    sealer = _sealer(keys)
    assert sealer.seal("s", [Envelope(0, 1, TurnStart(0))]) == [Envelope(0, 1, TurnStart(0))]
    assert keys.get("s") is None  # no key was made for structure alone
    sealer.seal("s", [Envelope(1, 1, UserMessage("u", (TextBlock("x"),)))])
    keys.destroy("s", "e", 1)
    sealer.forget("s")
    assert sealer.seal("s", [Envelope(2, 1, TurnStart(1))]) == [Envelope(2, 1, TurnStart(1))]
    with pytest.raises(ContentErased, match="nothing more can be appended"):
        sealer.seal("s", [Envelope(2, 1, UserMessage("u2", (TextBlock("y"),)))])


def test_a_cached_key_reads_for_at_most_the_cache_time_after_an_erasure() -> None:
    now = [0.0]
    keys = MemoryKeyStore()
    writer = _sealer(keys)
    sealed = writer.seal("s", every_content())
    reader = ContentSealer(keys, cache_ttl_s=30.0, clock=lambda: now[0])
    assert reader.open("s", sealed) == every_content()  # the reader now holds the key
    keys.destroy("s", "e", 1)
    now[0] = 29.9
    assert reader.open("s", sealed) == every_content()  # within the stated bound: still readable
    now[0] = 30.0
    assert reader.open("s", sealed) == sealed  # past it: erased, for good
    assert reader.cached("s")  # a destroyed key is remembered as destroyed


def test_the_stored_size_check_needs_the_plain_size_only_near_the_limit() -> None:
    asked: list[int] = []

    def plain() -> int:
        asked.append(1)
        return MAX_EVENT_BYTES + 1

    check_stored_size(1000, True, plain)
    assert asked == []
    with pytest.raises(Exception, match="event-size"):
        check_stored_size(MAX_EVENT_BYTES // 4, True, plain)
    assert asked == [1]


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_a_plain_event_is_at_most_four_and_a_half_times_its_sealed_form(text: str) -> None:
    env = Envelope(0, 1, UserMessage("u", (TextBlock(text), TextBlock(text[::-1]))))
    sealed = _sealer().seal("s", [env])[0]
    assert len(encode_event(env)) * 2 <= len(encode_event(sealed)) * 9


def test_the_embedded_logs_store_sealed_bytes_and_read_back_what_was_appended(tmp_path: Path) -> None:
    keys = SqliteKeyStore(tmp_path / "keys.sqlite3")
    sealer = ContentSealer(keys)
    for log in (SqliteEventLog(tmp_path / "log.sqlite3", sealer=sealer), MemoryEventLog(sealer=sealer)):
        sid = f"s-{type(log).__name__}"
        log.append(sid, 0, every_content())
        assert log.read(sid) == every_content()
        stored = log.read_stored(sid)
        assert any(e.sealed is not None for e in stored)
        assert all(CANARY.encode() not in encode_event(e) for e in stored)
        assert [decode_event(encode_event(e)) for e in stored] == stored
        log.close()
    keys.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert CANARY.encode() not in raw


def test_the_embedded_key_store_keeps_no_copy_of_a_destroyed_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    keys = SqliteKeyStore(path)
    sealer = ContentSealer(keys)
    sealer.seal("s", [Envelope(0, 1, UserMessage("u", (TextBlock("x"),)))])
    key = keys.get("s")
    assert key is not None
    assert key.material is not None
    assert key.material in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())  # the file or its WAL
    keys.destroy("s", "erasure-1", 7)
    keys.vacuum()
    keys.close()
    leftovers = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert key.material not in leftovers
    row = sqlite3.connect(path).execute("SELECT kid, material, erasure FROM keys").fetchone()
    assert row == (key.kid, None, "erasure-1")


def test_a_key_encryption_key_keeps_the_data_keys_out_of_the_file(tmp_path: Path) -> None:
    kek = kek_from_text("11" * 32)
    keys = SqliteKeyStore(tmp_path / "keys.sqlite3", kek=kek)
    env = ContentSealer(keys).seal("s", [Envelope(0, 1, UserMessage("u", (TextBlock("x"),)))])[0]
    material = keys.get("s").material  # type: ignore[union-attr]
    keys.close()
    assert material is not None
    assert material not in b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert ContentSealer(SqliteKeyStore(tmp_path / "keys.sqlite3", kek=kek)).open("s", [env])[0].sealed is None
    with pytest.raises(ConfigError, match="FOLDLINE_KEY_ENCRYPTION_KEY"):
        SqliteKeyStore(tmp_path / "keys.sqlite3").get("s")
    with pytest.raises(ConfigError, match="does not unwrap"):
        SqliteKeyStore(tmp_path / "keys.sqlite3", kek=kek_from_text("22" * 32)).get("s")
    with pytest.raises(ConfigError, match="32 random bytes"):
        kek_from_text("too short")


def test_an_ordered_input_schema_is_sealed_and_opened_in_its_document_order() -> None:
    """§1.9 / §3.5: the sealed plaintext of an ordered object is its document-order text, and it opens ordered."""
    schema = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}
    header = make_header(CallConfig("anthropic", "claude-x", max_tokens=512), None, [ToolSpec("t", "T.", schema)])
    plain = [Envelope(0, 1000, RequestHeader(header, "initial"))]
    sealer = _sealer()
    [opened] = sealer.open("s1", sealer.seal("s1", plain))
    assert isinstance(opened.data, RequestHeader)
    [tool] = opened.data.header.tools or ()
    assert isinstance(tool.input_schema, OrderedObject)
    assert tool.input_schema.json == (
        b'{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}}'
    )
    assert encode_event(opened) == encode_event(plain[0])


def test_inbox_entries_are_stored_sealed_opened_when_taken_and_refused_once_erased(tmp_path: Path) -> None:
    keys = SqliteKeyStore(tmp_path / "keys.sqlite3")
    sealer = ContentSealer(keys)
    log = SqliteEventLog(tmp_path / "log.sqlite3", sealer=sealer)
    inbox = log.inbox()
    message = InboxEntry("m1", 1, InboxMessage((TextBlock(f"say {CANARY}"),), "inject"))
    decision = InboxEntry("d1", 2, InboxDecision("call-1", "allow", f"ok {CANARY}", f'{{"q":"{CANARY}"}}', "ops"))
    bare = InboxEntry("d2", 3, InboxDecision("call-2", "allow"))
    for entry in (message, decision, bare):
        assert inbox.put("s1", entry)
    assert inbox.entries("s1") == [message, decision, bare]  # opened as the writer reads them
    stored = inbox.stored("s1")
    assert [e.sealed is not None for e in stored] == [True, True, False]  # a bare allow holds no content
    assert isinstance(stored[1].item, InboxDecision)
    assert (stored[1].item.call_id, stored[1].item.verdict) == ("call-1", "allow")  # the structure stays
    assert all(CANARY.encode() not in encode_entry(e) for e in stored)
    # a token is bound to its entry: moved to another entry, it does not open
    moved = msgspec.structs.replace(stored[0], id="m2")
    with pytest.raises(ContentCorrupt):
        sealer.open_entries("s1", [moved])
    # a lost key is KeyMissing, never an empty inbox
    with pytest.raises(KeyMissing, match="lost"):
        _sealer(MemoryKeyStore()).open_entries("s1", stored)
    # erased: nothing is taken from the inbox or put into it
    keys.destroy("s1", "erasure-1", 5)
    sealer.forget("s1")
    with pytest.raises(ContentErased):
        inbox.entries("s1")
    with pytest.raises(ContentErased):
        inbox.put("s1", InboxEntry("m3", 4, InboxMessage((TextBlock("late"),))))
    with pytest.raises(ContentErased):  # encryption off: still refused
        ContentSealer(keys, seal_new=False).seal_entry("s1", message)
    assert inbox.purge("s1") == ["m1", "d1", "d2"]
    assert inbox.stored("s1") == []
    log.scrub()
    log.close()
    keys.close()


class _CountingKeys(MemoryKeyStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def get(self, session_id: str) -> SessionKey | None:
        self.calls.append("get")
        return super().get(session_id)

    def create(self, key: SessionKey) -> SessionKey:
        self.calls.append("create")
        return super().create(key)


def test_a_sessions_first_events_create_its_key_with_one_store_call_and_a_bound_key_is_kept() -> None:
    """Sealing seq 0 asks the store to create the key outright (one call, not a read then a write: each is an S3
    request in the distributed backend); a key bound beforehand (a subject's) is what the create answers."""
    keys = _CountingKeys()
    sealer = ContentSealer(keys)
    sealer.seal("new", [Envelope(0, 1, UserMessage("u", (TextBlock("hello"),)))])
    assert keys.calls == ["create"]
    keys.calls.clear()
    later = ContentSealer(keys)  # another process, the session already open: a read finds its key
    later.seal("new", [Envelope(1, 1, UserMessage("u", (TextBlock("again"),)))])
    assert keys.calls == ["get"]
    sealer.bind("bound", "user-7")
    sealer.forget("bound")
    first = sealer.seal("bound", [Envelope(0, 1, UserMessage("u", (TextBlock("mine"),)))])
    stored = keys.get("bound")
    assert stored is not None
    assert stored.subject == subject_digest("user-7")  # the subject's key, not a new one
    assert sealer.open("bound", first)[0].data == UserMessage("u", (TextBlock("mine"),))


class _GatedKeys(_CountingKeys):
    """A key store whose creates wait for ``gate`` and fail (StoreUnavailable) the next ``failing`` times."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.failing = 0

    def create(self, key: SessionKey) -> SessionKey:
        assert self.gate.wait(10), "the test never opened the gate"
        if self.failing:
            self.failing -= 1
            self.calls.append("create-failed")
            raise StoreUnavailable("the key store did not answer (injected)")
        return super().create(key)


def _first(text: str) -> list[Envelope]:
    return [Envelope(0, 1, UserMessage("u", (TextBlock(text),)))]


def test_a_warmed_key_is_made_once_ahead_of_the_first_write_which_then_asks_the_store_nothing() -> None:
    keys = _GatedKeys()
    keys.gate.clear()
    sealer = ContentSealer(keys)
    sealer.make_ahead("new")
    making = sealer.making("new")
    assert making is not None
    assert not making.done()
    sealer.make_ahead("new")  # asked again meanwhile: still one making
    assert sealer.making("new") is making
    keys.gate.set()
    making.result(10)
    assert sealer.making("new") is None
    assert sealer.cached("new")
    sealed = sealer.seal("new", _first("hello"))
    assert keys.calls == ["create"]  # one create, made ahead; the write asked the store nothing
    assert sealer.open("new", sealed)[0].data == UserMessage("u", (TextBlock("hello"),))
    sealer.make_ahead("new")  # held already: nothing to make
    assert sealer.making("new") is None
    assert keys.calls == ["create"]
    off = ContentSealer(keys, seal_new=False)
    off.make_ahead("plain")  # encryption off: no key is made for new content
    assert off.making("plain") is None
    sealer.close()
    sealer.make_ahead("after-close")
    assert sealer.making("after-close") is None
    assert keys.calls == ["create"]


def test_a_write_waits_for_its_key_being_made_and_a_failed_making_is_asked_again_with_its_error() -> None:
    keys = _GatedKeys()
    keys.gate.clear()
    sealer = ContentSealer(keys)
    sealer.make_ahead("slow")
    sealed: list[list[Envelope]] = []
    writer = threading.Thread(target=lambda: sealed.append(sealer.seal("slow", _first("waited"))))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive()
    assert not sealed
    keys.gate.set()
    writer.join(10)
    assert len(sealed) == 1
    assert keys.calls == ["create"]
    keys.failing = 2  # the making fails, and so does the write's own attempt: the store's error is raised
    sealer.make_ahead("down")
    with pytest.raises(StoreUnavailable, match="injected"):
        sealer.seal("down", _first("lost?"))
    assert keys.calls[1:] == ["create-failed", "create-failed"]
    keys.failing = 1  # the making fails, the write's own attempt succeeds
    sealer.make_ahead("flaky")
    flaky = sealer.seal("flaky", _first("kept"))
    assert keys.calls[3:] == ["create-failed", "create"]
    assert sealer.open("flaky", flaky)[0].data == UserMessage("u", (TextBlock("kept"),))
    sealer.close()


def _agent_options(**kwargs: Any) -> Any:
    from foldline.core.header import CallConfig as Config
    from foldline.loop import AgentOptions

    return AgentOptions(config=Config("anthropic", "claude-emulated", max_tokens=64), **kwargs)


def test_a_new_sessions_key_is_made_as_its_loop_opens_unless_many_open_at_once() -> None:
    from foldline.loop import Agent
    from foldline.loop.agent import KEYS_AT_OPEN_BELOW
    from foldline.ports.event_log import WriterLease
    from foldline.providers.emulated import emulated_provider

    class Slow(MemoryEventLog):  # an opening takes a moment, as a broker's does: openings overlap
        async def acquire_and_read_async(self, session_id: str) -> tuple[WriterLease, list[Envelope]]:
            await asyncio.sleep(0.01)
            return self.acquire_and_read(session_id)

    keys = _GatedKeys()
    keys.gate.clear()
    sealer = ContentSealer(keys)
    log = Slow(sealer=sealer)
    asyncio.run(Agent.open("fresh", log, emulated_provider(), _agent_options()))
    making = sealer.making("fresh")
    assert making is not None  # under way while the session's first request is handed over
    keys.gate.set()
    making.result(10)
    log.append("fresh", 0, _first("hi"))
    assert keys.calls == ["create"]  # the first write used it
    sealer.forget("fresh")
    asyncio.run(Agent.open("fresh", log, emulated_provider(), _agent_options()))
    assert sealer.making("fresh") is None  # it has events: nothing to make
    keys.gate.clear()
    crowd = [f"crowd-{i}" for i in range(KEYS_AT_OPEN_BELOW * 4)]

    async def open_all() -> None:
        await asyncio.gather(*(Agent.open(sid, log, emulated_provider(), _agent_options()) for sid in crowd))

    asyncio.run(open_all())
    # opened all at once: their keys are left to their first steps, not written while the others open (only
    # the last few, opened once fewer than KEYS_AT_OPEN_BELOW were still opening, start theirs at once)
    assert sum(sealer.making(sid) is not None for sid in crowd) <= KEYS_AT_OPEN_BELOW
    keys.gate.set()
    sealer.close()


def test_a_key_left_to_the_first_step_is_made_during_its_hand_over_and_the_first_write_uses_it() -> None:
    from foldline.adapters.memory_folds import MemoryFoldStore
    from foldline.core.fold import fold_state
    from foldline.core.projection import Session
    from foldline.dispatcher import Dispatcher
    from foldline.loop import Agent
    from foldline.ports.event_log import WriterLease
    from foldline.ports.step_dispatch import PreparedStep, StepHandoff
    from foldline.providers.emulated import emulated_provider

    keys = _GatedKeys()
    keys.gate.clear()
    sealer = ContentSealer(keys)
    folds = MemoryFoldStore()

    class Projecting(MemoryEventLog):  # folds every append at once, as a projector would
        def append(
            self, session_id: str, expected_seq: int, events: Sequence[Envelope], *, lease: WriterLease | None = None
        ) -> int:
            head = super().append(session_id, expected_seq, events, lease=lease)
            folds.put(fold_state(Session(session_id, self.read(session_id)), 0))
            return head

    seen: list[bool] = []

    class Watching(Dispatcher):
        async def prepare(self, handoff: StepHandoff) -> PreparedStep:
            if not seen:  # the first hand-over (nothing written yet): the key is being made meanwhile
                seen.append(sealer.making("fresh") is not None)
                keys.gate.set()
            return await super().prepare(handoff)

    log = Projecting(sealer=sealer)
    provider = emulated_provider()
    dispatcher = Watching(folds, {"anthropic": provider}, fold_timeout_s=2.0)
    agent = Agent("fresh", log, provider, _agent_options(dispatcher=dispatcher))  # not opened by Agent.open
    assert sealer.making("fresh") is None
    asyncio.run(agent.run_turn("hello"))
    assert seen == [True]
    assert keys.calls == ["create"]  # made once, during the hand-over; the first write asked the store nothing
    assert any(e.sealed is not None for e in log.read_stored("fresh"))
    sealer.close()
