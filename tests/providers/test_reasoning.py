"""Reasoning end to end: each serializer's documented mapping and pass-back rule, the answer parsers, the
emulator's continuation checks, and what drops and verify make of reasoning sessions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from foldline.core import (
    AssistantMessage,
    CallConfig,
    EncryptedReasoningBlock,
    Envelope,
    ReasoningBlock,
    RedactedReasoningBlock,
    RequestDispatch,
    RequestHeader,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSpec,
    Usage,
    UserMessage,
)
from foldline.core.drops import session_drops
from foldline.core.header import EpochHeader
from foldline.core.projection import Message
from foldline.errors import ProviderError
from foldline.providers.anthropic import parse_response as parse_anthropic
from foldline.providers.emulator import Emulator
from foldline.providers.emulator.sealing import redacted_data, seal_reasoning, sign_thinking
from foldline.providers.header_defaults import header_config, prompt_cache_key
from foldline.providers.openai import parse_response as parse_chat
from foldline.providers.openai_responses import parse_response as parse_responses
from foldline.providers.registry import (
    ANTHROPIC_MESSAGES_V1,
    ANTHROPIC_MESSAGES_V2,
    OPENAI_CHAT_V1,
    OPENAI_RESPONSES_V1,
    REASONING_CHAT_V1,
)

from .helpers import request, user

SIGNED = ReasoningBlock("plan: call list_dir", "c2ln")
UNSIGNED = ReasoningBlock("plain thought")
REDACTED = RedactedReasoningBlock("cmVk")
ITEM = EncryptedReasoningBlock("rs_1", ("first", "second"), "ZW5j")
TURN = (SIGNED, REDACTED, ITEM, UNSIGNED, TextBlock("Looking."), ToolCallBlock("c1", "list_dir", '{"path":"."}'))


def loop(**config: Any) -> list[Message]:
    return [
        user("list it"),
        Message("assistant", TURN),
        Message("tool", (ToolResultBlock("c1", (TextBlock("a.py"),)),)),
    ]


def body(serializer: Any, messages: list[Message] | None = None, **config: Any) -> dict[str, Any]:
    config.setdefault("max_tokens", 1000)
    return dict(json.loads(serializer.serialize(request(messages or loop(), **config), None)))


# ---------------------------------------------------------------------------- anthropic-messages v2


def test_v2_passes_back_signed_and_redacted_thinking_in_place_and_leaves_out_what_it_cannot_send() -> None:
    assistant = body(ANTHROPIC_MESSAGES_V2)["messages"][1]["content"]
    assert assistant == [
        {"signature": "c2ln", "thinking": "plan: call list_dir", "type": "thinking"},
        {"data": "cmVk", "type": "redacted_thinking"},
        {"text": "Looking.", "type": "text"},
        {"id": "c1", "input": {"path": "."}, "name": "list_dir", "type": "tool_use"},
    ]
    assert [b["type"] for b in body(ANTHROPIC_MESSAGES_V1)["messages"][1]["content"]] == ["text", "tool_use"]


@pytest.mark.parametrize(
    ("config", "thinking", "output_config"),
    [
        ({}, None, None),
        ({"reasoning_effort": "off"}, {"type": "disabled"}, None),
        ({"reasoning_effort": "low"}, {"type": "adaptive"}, {"effort": "low"}),
        ({"reasoning_effort": "max"}, {"type": "adaptive"}, {"effort": "max"}),
        ({"thinking_budget": 2048}, {"budget_tokens": 2048, "type": "enabled"}, None),
        (
            {"thinking_budget": 2048, "reasoning_effort": "xhigh"},
            {"budget_tokens": 2048, "type": "enabled"},
            {"effort": "xhigh"},
        ),
    ],
)
def test_v2_thinking_and_effort_come_from_the_logged_config(
    config: dict[str, Any], thinking: Any, output_config: Any
) -> None:
    sent = body(ANTHROPIC_MESSAGES_V2, max_tokens=4096, **config)
    assert sent.get("thinking") == thinking
    assert sent.get("output_config") == output_config


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"max_tokens": None}, "needs config.maxTokens"),
        ({"reasoning_effort": "minimal"}, "no Messages API equivalent"),
        ({"cache_ttl": "24h"}, "5m or 1h"),
        ({"thinking_budget": 4096, "max_tokens": 4096}, "below maxTokens"),
        ({"thinking_budget": 2048, "reasoning_effort": "off", "max_tokens": 4096}, "drop one"),
    ],
)
def test_v2_refuses_what_the_api_cannot_take(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ProviderError, match=match):
        body(ANTHROPIC_MESSAGES_V2, **config)


def test_v2_puts_the_logged_ttl_on_every_cache_marker_and_refuses_reasoning_from_the_user() -> None:
    sent = body(ANTHROPIC_MESSAGES_V2, cache_ttl="1h")
    marker = {"ttl": "1h", "type": "ephemeral"}
    assert sent["cache_control"] == sent["system"][0]["cache_control"] == sent["tools"][-1]["cache_control"] == marker
    with pytest.raises(ProviderError, match="cannot carry a reasoning block"):
        body(ANTHROPIC_MESSAGES_V2, [Message("user", (SIGNED, TextBlock("hi")))])


@pytest.mark.parametrize("block", [SIGNED, UNSIGNED, REDACTED, ITEM], ids=lambda b: b.kind)
def test_reasoning_of_every_kind_in_a_user_message_is_refused_by_v2_and_dropped_by_v1(block: Any) -> None:
    """docs/FORMAT.md §9.2: the encrypted kind too (the table's "dropped" is for assistant messages)."""
    messages = [Message("user", (block, TextBlock("hi")))]
    with pytest.raises(ProviderError, match="cannot carry a"):
        body(ANTHROPIC_MESSAGES_V2, messages)
    assert body(ANTHROPIC_MESSAGES_V1, messages)["messages"] == [
        {"content": [{"text": "hi", "type": "text"}], "role": "user"}
    ]


def test_the_anthropic_parser_keeps_thinking_and_redacted_thinking_in_order() -> None:
    answer = {
        "content": [
            {"signature": "s1", "thinking": "t1", "type": "thinking"},
            {"data": "d", "type": "redacted_thinking"},
            {"text": "ok", "type": "text"},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    assert parse_anthropic(answer).content == (ReasoningBlock("t1", "s1"), RedactedReasoningBlock("d"), TextBlock("ok"))


# ---------------------------------------------------------------------------- openai-responses v1


def test_responses_passes_encrypted_items_back_verbatim_as_items_in_order() -> None:
    sent = body(OPENAI_RESPONSES_V1, reasoning_effort="off", prompt_cache_key="k", cache_ttl="24h")
    assert sent["input"][1:] == [
        {
            "encrypted_content": "ZW5j",
            "id": "rs_1",
            "summary": [{"text": "first", "type": "summary_text"}, {"text": "second", "type": "summary_text"}],
            "type": "reasoning",
        },
        {"content": "Looking.", "role": "assistant", "type": "message"},
        {"arguments": '{"path":"."}', "call_id": "c1", "name": "list_dir", "type": "function_call"},
        {"call_id": "c1", "output": "a.py", "type": "function_call_output"},
    ]
    assert (sent["store"], sent["include"]) == (False, ["reasoning.encrypted_content"])
    assert sent["reasoning"] == {"effort": "none"}
    assert (sent["prompt_cache_key"], sent["prompt_cache_retention"]) == ("k", "24h")
    with pytest.raises(ProviderError, match="no stop sequences"):
        body(OPENAI_RESPONSES_V1, stop=("END",))
    with pytest.raises(ProviderError, match="no Responses API retention"):
        body(OPENAI_RESPONSES_V1, cache_ttl="1h")


def test_responses_parser_keeps_items_and_counts_cache_reads_and_writes() -> None:
    answer = {
        "output": [
            {
                "encrypted_content": "e",
                "id": "rs_9",
                "summary": [{"text": "s", "type": "summary_text"}],
                "type": "reasoning",
            },
            {"id": "rs_10", "summary": [{"text": "only text", "type": "summary_text"}], "type": "reasoning"},
            {
                "content": [{"annotations": [], "text": "hi", "type": "output_text"}],
                "role": "assistant",
                "type": "message",
            },
            {"arguments": "{}", "call_id": "c", "name": "now", "type": "function_call"},
        ],
        "status": "completed",
        "usage": {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 30},
            "output_tokens": 7,
        },
    }
    parsed = parse_responses(answer)
    assert parsed.content == (
        EncryptedReasoningBlock("rs_9", ("s",), "e"),
        ReasoningBlock("only text"),
        TextBlock("hi"),
        ToolCallBlock("c", "now", "{}"),
    )
    assert parsed.usage == Usage(input=10, output=7, cache_read=60, cache_write=30)
    assert parsed.stop_reason == "tool_use"


def test_the_loop_derives_the_prompt_cache_key_from_the_session_id() -> None:
    config = CallConfig("openai", "m")
    assert header_config(OPENAI_RESPONSES_V1, "s-1", config).prompt_cache_key == prompt_cache_key("s-1")
    assert prompt_cache_key("s-1").startswith("foldline-")
    assert len(prompt_cache_key("s-1")) == 41
    assert (
        header_config(OPENAI_RESPONSES_V1, "s-1", config.with_overrides(prompt_cache_key="mine")).prompt_cache_key
        == "mine"
    )
    assert header_config(OPENAI_CHAT_V1, "s-1", config) == config


# ---------------------------------------------------------------------------- reasoning-chat v1 and chat usage


def test_reasoning_chat_passes_every_reasoning_text_back_concatenated() -> None:
    messages = loop()
    sent = body(REASONING_CHAT_V1, messages, reasoning_effort="off")
    assistant = sent["messages"][2]
    assert assistant["reasoning_content"] == "plan: call list_dirplain thought"
    assert sent["thinking"] == {"type": "disabled"}
    assert "reasoning_effort" not in sent
    assert "max_tokens" in sent
    assert "max_completion_tokens" not in sent
    assert "reasoning_content" not in body(OPENAI_CHAT_V1, messages)["messages"][2]
    assert body(OPENAI_CHAT_V1, messages, reasoning_effort="off")["reasoning_effort"] == "none"


def test_reasoning_chat_sends_no_reasoning_content_for_redacted_or_encrypted_reasoning_alone() -> None:
    """docs/FORMAT.md §9.5: only plain reasoning blocks give ``reasoning_content``; an empty one gives ``""``."""
    opaque = [user("hi"), Message("assistant", (REDACTED, ITEM, TextBlock("Hello.")))]
    sent = body(REASONING_CHAT_V1, opaque)["messages"][2]
    assert sent["role"] == "assistant"
    assert "reasoning_content" not in sent
    empty = [user("hi"), Message("assistant", (ReasoningBlock(""), TextBlock("Hello.")))]
    assert body(REASONING_CHAT_V1, empty)["messages"][2]["reasoning_content"] == ""


def test_responses_sends_no_error_flag_and_no_empty_description() -> None:
    """docs/FORMAT.md §9.4: a tool result's isError is not sent; an empty description is left out."""
    messages = [
        user("go"),
        Message("assistant", (ToolCallBlock("c1", "list_dir", "{}"),)),
        Message("tool", (ToolResultBlock("c1", (TextBlock("denied"),), is_error=True),)),
    ]
    tools = (ToolSpec("list_dir", ""), ToolSpec("read_file", "Reads a file."))
    sent = json.loads(OPENAI_RESPONSES_V1.serialize(request(messages, tools=tools, max_tokens=1000), None))
    assert sent["input"][-1] == {"call_id": "c1", "output": "denied", "type": "function_call_output"}
    assert [t.get("description") for t in sent["tools"]] == [None, "Reads a file."]


def test_chat_usage_maps_cache_writes_and_deepseek_hit_tokens() -> None:
    base = {"choices": [{"finish_reason": "stop", "message": {"content": "x", "reasoning_content": "why"}}]}
    openai = {
        **base,
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 20, "cache_write_tokens": 10},
        },
    }
    assert parse_chat(openai).usage == Usage(input=20, output=2, cache_read=20, cache_write=10)
    deepseek = {
        **base,
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 2,
            "prompt_cache_hit_tokens": 40,
            "prompt_cache_miss_tokens": 10,
        },
    }
    parsed = parse_chat(deepseek)
    assert parsed.usage == Usage(input=10, output=2, cache_read=40, cache_write=0)
    assert parsed.content == (ReasoningBlock("why"), TextBlock("x"))


