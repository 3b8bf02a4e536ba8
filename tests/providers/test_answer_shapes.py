"""foldline's answer parsers take the live APIs' full answers: every usage field the providers send today, the
fields they add around it, and the streams that carry it — and log every count they report: cache reads and writes
(out of the input count where the API counts them in it), the 1-hour part of Anthropic's cache writes and the
reasoning part of the output."""

from __future__ import annotations

import json
from typing import Any

import pytest

from foldline.core import TextBlock, ToolCallBlock, Usage
from foldline.errors import ProviderError
from foldline.providers.anthropic import parse_response as parse_anthropic
from foldline.providers.openai import parse_response as parse_chat
from foldline.providers.openai_responses import parse_response as parse_responses
from foldline.providers.sse import SSEDecoder
from foldline.providers.streaming import AnthropicMessagesStream

#: A Messages API answer shaped like the live recordings in anthropic-sdk-python's tests (tool ``caller``, the cache
#: write split by TTL, ``service_tier``, ``inference_geo``).
MESSAGE: dict[str, Any] = {
    "model": "claude-haiku-4-5-20251001",
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Checking."},
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "get_weather",
            "input": {"city": "Paris"},
            "caller": {"type": "direct"},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 656,
        "cache_creation_input_tokens": 1500,
        "cache_read_input_tokens": 2048,
        "cache_creation": {"ephemeral_5m_input_tokens": 500, "ephemeral_1h_input_tokens": 1000},
        "output_tokens": 74,
        "service_tier": "standard",
        "inference_geo": "not_available",
    },
}


def test_a_live_shaped_anthropic_answer_parses_to_the_same_blocks_and_usage() -> None:
    parsed = parse_anthropic(MESSAGE)
    assert parsed.content == (TextBlock("Checking."), ToolCallBlock("toolu_01", "get_weather", '{"city":"Paris"}'))
    assert parsed.usage == Usage(input=656, output=74, cache_read=2048, cache_write=1500, cache_write_1h=1000)
    assert parsed.stop_reason == "tool_use"


def test_an_anthropic_answer_without_the_ttl_breakdown_logs_no_1h_part() -> None:
    usage = {k: v for k, v in MESSAGE["usage"].items() if k != "cache_creation"}
    parsed = parse_anthropic({**MESSAGE, "usage": usage})
    assert parsed.usage == Usage(input=656, output=74, cache_read=2048, cache_write=1500)
    assert parsed.usage.cache_write_1h is None


def test_a_1h_part_larger_than_the_cache_write_is_a_malformed_answer() -> None:
    creation = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 1501}
    with pytest.raises(ProviderError, match="ephemeral_1h_input_tokens 1501 exceeds cache_creation_input_tokens 1500"):
        parse_anthropic({**MESSAGE, "usage": {**MESSAGE["usage"], "cache_creation": creation}})


def test_a_live_shaped_anthropic_stream_with_full_message_delta_usage_assembles() -> None:
    """The live order (a ping after the first block's start, an empty first ``input_json_delta``) and the cumulative
    ``message_delta.usage`` of today's streams."""
    start = {**MESSAGE, "content": [], "stop_reason": None, "usage": {**MESSAGE["usage"], "output_tokens": 1}}
    delta_usage = {"input_tokens": 656, "cache_creation_input_tokens": 1500, "cache_read_input_tokens": 2048}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Checking."}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {**MESSAGE["content"][1], "input": {}}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {**delta_usage, "output_tokens": 74},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    raw = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()
    assembler = AnthropicMessagesStream()
    for event in SSEDecoder().feed(raw):
        assembler.feed(event)
    assert assembler.complete
    assert parse_anthropic(assembler.payload()) == parse_anthropic(MESSAGE)


def test_a_full_chat_completions_usage_counts_cached_and_written_tokens_out_of_the_input() -> None:
    completion: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-5",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done.", "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 3000,
            "completion_tokens": 900,
            "total_tokens": 3900,
            "prompt_tokens_details": {"cached_tokens": 2048, "audio_tokens": 0, "cache_write_tokens": 896},
            "completion_tokens_details": {
                "reasoning_tokens": 800,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_1",
    }
    parsed = parse_chat(completion)
    assert parsed.content == (TextBlock("Done."),)
    assert parsed.usage == Usage(input=56, output=900, cache_read=2048, cache_write=896, reasoning_tokens=800)
    too_many = {**completion["usage"], "completion_tokens_details": {"reasoning_tokens": 901}}
    with pytest.raises(ProviderError, match="reasoning_tokens 901 exceeds completion_tokens 900"):
        parse_chat({**completion, "usage": too_many})
    no_details = {k: v for k, v in completion["usage"].items() if k != "completion_tokens_details"}
    assert parse_chat({**completion, "usage": no_details}).usage.reasoning_tokens is None


def test_deepseek_usage_reads_its_hit_count() -> None:
    completion: dict[str, Any] = {
        "id": "b55e6172-d379-4806-b4e0-d21dd4b243b7",
        "object": "chat.completion",
        "created": 1,
        "model": "deepseek-reasoner",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi.", "reasoning_content": "Greet."},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1400,
            "completion_tokens": 30,
            "total_tokens": 1430,
            "prompt_tokens_details": {"cached_tokens": 1280},
            "prompt_cache_hit_tokens": 1280,
            "prompt_cache_miss_tokens": 120,
            "completion_tokens_details": {"reasoning_tokens": 12},
        },
        "system_fingerprint": "fp_1",
    }
    usage = Usage(input=120, output=30, cache_read=1280, cache_write=0, reasoning_tokens=12)
    assert parse_chat(completion, "deepseek").usage == usage


def test_a_full_responses_usage_counts_cached_and_written_tokens_out_of_the_input() -> None:
    """The whole response object of the live recording (openai-python's test_responses.py), with caching."""
    response: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1754925861,
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": "gpt-4o-mini-2024-07-18",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "status": "completed",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Sunny."}],
                "role": "assistant",
            }
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": 3000,
            "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 896},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 3050,
        },
        "user": None,
        "metadata": {},
    }
    parsed = parse_responses(response)
    assert parsed.content == (TextBlock("Sunny."),)
    assert parsed.usage == Usage(input=56, output=50, cache_read=2048, cache_write=896, reasoning_tokens=0)
    assert parsed.stop_reason == "end_turn"
    thinking = {**response["usage"], "output_tokens_details": {"reasoning_tokens": 40}}
    assert parse_responses({**response, "usage": thinking}).usage.reasoning_tokens == 40
