"""The golden reasoning logs: byte-stable events, Avro round trips, verify reports and the catalog they add."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from foldline.adapters.avro import AvroCodec
from foldline.core.content import ContentBlock, RedactedReasoningBlock
from foldline.core.drops import session_drops
from foldline.core.events import AssistantMessage, CompactionSummary, Envelope, RequestDispatch, RequestHeader
from foldline.core.wire import decode_event, encode_event
from foldline.replay.verify import verify_events

from .layout import SESSIONS
from .reasoning import REASONING_DIR, REASONING_SESSIONS
from .test_golden_logs import blocks_of, golden_events


def lines(session: str) -> list[bytes]:
    return (REASONING_DIR / f"{session}.jsonl").read_bytes().split(b"\n")[1:-1]


def events(session: str) -> list[Envelope]:
    return [decode_event(line) for line in lines(session)]


@pytest.mark.parametrize("session", REASONING_SESSIONS)
def test_every_event_reencodes_to_its_bytes_and_round_trips_through_avro(session: str) -> None:
    codec = AvroCodec()
    for line in lines(session):
        event = decode_event(line)
        assert encode_event(event) == line
        assert codec.decode(codec.encode(event)) == event


@pytest.mark.parametrize("session", REASONING_SESSIONS)
def test_verify_reproduces_the_committed_report(session: str) -> None:
    report = verify_events(session, events(session))
    assert report.ok
    assert report.to_json() == json.loads((REASONING_DIR / f"{session}.verify.json").read_bytes())


def test_together_with_the_v0_logs_every_block_kind_and_serializer_has_a_golden_example() -> None:
    everything = [e for s in SESSIONS for e in golden_events(s)] + [e for s in REASONING_SESSIONS for e in events(s)]
    kinds = {type(b) for b in blocks_of(everything)}
    # the emulator never redacts thinking; redacted blocks are in the serializer fixtures and the property tests
    assert set(get_args(ContentBlock)) - kinds == {RedactedReasoningBlock}
    dispatched = {(d.serializer, d.serializer_version) for e in everything if isinstance(d := e.data, RequestDispatch)}
    assert dispatched == {
        ("anthropic-messages", 1),
        ("anthropic-messages", 2),
        ("anthropic-messages", 3),
        ("openai-chat", 1),
        ("openai-chat", 2),
        ("openai-responses", 1),
        ("openai-responses", 2),
        ("reasoning-chat", 1),
    }


def test_the_anthropic_reasoning_log_shows_each_explained_drop() -> None:
    log = events("reasoning-anthropic")
    drops = session_drops("reasoning-anthropic", log)
    assert [d.cause for d in drops] == ["first-request", "header-change", "compaction"]
    assert drops[1].causes == ("header-change", "thinking-context", "cache-ttl")
    assert all(d.explained for d in drops)
    headers = [e.data for e in log if isinstance(e.data, RequestHeader)]
    assert [(h.reason, h.header.config.reasoning_effort, h.header.config.cache_ttl) for h in headers] == [
        ("initial", "high", "1h"),
        ("change", "max", "1h"),
    ]
    summary = next(e.data for e in log if isinstance(e.data, CompactionSummary))
    assert (summary.serializer, summary.serializer_version, summary.prompt_version) == ("anthropic-messages", 2, 1)
    answers = [e.data for e in log if isinstance(e.data, AssistantMessage)]
    assert all(a.content[0].kind == "reasoning" for a in answers)