# ---------------------------------------------------------------------------- the emulator's continuation checks

KEY = b"foldline-emulator-reasoning"


def _post(emulator: Emulator, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
    answer = emulator.handle("POST", path, {"anthropic-version": "2023-06-01"}, json.dumps(payload).encode())
    return answer.status, json.loads(answer.body)


def _thinking_turns(first: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "claude-thinking-emulated",
        "max_tokens": 2048,
        "tools": [{"name": "now", "input_schema": {"type": "object", "properties": {}}}],
        "messages": [
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": [first, {"type": "tool_use", "id": "t1", "name": "now", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "noon"}]},
        ],
    }


def test_the_emulator_refuses_a_continuation_that_drops_or_alters_thinking() -> None:
    emulator = Emulator()
    good = {"type": "thinking", "thinking": "I need the time.", "signature": sign_thinking(KEY, "I need the time.")}
    status, answer = _post(emulator, "/v1/messages", _thinking_turns(good))
    assert status == 200
    assert answer["content"][0]["type"] == "thinking"
    redacted = {"type": "redacted_thinking", "data": redacted_data(KEY, b"\0" * 16)}
    assert _post(emulator, "/v1/messages", _thinking_turns(redacted))[0] == 200
    altered = {**good, "thinking": "I need the date."}
    status, answer = _post(emulator, "/v1/messages", _thinking_turns(altered))
    assert (status, answer["error"]["message"]) == (
        400,
        "messages.1.content.0: Invalid `signature` in `thinking` block",
    )
    status, answer = _post(emulator, "/v1/messages", _thinking_turns({"type": "text", "text": "Checking."}))
    assert status == 400
    assert answer["error"]["message"].startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `text`."
    )
    disabled = {**_thinking_turns({"type": "text", "text": "Checking."}), "thinking": {"type": "disabled"}}
    assert _post(emulator, "/v1/messages", disabled)[0] == 200


