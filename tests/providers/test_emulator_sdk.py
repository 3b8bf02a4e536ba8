"""The emulator judged by the official SDKs: the ``anthropic`` and ``openai`` clients talk to it over HTTP.

Every API it emulates — Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, DeepSeek's chat (through
the openai client, as DeepSeek documents) — is driven through the SDKs' high-level helpers (``messages.create`` /
``messages.stream``, ``chat.completions.create`` / ``.stream``, ``responses.create`` / ``.stream``), unstreamed and
streamed, with plain questions, tool calls and their results, reasoning, images, errors and broken-off streams.
The helpers' own round trips are part of the judgement (an answer's ``to_param()`` or message object sent back as
the SDK hands it over), and every raw answer, stream event and error body that crossed the wire is then validated
strictly against the SDK's types and the live recordings' field sets (:mod:`.sdk_judge`).
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

import anthropic
import httpx2
import openai
import orjson
import pydantic
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from foldline.providers.emulator import Emulator, EmulatorServer, Fault, FaultPlan, ToolLoopScript

from .helpers import PNG_3X2, FakeClock
from .sdk_judge import JUDGED, Recorder, judge

PNG = base64.b64encode(PNG_3X2).decode()
LONG_SYSTEM = "You answer questions about a code repository, calling its tools to look. " * 80  # > 1024 tokens

Serve = Callable[..., tuple[EmulatorServer, Recorder]]


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    """Print what was judged per API (run with ``-s`` to see it)."""
    yield
    if JUDGED:
        lines = [f"  {api}: {n}" for (api, _), n in sorted(JUDGED.items()) if _ == "answers"]
        counts = ", ".join(f"{api} {kind} {n}" for (api, kind), n in sorted(JUDGED.items()))
        sys.stderr.write(f"\nSDK-judged: {counts}\n" if lines else "")


_CLIENTS: list[httpx2.Client] = []


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[EmulatorServer] = []

    def start(faults: FaultPlan | None = None, **kwargs: Any) -> tuple[EmulatorServer, Recorder]:
        emulator = Emulator(ToolLoopScript(tool_steps=1, calls_per_step=2), clock=FakeClock(), faults=faults, **kwargs)
        server = EmulatorServer(emulator=emulator).start()
        servers.append(server)
        return server, Recorder()

    yield start
    while _CLIENTS:
        _CLIENTS.pop().close()
    for server in servers:
        server.close()


def _http(recorder: Recorder) -> httpx2.Client:
    client = httpx2.Client(transport=recorder)
    _CLIENTS.append(client)
    return client


def claude(server: EmulatorServer, recorder: Recorder) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="emulated", base_url=server.url, http_client=_http(recorder), max_retries=0)


def gpt(server: EmulatorServer, recorder: Recorder, *, deepseek: bool = False) -> openai.OpenAI:
    base = server.url if deepseek else f"{server.url}/v1"  # DeepSeek's base URL has no /v1
    return openai.OpenAI(api_key="emulated", base_url=base, http_client=_http(recorder), max_retries=0)


# ---------------------------------------------------------------------------- Anthropic Messages

CLAUDE_TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {"name": "list_dir", "description": "List a directory.", "input_schema": {"type": "object", "properties": {}}},
]


def claude_turn(client: anthropic.Anthropic, stream: bool, **params: Any) -> anthropic.types.Message:
    if stream:
        with client.messages.stream(**params) as answer:
            for _ in answer.text_stream:
                pass
            final: anthropic.types.Message = answer.get_final_message()
            return final
    created: anthropic.types.Message = client.messages.create(**params)
    return created


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_anthropic_plain_text(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    answer = claude_turn(
        claude(server, recorder),
        stream,
        model="claude-haiku-4-5",
        max_tokens=256,
        messages=[{"role": "user", "content": "Say hello."}],
    )
    assert answer.stop_reason == "end_turn"
    assert answer.content[0].type == "text"
    assert answer.content[0].text
    assert answer.usage.service_tier == "standard"
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_anthropic_tools_results_and_the_one_hour_cache(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    client = claude(server, recorder)
    params: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "system": [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "tools": CLAUDE_TOOLS,
    }
    messages: list[Any] = [{"role": "user", "content": "What is in src/?"}]
    first = claude_turn(client, stream, messages=messages, **params)
    calls = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use"
    assert len(calls) == 2
    assert first.usage.cache_creation is not None
    written = first.usage.cache_creation_input_tokens
    assert written is not None
    assert first.usage.cache_creation.ephemeral_1h_input_tokens == written > 1024
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == 0
    messages += [
        first.to_param(),  # the SDK's own round trip: the answer as it hands it over, ``caller`` included
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": c.id, "content": f"{c.name} ok"} for c in calls],
        },
    ]
    second = claude_turn(client, stream, messages=messages, **params)
    assert second.stop_reason == "end_turn"
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
@pytest.mark.parametrize(
    ("model", "thinking"),
    [
        ("claude-sonnet-4-5", {"type": "enabled", "budget_tokens": 1024}),
        ("claude-opus-4-8", {"type": "adaptive"}),
    ],
    ids=["manual", "adaptive"],
)
def test_anthropic_thinking_is_signed_and_taken_back(serve: Serve, stream: bool, model: str, thinking: Any) -> None:
    server, recorder = serve()
    client = claude(server, recorder)
    params: dict[str, Any] = {"model": model, "max_tokens": 4096, "thinking": thinking, "tools": CLAUDE_TOOLS}
    messages: list[Any] = [{"role": "user", "content": "Look around, then answer."}]
    first = claude_turn(client, stream, messages=messages, **params)
    assert [b.type for b in first.content][:1] == ["thinking"]
    calls = [b for b in first.content if b.type == "tool_use"]
    messages += [
        first.to_param(),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "ok"} for c in calls]},
    ]
    second = claude_turn(client, stream, messages=messages, **params)  # the signed thinking block verifies
    assert second.content[0].type == "thinking"
    assert second.stop_reason == "end_turn"
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_anthropic_image(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    answer = claude_turn(
        claude(server, recorder),
        stream,
        model="claude-sonnet-4-6",
        max_tokens=256,
        messages=[{"role": "user", "content": [image, {"type": "text", "text": "What is in this image?"}]}],
    )
    assert answer.stop_reason == "end_turn"
    judge(recorder)


def test_anthropic_sampling_parameters_per_model(serve: Serve) -> None:
    """The SDK no longer declares ``temperature``; models before Opus 4.7 still take it (``extra_body``), Opus 4.7
    and later refuse it, and no model takes it with thinking on."""
    server, recorder = serve()
    client = claude(server, recorder)
    ask: dict[str, Any] = {"max_tokens": 256, "messages": [{"role": "user", "content": "Hi."}]}
    assert client.messages.create(model="claude-haiku-4-5", extra_body={"temperature": 0.2}, **ask).content
    with pytest.raises(anthropic.BadRequestError, match="`temperature` is deprecated for this model"):
        client.messages.create(model="claude-opus-4-8", extra_body={"temperature": 0.2}, **ask)
    with pytest.raises(anthropic.BadRequestError, match="may only be set to 1 when thinking is enabled"):
        client.messages.create(
            model="claude-sonnet-4-6", thinking={"type": "adaptive"}, extra_body={"temperature": 0.2}, **ask
        )
    with pytest.raises(anthropic.BadRequestError, match=r"thinking\.type\.enabled is not supported"):
        client.messages.create(model="claude-opus-4-7", thinking={"type": "enabled", "budget_tokens": 1024}, **ask)
    judge(recorder)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault.rate_limited(1.0), anthropic.RateLimitError),
        (Fault.overloaded(), anthropic.InternalServerError),
        (Fault.server_error(), anthropic.InternalServerError),
        (Fault("status", 401), anthropic.AuthenticationError),
        (Fault("status", 403), anthropic.PermissionDeniedError),
        (Fault("status", 404), anthropic.NotFoundError),
    ],
    ids=["429", "529", "500", "401", "403", "404"],
)
def test_anthropic_error_bodies(serve: Serve, fault: Fault, error: type[Exception]) -> None:
    server, recorder = serve(FaultPlan(by_index={0: fault}))
    with pytest.raises(error) as caught:
        claude(server, recorder).messages.create(
            model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": "Hi."}]
        )
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.request_id == "req_emu_00000000"
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["request_id"] == "req_emu_00000000"
    judge(recorder)


def test_anthropic_mid_stream_errors_and_cuts(serve: Serve) -> None:
    server, recorder = serve(FaultPlan(by_index={0: Fault.stream_error(), 1: Fault("reset-mid")}))
    client = claude(server, recorder)
    ask: dict[str, Any] = {
        "model": "claude-haiku-4-5",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hi."}],
    }
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        claude_turn(client, True, **ask)
    with pytest.raises(anthropic.APIConnectionError):
        claude_turn(client, True, **ask)
    assert claude_turn(client, True, **ask).stop_reason == "end_turn"
    judge(recorder)


def test_anthropic_refuses_unknown_keys_at_every_level(serve: Serve) -> None:
    """Anthropic answers 'Extra inputs are not permitted' for any key it does not know (SDK issue #857)."""
    server, recorder = serve()
    client = claude(server, recorder)
    content: Any = [{"type": "text", "text": "Hi.", "parsed": None}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0\.parsed: Extra inputs"):
        client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=[{"role": "user", "content": content}])
    judge(recorder)


# ---------------------------------------------------------------------------- OpenAI Chat Completions

GPT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object", "properties": {}}}},
]


