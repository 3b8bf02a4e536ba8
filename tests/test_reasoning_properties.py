"""Properties of random reasoning sessions, for every serializer version: the request the loop's path builds
(cached fold + incremental body) equals a fresh rebuild from the log, and while the header is unchanged each
body is an append-extension of the previous one."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import (
    AssistantMessage,
    CallConfig,
    EncryptedReasoningBlock,
    Envelope,
    ReasoningBlock,
    RedactedReasoningBlock,
    RequestHeader,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    ToolSpec,
    UserMessage,
    build_request,
    fold_messages,
    fold_request_header,
)
from foldline.core.codec import canonical_json
from foldline.core.events import EventData
from foldline.core.header import EpochHeader
from foldline.core.projection import Session
from foldline.providers import SERIALIZERS
from foldline.providers.framing import IncrementalBody
from foldline.replay.step import session_request

text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
reasoning = st.one_of(
    st.builds(ReasoningBlock, text, st.none() | text),
    st.builds(RedactedReasoningBlock, text),
    st.builds(EncryptedReasoningBlock, text, st.lists(text, max_size=2).map(tuple), text),
)
# one step: the user texts entered, the answer's reasoning blocks, its text, how many tools it calls
step = st.tuples(st.lists(text, max_size=2), st.lists(reasoning, max_size=3), text, st.integers(0, 2))
session = st.lists(step, min_size=1, max_size=6)

TOOLS = (ToolSpec("read", "Read.", {"type": "object", "properties": {"p": {"type": "string"}}}),)


def header_for(name: str) -> EpochHeader:
    provider = {"anthropic-messages": "anthropic", "reasoning-chat": "deepseek"}.get(name, "openai")
    return EpochHeader(CallConfig(provider, "m", max_tokens=4096, reasoning_effort="high"), "Be careful.", TOOLS)


def build_log(steps: list[Any], header: EpochHeader) -> tuple[list[Envelope], list[int]]:
    """The events of the session and the boundaries (next seq) at which a request is built."""
    events: list[Envelope] = []
    boundaries: list[int] = []

    def add(data: EventData) -> None:
        events.append(Envelope(len(events), len(events), data))

    add(RequestHeader(header, "initial"))
    calls = 0
    pending_results = False
    for users, thoughts, said, n_calls in steps:
        for u in users or ([] if pending_results else ["go on"]):
            add(UserMessage(f"u{len(events)}", (TextBlock(u),)))
        boundaries.append(len(events))
        tool_calls = [ToolCallBlock(f"c{calls + k}", "read", json.dumps({"p": str(k)})) for k in range(n_calls)]
        calls += n_calls
        add(AssistantMessage(f"a{len(events)}", (*thoughts, TextBlock(said), *tool_calls)))
        for call in tool_calls:
            add(ToolCall(0, len(boundaries), call.id, call.name, call.arguments))
        for call in tool_calls:
            add(ToolResult(call.id, "read", (TextBlock(f"result of {call.id}"),)))
        pending_results = bool(tool_calls)
    return events, boundaries


def list_close(body: bytes, key: str) -> int:
    marker = f'"{key}":'.encode()
    start = body.index(marker) + len(marker)
    return start + len(canonical_json(json.loads(body)[key])) - 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=session)
def test_every_request_equals_a_fresh_rebuild_and_extends_the_previous_body(steps: list[Any]) -> None:
    store = MemoryAttachmentStore()
    for (name, _version), serializer in sorted(SERIALIZERS.items()):
        events, boundaries = build_log(steps, header_for(name))
        live = Session("s")
        incremental = IncrementalBody(serializer)
        key = "input" if name == "openai-responses" else "messages"
        previous: bytes | None = None
        at = 0
        for boundary in boundaries:
            live.extend(events[at:boundary])
            at = boundary
            body, _digest = incremental.serialize(session_request(live), store)
            prefix = events[:boundary]
            fresh_request = build_request(fold_messages(prefix), fold_request_header(prefix) or header_for(name))
            assert body == serializer.serialize(fresh_request, store), (name, boundary)
            if previous is not None:
                close = list_close(previous, key)
                assert body[:close] == previous[:close], (name, boundary)
                assert body[close : close + 1] == b","
            previous = body