def _responses_input(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "gpt-reasoning-emulated",
        "store": False,
        "input": [
            {"role": "user", "content": "time?", "type": "message"},
            item,
            {"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "noon"},
        ],
        "tools": [
            {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}, "strict": False}
        ],
    }


def test_the_emulator_opens_sealed_reasoning_items_and_refuses_altered_or_unsealed_ones() -> None:
    emulator = Emulator()
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": seal_reasoning(KEY, "rs_1", "why")}
    status, answer = _post(emulator, "/v1/responses", _responses_input(item))
    assert status == 200
    assert answer["output"][0]["type"] == "reasoning"
    moved = {**item, "id": "rs_2"}
    status, answer = _post(emulator, "/v1/responses", _responses_input(moved))
    assert (status, answer["error"]["message"]) == (400, "The encrypted content for item rs_2 could not be verified.")
    status, answer = _post(emulator, "/v1/responses", _responses_input({**item, "encrypted_content": None}))
    assert status == 404
    assert "Items are not persisted when `store` is set to false" in answer["error"]["message"]


def test_the_deepseek_endpoint_wants_reasoning_content_back_on_tool_call_turns() -> None:
    emulator = Emulator()
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    payload = {
        "model": "deepseek-emulated",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "now"}}],
    }
    status, answer = _post(emulator, "/chat/completions", payload)
    assert status == 400
    assert answer["error"]["message"].startswith(
        "Missing `reasoning_content` field in the assistant message at message index 1."
    )
    messages[1]["reasoning_content"] = "I need the time."
    status, answer = _post(emulator, "/chat/completions", payload)
    assert status == 200
    assert answer["choices"][0]["message"]["reasoning_content"]
    assert {"prompt_cache_hit_tokens", "prompt_cache_miss_tokens"} <= set(answer["usage"])
    assert (
        _post(emulator, "/chat/completions", {**payload, "thinking": {"type": "disabled"}, "messages": messages[:1]})[0]
        == 200
    )