def gpt_turn(client: openai.OpenAI, stream: bool, **params: Any) -> Any:
    if stream:
        with client.chat.completions.stream(stream_options={"include_usage": True}, **params) as answer:
            for _ in answer:
                pass
            return answer.get_final_completion()
    return client.chat.completions.create(**params)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_openai_chat_plain_text(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    answer = gpt_turn(gpt(server, recorder), stream, model="gpt-4.1", messages=[{"role": "user", "content": "Hi."}])
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens_details.reasoning_tokens == 0
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_openai_chat_tools_results_and_cached_tokens(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    client = gpt(server, recorder)
    messages: list[Any] = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "What is in src/?"}]
    first = gpt_turn(client, stream, model="gpt-4.1", messages=messages, tools=GPT_TOOLS)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert len(message.tool_calls) == 2
    assert first.usage.prompt_tokens_details.cache_write_tokens > 1024
    # the message as the SDK hands it over — from the stream helper its tool calls keep their ``index``
    messages += [message, *({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls)]
    second = gpt_turn(client, stream, model="gpt-4.1", messages=messages, tools=GPT_TOOLS)
    assert second.choices[0].finish_reason == "stop"
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens_details.cache_write_tokens
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_openai_chat_reasoning_is_counted_not_returned(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    client = gpt(server, recorder)
    answer = gpt_turn(
        client, stream, model="gpt-5", reasoning_effort="high", messages=[{"role": "user", "content": "Think."}]
    )
    reasoning = answer.usage.completion_tokens_details.reasoning_tokens
    assert 0 < reasoning < answer.usage.completion_tokens
    assert "reasoning_content" not in answer.choices[0].message.model_dump()
    none = gpt_turn(
        client, stream, model="gpt-5", reasoning_effort="none", messages=[{"role": "user", "content": "Hi"}]
    )
    assert none.usage.completion_tokens_details.reasoning_tokens == 0
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_openai_chat_image(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}", "detail": "low"}}
    answer = gpt_turn(
        gpt(server, recorder),
        stream,
        model="gpt-4.1",
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}],
    )
    assert answer.choices[0].message.content
    judge(recorder)


