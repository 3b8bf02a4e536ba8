"""Streamed answers equal unstreamed ones, in any chunking; every bad stream is a typed error."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.core import TextBlock
from foldline.core.codec import canonical_json
from foldline.errors import AnswerTooLarge, ProviderStreamError
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.anthropic import parse_response as parse_anthropic
from foldline.providers.base import Provider, ProviderResponse
from foldline.providers.emulator.streaming import anthropic_stream, openai_chat_stream
from foldline.providers.openai import OpenAIProvider
from foldline.providers.openai import parse_response as parse_openai
from foldline.providers.settings import TransportSettings
from foldline.providers.sse import SSEDecoder, encode_sse
from foldline.providers.streaming import AnswerProgress, AnthropicMessagesStream, OpenAIChatStream, StreamAssembler

text_st = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
arguments_st = st.dictionaries(
    st.text(max_size=6), st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=10), st.booleans()), max_size=3
)
calls_st = st.lists(st.tuples(st.sampled_from(["read", "list_dir", "now"]), arguments_st), max_size=3)
usage_st = st.tuples(*(st.integers(min_value=0, max_value=10**6) for _ in range(4)))


def anthropic_answer(
    text: str, calls: list[tuple[str, dict[str, Any]]], usage: tuple[int, ...], thinking: str
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if thinking:
        content.append({"signature": "sig-" + str(len(thinking)), "thinking": thinking, "type": "thinking"})
    if text:
        content.append({"text": text, "type": "text"})
    content += [
        {"caller": {"type": "direct"}, "id": f"toolu_{i}", "input": args, "name": name, "type": "tool_use"}
        for i, (name, args) in enumerate(calls)
    ]
    return {
        "content": content,
        "id": "msg_1",
        "model": "m",
        "role": "assistant",
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "type": "message",
        "usage": {  # the live answers' full usage (cache writes by TTL, tier, region)
            "cache_creation": {
                "ephemeral_1h_input_tokens": usage[0] // 3,
                "ephemeral_5m_input_tokens": usage[0] - usage[0] // 3,
            },
            "cache_creation_input_tokens": usage[0],
            "cache_read_input_tokens": usage[1],
            "inference_geo": "not_available",
            "input_tokens": usage[2],
            "output_tokens": usage[3],
            "service_tier": "standard",
        },
    }


def openai_answer(
    text: str, calls: list[tuple[str, dict[str, Any]]], usage: tuple[int, ...], refusal: bool
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "content": None if refusal else (text or None),
        "refusal": text if refusal and text else None,
        "role": "assistant",
    }
    if calls:
        message["tool_calls"] = [
            {"function": {"arguments": canonical_json(a).decode(), "name": n}, "id": f"call_{i}", "type": "function"}
            for i, (n, a) in enumerate(calls)
        ]
    prompt = usage[0] + usage[1]
    return {
        "choices": [
            {"finish_reason": "tool_calls" if calls else "stop", "index": 0, "logprobs": None, "message": message}
        ],
        "created": 1,
        "id": "chatcmpl-1",
        "model": "m",
        "object": "chat.completion",
        "service_tier": "default",
        "system_fingerprint": "fp_1",
        "usage": {  # the live answers' full usage (reasoning, cached and written tokens)
            "completion_tokens": usage[3],
            "completion_tokens_details": {
                "accepted_prediction_tokens": 0,
                "audio_tokens": 0,
                "reasoning_tokens": usage[3] // 2,
                "rejected_prediction_tokens": 0,
            },
            "prompt_tokens": prompt + usage[0],
            "prompt_tokens_details": {"audio_tokens": 0, "cache_write_tokens": usage[0], "cached_tokens": usage[1]},
            "total_tokens": prompt + usage[0] + usage[3],
        },
    }


def assemble(assembler: StreamAssembler, stream: bytes, cuts: list[int]) -> dict[str, Any]:
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = SSEDecoder()
    for a, b in zip([0, *points], [*points, len(stream)], strict=True):
        for event in decoder.feed(stream[a:b]):
            assembler.feed(event)
    for event in decoder.close():
        assembler.feed(event)
    assert assembler.complete
    return assembler.payload()


cuts_st = st.lists(st.integers(min_value=0, max_value=20_000), max_size=20)


@settings(max_examples=150, deadline=None)
@given(text=text_st, calls=calls_st, usage=usage_st, thinking=text_st, piece=st.integers(1, 40), cuts=cuts_st)
def test_an_anthropic_stream_in_any_chunking_assembles_to_the_unstreamed_answer(
    text: str,
    calls: list[tuple[str, dict[str, Any]]],
    usage: tuple[int, ...],
    thinking: str,
    piece: int,
    cuts: list[int],
) -> None:
    answer = anthropic_answer(text, calls, usage, thinking)
    stream = b"".join(anthropic_stream(answer, piece))
    payload = assemble(AnthropicMessagesStream(), stream, cuts)
    assert payload == answer
    assert parse_anthropic(payload) == parse_anthropic(answer)


@settings(max_examples=150, deadline=None)
@given(text=text_st, calls=calls_st, usage=usage_st, refusal=st.booleans(), piece=st.integers(1, 40), cuts=cuts_st)
def test_an_openai_stream_in_any_chunking_assembles_to_the_unstreamed_answer(
    text: str,
    calls: list[tuple[str, dict[str, Any]]],
    usage: tuple[int, ...],
    refusal: bool,
    piece: int,
    cuts: list[int],
) -> None:
    answer = openai_answer(text, calls, usage, refusal)
    stream = b"".join(openai_chat_stream(answer, include_usage=True, piece_chars=piece))
    payload = assemble(OpenAIChatStream(), stream, cuts)
    assert payload == answer
    assert parse_openai(payload) == parse_openai(answer)


# ---------------------------------------------------------------------------- bad streams through the adapters

ANSWER = anthropic_answer("Hello there, streaming.", [("read", {"path": "a"})], (1, 2, 3, 4), "")
GOOD_ANTHROPIC = anthropic_stream(ANSWER, 5)
GOOD_OPENAI = openai_chat_stream(
    openai_answer("Hello there.", [], (5, 1, 0, 2), False), include_usage=True, piece_chars=5
)


def _send(provider: Provider, progress: AnswerProgress | None = None) -> ProviderResponse:
    async def go() -> ProviderResponse:
        try:
            return await provider.send(b"{}", stream=True, progress=progress)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def _serving(stream: bytes, content_type: str = "text/event-stream") -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda _: httpx.Response(200, headers={"content-type": content_type, "request-id": "req_9"}, content=stream)
    )


def test_a_good_stream_through_the_adapters_carries_the_ids() -> None:
    got = _send(AnthropicProvider(_serving(b"".join(GOOD_ANTHROPIC)), None, "http://x"))
    parsed = parse_anthropic(ANSWER)
    assert got == ProviderResponse(parsed.content, parsed.usage, parsed.stop_reason, "req_9", "msg_1")
    openai = _send(OpenAIProvider(_serving(b"".join(GOOD_OPENAI)), None, "http://x"))
    assert openai.message_id == "chatcmpl-1"
    assert openai.request_id == "req_9"


BAD_ANTHROPIC: dict[str, tuple[bytes, str]] = {
    "malformed-data": (
        b"".join(GOOD_ANTHROPIC[:3]) + b"event: content_block_delta\ndata: {not json\n\n",
        "malformed-stream",
    ),
    "unknown-event": (
        b"".join(GOOD_ANTHROPIC[:2]) + encode_sse("content_block_surprise", '{"type":"content_block_surprise"}'),
        "unknown-event",
    ),
    "unknown-delta": (
        b"".join(GOOD_ANTHROPIC[:3])
        + encode_sse("content_block_delta", '{"delta":{"type":"audio_delta"},"index":0,"type":"content_block_delta"}'),
        "unknown-event",
    ),
    "out-of-order": (
        encode_sse(
            "content_block_delta", '{"delta":{"text":"x","type":"text_delta"},"index":0,"type":"content_block_delta"}'
        ),
        "malformed-stream",
    ),
    "no-final-event": (b"".join(GOOD_ANTHROPIC[:-1]), "incomplete-stream"),
    "cut-inside-an-event": (b"".join(GOOD_ANTHROPIC)[:-3], "truncated-stream"),
    "error-event": (
        b"".join(GOOD_ANTHROPIC[:3])
        + encode_sse("error", '{"error":{"message":"Overloaded","type":"overloaded_error"},"type":"error"}'),
        "overloaded_error",
    ),
    "not-a-stream": (canonical_json(ANSWER), "not-a-stream"),
}


@pytest.mark.parametrize("case", sorted(BAD_ANTHROPIC))
def test_every_bad_anthropic_stream_is_a_typed_error(case: str) -> None:
    stream, kind = BAD_ANTHROPIC[case]
    content_type = "application/json" if case == "not-a-stream" else "text/event-stream"
    with pytest.raises(ProviderStreamError) as caught:
        _send(AnthropicProvider(_serving(stream, content_type), None, "http://x"))
    assert caught.value.error_type == kind
    assert caught.value.retryable is (kind == "overloaded_error")
    assert caught.value.request_id == "req_9"


BAD_OPENAI: dict[str, tuple[bytes, str]] = {
    "unknown-object": (GOOD_OPENAI[0] + encode_sse(None, '{"object":"chat.completion.surprise"}'), "unknown-event"),
    "named-event": (encode_sse("delta", "{}"), "unknown-event"),
    "no-done": (b"".join(GOOD_OPENAI[:-1]), "incomplete-stream"),
    "after-done": (b"".join(GOOD_OPENAI) + GOOD_OPENAI[0], "malformed-stream"),
    "error-chunk": (
        GOOD_OPENAI[0] + encode_sse(None, '{"error":{"message":"boom","type":"server_error"}}'),
        "server_error",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OPENAI))
def test_every_bad_openai_stream_is_a_typed_error(case: str) -> None:
    stream, kind = BAD_OPENAI[case]
    with pytest.raises(ProviderStreamError) as caught:
        _send(OpenAIProvider(_serving(stream), None, "http://x"))
    assert caught.value.error_type == kind


def test_an_answer_over_the_size_limit_is_refused_streamed_or_not() -> None:
    small = TransportSettings(max_answer_bytes=200)
    with pytest.raises(AnswerTooLarge):
        _send(AnthropicProvider(_serving(b"".join(GOOD_ANTHROPIC)), None, "http://x", settings=small))

    async def whole() -> None:
        provider = AnthropicProvider(
            _serving(canonical_json(ANSWER) * 3, "application/json"), None, "http://x", settings=small
        )
        try:
            await provider.send(b"{}")
        finally:
            await provider.aclose()

    with pytest.raises(AnswerTooLarge):
        asyncio.run(whole())


def test_progress_holds_the_text_so_far_and_leaves_an_unfinished_tool_call_out() -> None:
    progress = AnswerProgress()
    cut = b"".join(e for e in GOOD_ANTHROPIC if b"message_delta" not in e and b"message_stop" not in e)
    cut = cut[: cut.rindex(b"content_block_stop")]  # inside the tool call's input
    with pytest.raises(ProviderStreamError):
        _send(AnthropicProvider(_serving(cut + b"\n\n"), None, "http://x"), progress)
    partial = progress.partial()
    assert partial is not None
    assert partial.content == (TextBlock("Hello there, streaming."),)
    assert partial.message_id == "msg_1"
    assert partial.usage is not None
    assert partial.usage.input == 3
    assert progress.first_token_at is not None
    assert progress.received_bytes == len(cut) + 2


def responses_answer(text: str, calls: list[tuple[str, dict[str, Any]]], summary: str, refusal: bool) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if summary:
        output.append(
            {
                "encrypted_content": "c2VhbGVk",
                "id": "rs_1",
                "summary": [{"text": summary, "type": "summary_text"}],
                "type": "reasoning",
            }
        )
    if text:
        part = (
            {"refusal": text, "type": "refusal"}
            if refusal
            else {"annotations": [], "text": text, "type": "output_text"}
        )
        output.append({"content": [part], "id": "msg_1", "role": "assistant", "status": "completed", "type": "message"})
    output += [
        {
            "arguments": canonical_json(args).decode(),
            "call_id": f"call_{i}",
            "id": f"fc_{i}",
            "name": name,
            "status": "completed",
            "type": "function_call",
        }
        for i, (name, args) in enumerate(calls)
    ]
    return {
        "created_at": 1,
        "id": "resp_1",
        "incomplete_details": None,
        "model": "m",
        "object": "response",
        "output": output,
        "status": "completed",
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 4},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 1},
            "total_tokens": 13,
        },
    }


@settings(max_examples=120, deadline=None)
@given(text=text_st, calls=calls_st, summary=text_st, refusal=st.booleans(), piece=st.integers(1, 40), cuts=cuts_st)
def test_a_responses_stream_in_any_chunking_assembles_to_the_unstreamed_answer(
    text: str, calls: list[tuple[str, dict[str, Any]]], summary: str, refusal: bool, piece: int, cuts: list[int]
) -> None:
    from foldline.providers.emulator.streaming import responses_stream
    from foldline.providers.openai_responses import parse_response as parse_responses
    from foldline.providers.streaming import OpenAIResponsesStream

    answer = responses_answer(text, calls, summary, refusal)
    stream = b"".join(responses_stream(answer, piece))
    payload = assemble(OpenAIResponsesStream(), stream, cuts)
    assert payload == answer
    assert parse_responses(payload) == parse_responses(answer)


@settings(max_examples=120, deadline=None)
@given(text=text_st, thought=text_st, calls=calls_st, piece=st.integers(1, 40), cuts=cuts_st)
def test_a_reasoning_chat_stream_assembles_its_reasoning_content(
    text: str, thought: str, calls: list[tuple[str, dict[str, Any]]], piece: int, cuts: list[int]
) -> None:
    answer = openai_answer(text, calls, (5, 1, 0, 2), False)
    if thought:
        answer["choices"][0]["message"]["reasoning_content"] = thought
    stream = b"".join(openai_chat_stream(answer, include_usage=True, piece_chars=piece))
    payload = assemble(OpenAIChatStream("deepseek"), stream, cuts)
    assert payload == answer
    assert parse_openai(payload, "deepseek") == parse_openai(answer, "deepseek")