# ---------------------------------------------------------------------------- drops


def _log(ttl: str | None, gap_ms: int, reasoned: bool) -> list[Envelope]:
    config = CallConfig("anthropic", "m", max_tokens=9, cache_ttl=ttl)
    answer = (SIGNED, TextBlock("a")) if reasoned else (TextBlock("a"),)
    datas: list[Any] = [
        RequestHeader(EpochHeader(config), "initial"),
        UserMessage("u0", (TextBlock("q"),)),
        RequestDispatch(0, 0, "anthropic-messages", 2, "sha256:" + "0" * 64, 1),
        AssistantMessage("a0", answer, Usage(0, 1, 0, 2000), "end_turn"),
        UserMessage("u1", (TextBlock("q2"),)),
        RequestDispatch(1, 0, "anthropic-messages", 2, "sha256:" + "1" * 64, 1),
        AssistantMessage("a1", (TextBlock("b"),), Usage(2000, 1, 0, 0), "end_turn"),
    ]
    times = [0, 0, 0, 1, 2, gap_ms, gap_ms + 1]
    return [Envelope(i, t, d) for i, (t, d) in enumerate(zip(times, datas, strict=True))]


@pytest.mark.parametrize(
    ("ttl", "gap_ms", "reasoned", "cause"),
    [
        (None, 400_000, False, "cache-ttl"),  # past the provider's 5-minute default
        ("1h", 400_000, False, "unexplained"),  # a 1-hour TTL has not expired after 400 s
        ("1h", 3_700_000, False, "cache-ttl"),
        ("1h", 400_000, True, "thinking-context"),  # a new user turn after a thinking turn
    ],
)
def test_drops_use_the_logged_ttl_and_explain_reasoning_dropped_at_a_new_user_turn(
    ttl: str | None, gap_ms: int, reasoned: bool, cause: str
) -> None:
    drops = session_drops("s", _log(ttl, gap_ms, reasoned))
    assert [d.cause for d in drops] == ["first-request", cause]