@pytest.mark.parametrize(
    ("fault", "error", "words"),
    [
        (Fault.rate_limited(1.0), openai.RateLimitError, ("requests", "rate_limit_exceeded")),
        (Fault("status", 503), openai.InternalServerError, ("service_unavailable_error", "server_is_overloaded")),
        (Fault.server_error(), openai.InternalServerError, ("server_error", None)),
        (Fault("status", 401), openai.AuthenticationError, ("invalid_request_error", "invalid_api_key")),
    ],
    ids=["429", "503", "500", "401"],
)
def test_openai_error_bodies(serve: Serve, fault: Fault, error: type[Exception], words: tuple[str, Any]) -> None:
    server, recorder = serve(FaultPlan(by_index={0: fault, 1: fault}))
    with pytest.raises(error) as caught:
        gpt(server, recorder).chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "Hi."}])
    assert isinstance(caught.value, openai.APIStatusError)
    assert (caught.value.type, caught.value.code) == words
    with pytest.raises(error):
        gpt(server, recorder).responses.create(model="gpt-4.1", input="Hi.")
    judge(recorder)


def test_openai_refuses_unknown_arguments_but_not_unknown_keys_inside_messages(serve: Serve) -> None:
    server, recorder = serve()
    client = gpt(server, recorder)
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: colour") as caught:
        client.chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "Hi."}], extra_body={"colour": "red"}
        )
    assert caught.value.param == "colour"
    user: Any = {"role": "user", "content": "Hi.", "parsed": None}  # ignored, as the API does for current models
    assert client.chat.completions.create(model="gpt-4.1", messages=[user]).choices[0].message.content
    judge(recorder)


def test_openai_chat_mid_stream_errors_and_cuts(serve: Serve) -> None:
    server, recorder = serve(FaultPlan(by_index={0: Fault.stream_error(), 1: Fault("reset-mid")}))
    client = gpt(server, recorder)
    ask: dict[str, Any] = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "Hi."}]}
    with pytest.raises(openai.APIError, match="The server had an error") as caught:
        gpt_turn(client, True, **ask)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "server_error"
    with pytest.raises(openai.APIConnectionError):
        gpt_turn(client, True, **ask)
    assert gpt_turn(client, True, **ask).choices[0].finish_reason == "stop"
    judge(recorder)


# ---------------------------------------------------------------------------- OpenAI Responses

RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "strict": False,
    },
    {"type": "function", "name": "list_dir", "parameters": {"type": "object", "properties": {}}, "strict": False},
]


def responses_turn(client: openai.OpenAI, stream: bool, **params: Any) -> Any:
    if stream:
        with client.responses.stream(**params) as answer:
            for _ in answer:
                pass
            return answer.get_final_response()
    return client.responses.create(**params)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_responses_plain_text(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    answer = responses_turn(gpt(server, recorder), stream, model="gpt-4.1", input="Say hello.")
    assert answer.status == "completed"
    assert answer.output_text
    assert answer.usage.output_tokens_details.reasoning_tokens == 0
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_responses_reasoning_tools_and_results(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    client = gpt(server, recorder)
    params: dict[str, Any] = {
        "model": "gpt-5",
        "instructions": LONG_SYSTEM,
        "tools": RESPONSES_TOOLS,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "medium", "summary": "auto"},
        "prompt_cache_key": "sdk-judged",
    }
    items: list[Any] = [{"role": "user", "content": "What is in src/?"}]
    first = responses_turn(client, stream, input=items, **params)
    kinds = [item.type for item in first.output]
    assert kinds[0] == "reasoning"
    assert kinds.count("function_call") == 2
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    assert first.usage.input_tokens_details.cache_write_tokens > 1024
    assert first.tools[0].name == "read_file"
    assert first.instructions == LONG_SYSTEM
    calls = [item for item in first.output if item.type == "function_call"]
    items += [*first.output, *({"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls)]
    second = responses_turn(client, stream, input=items, **params)  # the sealed reasoning item verifies
    assert second.status == "completed"
    assert second.output_text
    assert second.usage.input_tokens_details.cached_tokens > 0
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_responses_image(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    content = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
    ]
    answer = responses_turn(
        gpt(server, recorder), stream, model="gpt-4.1", input=[{"role": "user", "content": content}]
    )
    assert answer.output_text
    judge(recorder)


def test_responses_mid_stream_error_and_unknown_parameters(serve: Serve) -> None:
    server, recorder = serve(FaultPlan(by_index={0: Fault.stream_error()}))
    client = gpt(server, recorder)
    with client.responses.stream(model="gpt-4.1", input="Hi.") as answer:
        kinds = [event.type for event in answer]
    assert kinds[-1] == "error"
    call: Any = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "parsed_arguments": {}}
    with pytest.raises(openai.BadRequestError, match=r"Unknown parameter: 'input\[0\]\.parsed_arguments'") as caught:
        client.responses.create(model="gpt-4.1", input=[call])
    assert (caught.value.code, caught.value.param) == ("unknown_parameter", "input[0].parsed_arguments")
    judge(recorder)


# ---------------------------------------------------------------------------- DeepSeek (through the openai client)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_deepseek_plain_text_without_thinking(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    answer = gpt_turn(
        gpt(server, recorder, deepseek=True),
        stream,
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Hi."}],
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert answer.choices[0].message.content
    assert "reasoning_content" not in (answer.choices[0].message.model_extra or {})
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_deepseek_reasoning_tools_and_results(serve: Serve, stream: bool) -> None:
    server, recorder = serve()
    client = gpt(server, recorder, deepseek=True)
    messages: list[Any] = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "What is in src/?"}]
    first = gpt_turn(client, stream, model="deepseek-reasoner", messages=messages, tools=GPT_TOOLS)
    message = first.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content")
    assert first.usage.completion_tokens_details.reasoning_tokens > 0
    # the message as the SDK hands it over carries ``reasoning_content`` back, which DeepSeek requires here
    messages += [message, *({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in message.tool_calls)]
    second = gpt_turn(client, stream, model="deepseek-reasoner", messages=messages, tools=GPT_TOOLS)
    assert second.choices[0].finish_reason == "stop"
    assert (second.usage.model_extra or {})["prompt_cache_hit_tokens"] > 0
    judge(recorder)


@pytest.mark.parametrize("stream", [False, True], ids=["unstreamed", "streamed"])
def test_deepseek_refuses_images_and_breaks_off_with_its_errors(serve: Serve, stream: bool) -> None:
    """DeepSeek's chat takes text only: an image part is a 400 in its words (a body it sends with the type repeated
    as the code); a failure is its error in OpenAI's shape."""
    server, recorder = serve(FaultPlan(by_index={1: Fault.stream_error() if stream else Fault("status", 503)}))
    client = gpt(server, recorder, deepseek=True)
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    look: Any = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    with pytest.raises(
        openai.BadRequestError, match=r"messages\[0\]: unknown variant `image_url`, expected `text`"
    ) as caught:
        gpt_turn(client, stream, model="deepseek-chat", messages=[look])
    assert (caught.value.type, caught.value.code) == ("invalid_request_error", "invalid_request_error")
    with pytest.raises(openai.APIError, match="Server" if not stream else "server had an error"):
        gpt_turn(client, stream, model="deepseek-chat", messages=[{"role": "user", "content": "Hi."}])
    assert gpt_turn(client, stream, model="deepseek-chat", messages=[{"role": "user", "content": "Hi."}]).choices
    judge(recorder)


# ---------------------------------------------------------------------------- structured output


class _Wind(pydantic.BaseModel):
    speed: float
    bearing: int


class _Weather(pydantic.BaseModel):
    city: str
    temperature: int
    conditions: Literal["sunny", "rain", "snow"]
    wind: _Wind


def test_structured_output_through_each_sdks_parse_helper(serve: Serve) -> None:
    """The SDKs' own structured-output helpers (``messages.parse(output_format=...)``, ``chat.completions.parse``,
    ``responses.parse``) send their native field to the emulator and validate its answer into the model."""
    server, recorder = serve()
    asked: list[MessageParam] = [{"role": "user", "content": "Weather in Lyon?"}]
    parsed = claude(server, recorder).messages.parse(
        model="claude-haiku-4-5", max_tokens=512, messages=asked, output_format=_Weather
    )
    assert isinstance(parsed.parsed_output, _Weather)
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Lyon?"}]
    chat = gpt(server, recorder).chat.completions.parse(model="gpt-4.1", messages=question, response_format=_Weather)
    assert isinstance(chat.choices[0].message.parsed, _Weather)
    response = gpt(server, recorder).responses.parse(model="gpt-4.1", input="Weather in Lyon?", text_format=_Weather)
    assert isinstance(response.output_parsed, _Weather)
    deepseek = gpt(server, recorder, deepseek=True).chat.completions.create(
        model="deepseek-chat",
        messages=[
            {"role": "system", "content": "Answer in JSON with the keys city and temperature."},
            {"role": "user", "content": "Weather in Lyon?"},
        ],
        response_format={"type": "json_object"},
    )
    assert isinstance(orjson.loads(deepseek.choices[0].message.content or ""), dict)
    judge(recorder)


def test_the_emulator_refuses_malformed_structured_output_fields(serve: Serve) -> None:
    server, recorder = serve()
    asked: list[MessageParam] = [{"role": "user", "content": "Weather?"}]
    wrong: Any = {"format": {"type": "json", "schema": {"type": "object"}}}  # a type the API does not know
    with pytest.raises(anthropic.BadRequestError, match="json_schema"):
        claude(server, recorder).messages.create(
            model="claude-haiku-4-5", max_tokens=64, messages=asked, output_config=wrong
        )
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(openai.BadRequestError, match="json"):  # JSON mode without the word in the prompt
        gpt(server, recorder, deepseek=True).chat.completions.create(
            model="deepseek-chat", messages=question, response_format={"type": "json_object"}
        )
