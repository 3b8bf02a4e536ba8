"""Provider.send: exact bytes on the wire (whole or in parts), auth headers, response parsing, usage normalization,
error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from foldline.core import ReasoningBlock, TextBlock, ToolCallBlock, Usage
from foldline.core.codec import canonical_json
from foldline.errors import ConfigError, ProviderError, ProviderStatusError
from foldline.providers import AnthropicMessagesSerializer, AnthropicProvider, OpenAIProvider, ProviderResponse
from foldline.providers._openai_http import bearer_headers
from foldline.providers.anthropic import parse_response as parse_anthropic
from foldline.providers.base import Body, BodyParts, Provider
from foldline.providers.http import JsonHttpProvider
from foldline.providers.openai import parse_response as parse_openai
from foldline.providers.openai_responses import OpenAIResponsesProvider
from foldline.providers.reasoning_chat import ReasoningChatProvider

from .helpers import request, user

KEY = "sk-test-SECRET-0123456789"

ANTHROPIC_ANSWER: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a", "limit": 3}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 21,
        "cache_creation_input_tokens": 188,
        "cache_read_input_tokens": 1800,
        "output_tokens": 42,
    },
}
OPENAI_ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{ "path":"a"}'},
                    }
                ],
            },
        }
    ],
    "usage": {
        "prompt_tokens": 2006,
        "completion_tokens": 42,
        "total_tokens": 2048,
        "prompt_tokens_details": {"cached_tokens": 1920},
    },
}


def test_anthropic_answer_is_parsed_and_usage_is_taken_as_reported() -> None:
    response = parse_anthropic(ANTHROPIC_ANSWER)
    assert response == ProviderResponse(
        (
            ReasoningBlock("hmm", "x"),  # the answer's thinking block, kept with its signature
            TextBlock("Let me check."),
            ToolCallBlock("toolu_1", "read_file", '{"limit":3,"path":"a"}'),
        ),
        Usage(input=21, output=42, cache_read=1800, cache_write=188),
        "tool_use",
    )
    assert response.usage.prompt_tokens == 21 + 1800 + 188
    without_cache = {
        **ANTHROPIC_ANSWER,
        "usage": {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": None},
    }
    assert parse_anthropic(without_cache).usage == Usage(5, 1, 0, 0)


def test_openai_usage_is_normalized_because_prompt_tokens_include_cached_tokens() -> None:
    response = parse_openai(OPENAI_ANSWER)
    assert response == ProviderResponse(
        (TextBlock("Checking."), ToolCallBlock("call_1", "read_file", '{ "path":"a"}')),
        Usage(input=2006 - 1920, output=42, cache_read=1920, cache_write=0),
        "tool_use",
    )
    assert response.usage.prompt_tokens == 2006
    no_details = {**OPENAI_ANSWER, "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}
    assert parse_openai(no_details).usage == Usage(7, 2, 0, 0)
    for finish, stop in [("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal"), ("x", "other")]:
        choice = {**OPENAI_ANSWER["choices"][0], "finish_reason": finish}
        assert parse_openai({**OPENAI_ANSWER, "choices": [choice]}).stop_reason == stop


@pytest.mark.parametrize(
    "broken",
    [
        {"content": [{"type": "server_tool_use", "id": "x", "name": "web", "input": {}}]},
        {"usage": {"output_tokens": 1}},
        {"usage": {"input_tokens": -1, "output_tokens": 1}},
        {"content": "text"},
    ],
)
def test_unusable_anthropic_answers_are_provider_errors(broken: dict[str, Any]) -> None:
    with pytest.raises(ProviderError):
        parse_anthropic({**ANTHROPIC_ANSWER, **broken})


@pytest.mark.parametrize(
    "broken",
    [
        {"choices": []},
        {"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}},
        {"usage": None},
    ],
)
def test_unusable_openai_answers_are_provider_errors(broken: dict[str, Any]) -> None:
    with pytest.raises(ProviderError):
        parse_openai({**OPENAI_ANSWER, **broken})


# ---------------------------------------------------------------------------- send over a mock transport

Handler = Callable[[httpx.Request], httpx.Response]


def _send(provider: Provider, body: bytes) -> ProviderResponse:
    async def go() -> ProviderResponse:
        try:
            return await provider.send(body)
        finally:
            await provider.aclose()

    return asyncio.run(go())


def _capture(answer: dict[str, Any], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, content=canonical_json(answer))

    return httpx.MockTransport(handler)


def test_anthropic_send_posts_the_exact_bytes_with_version_and_key_headers() -> None:
    seen: list[httpx.Request] = []
    provider = AnthropicProvider(_capture(ANTHROPIC_ANSWER, seen), KEY, "https://example.test")
    body = provider.serializer.serialize(request([user("hi")], max_tokens=64), None)
    assert _send(provider, body).stop_reason == "tool_use"
    (sent,) = seen
    assert (sent.method, str(sent.url)) == ("POST", "https://example.test/v1/messages")
    assert sent.content == body
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["content-type"] == "application/json"
    assert "authorization" not in sent.headers
    assert KEY not in repr(provider)


def test_openai_send_posts_the_exact_bytes_with_a_bearer_key_and_no_key_means_no_header() -> None:
    seen: list[httpx.Request] = []
    provider = OpenAIProvider(_capture(OPENAI_ANSWER, seen), KEY, "https://example.test")
    body = provider.serializer.serialize(request([user("hi")], provider="openai"), None)
    _send(provider, body)
    _send(OpenAIProvider(_capture(OPENAI_ANSWER, seen), None, "https://example.test"), body)
    first, second = seen
    assert str(first.url) == "https://example.test/v1/chat/completions"
    assert first.content == second.content == body
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert "authorization" not in second.headers


@pytest.mark.parametrize(
    ("base_url", "url"),
    [
        ("https://example.test", "https://example.test/v1/chat/completions"),
        ("https://example.test/", "https://example.test/v1/chat/completions"),
        ("https://example.test/proxy", "https://example.test/proxy/v1/chat/completions"),
        ("http://127.0.0.1:8080/a/b/", "http://127.0.0.1:8080/a/b/v1/chat/completions"),
        # the OpenAI SDK's form: the version in the base URL, never doubled (/v1/v1/...)
        ("https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"),
        ("https://gw.example.test/openai/v1", "https://gw.example.test/openai/v1/chat/completions"),
    ],
)
def test_the_path_is_posted_under_the_base_url_keeping_its_own_path(base_url: str, url: str) -> None:
    seen: list[httpx.Request] = []
    for _ in range(2):  # the URL is the same on every request
        _send(OpenAIProvider(_capture(OPENAI_ANSWER, seen), KEY, base_url), b"{}")
    assert [str(r.url) for r in seen] == [url, url]
    assert seen[0].headers["host"] == httpx.URL(url).netloc.decode()


@pytest.mark.parametrize(
    ("adapter", "base_url", "url"),
    [
        (AnthropicProvider, "https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        (AnthropicProvider, "https://api.anthropic.com/v1", "https://api.anthropic.com/v1/messages"),
        (AnthropicProvider, "https://gw.example.test/anthropic/v1/", "https://gw.example.test/anthropic/v1/messages"),
        (OpenAIResponsesProvider, "https://api.openai.com/v1", "https://api.openai.com/v1/responses"),
        (OpenAIResponsesProvider, "https://api.openai.com", "https://api.openai.com/v1/responses"),
        (ReasoningChatProvider, "https://api.deepseek.com", "https://api.deepseek.com/chat/completions"),
        (ReasoningChatProvider, "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/chat/completions"),
    ],
)
def test_every_adapter_takes_its_base_url_with_or_without_the_version(
    adapter: Callable[..., JsonHttpProvider], base_url: str, url: str
) -> None:
    """The SDKs' two conventions (OpenAI's base URL holds /v1, Anthropic's does not) both work everywhere."""
    seen: list[httpx.Request] = []
    answer = ANTHROPIC_ANSWER if adapter is AnthropicProvider else {}
    provider = adapter(_capture(answer, seen), KEY, base_url)
    with contextlib.suppress(ProviderError):  # only the URL matters here, not whether the answer parses
        _send(provider, b"{}")
    assert [str(r.url) for r in seen] == [url]


def test_an_adapter_serves_a_server_of_its_api_under_another_name() -> None:
    assert OpenAIProvider(None, KEY, "http://127.0.0.1:8000/v1", name="vllm").name == "vllm"
    assert AnthropicProvider(None, KEY, name="gateway").name == "gateway"
    assert ReasoningChatProvider(None, KEY).name == "deepseek"
    assert OpenAIProvider(None, KEY).name == "openai"
    with pytest.raises(ConfigError, match="non-empty"):
        OpenAIProvider(None, KEY, name="")


def test_the_openai_adapters_send_the_organization_and_their_own_default_serializers() -> None:
    seen: list[httpx.Request] = []
    chat = OpenAIProvider(_capture(OPENAI_ANSWER, seen), KEY, "https://example.test", organization="org-1")
    responses = OpenAIResponsesProvider(_capture(OPENAI_ANSWER, seen), KEY, organization="org-1")
    deepseek = ReasoningChatProvider(_capture(OPENAI_ANSWER, seen), KEY)
    assert (chat.serializer.name, chat.serializer.version) == ("openai-chat", 4)
    assert (responses.serializer.name, responses.serializer.version) == ("openai-responses", 4)
    assert (deepseek.serializer.name, deepseek.serializer.version) == ("reasoning-chat", 4)
    _send(chat, b"{}")
    sent = seen[0]
    assert sent.headers["openai-organization"] == "org-1"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert bearer_headers(None, None) == {}


def test_an_adapter_that_names_its_provider_but_not_its_path_is_refused() -> None:
    with pytest.raises(TypeError, match="both its provider and its path"):

        class HalfNamed(JsonHttpProvider, name="half"):
            pass


PROVIDERS: list[Callable[[httpx.AsyncBaseTransport], Provider]] = [
    lambda t: AnthropicProvider(t, KEY, "https://example.test"),
    lambda t: OpenAIProvider(t, KEY, "https://example.test"),
]


@pytest.mark.parametrize("make", PROVIDERS, ids=["anthropic", "openai"])
def test_a_non_2xx_answer_is_a_status_error_with_an_excerpt_and_never_the_key(
    make: Callable[[httpx.AsyncBaseTransport], Provider],
) -> None:
    def echo_key(req: httpx.Request) -> httpx.Response:
        leaked = req.headers.get("x-api-key") or req.headers["authorization"].removeprefix("Bearer ")
        return httpx.Response(429, text=f'{{"error": "rate limited for key {leaked}"}}' + "x" * 5000)

    with pytest.raises(ProviderStatusError) as info:
        _send(make(httpx.MockTransport(echo_key)), b"{}")
    err = info.value
    assert err.status == 429
    assert "retryable" in str(err)
    assert "rate limited for key [redacted]" in err.excerpt
    assert len(err.excerpt) <= 300
    assert KEY not in str(err)
    assert KEY not in err.excerpt


@pytest.mark.parametrize("make", PROVIDERS, ids=["anthropic", "openai"])
def test_transport_failures_and_non_json_answers_are_provider_errors_without_the_key(
    make: Callable[[httpx.AsyncBaseTransport], Provider],
) -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"connection refused (sent {req.headers})", request=req)

    with pytest.raises(ProviderError, match="failed before an answer arrived") as info:
        _send(make(httpx.MockTransport(refuse)), b"{}")
    assert KEY not in str(info.value)
    with pytest.raises(ProviderError, match="non-JSON"):
        _send(make(httpx.MockTransport(lambda r: httpx.Response(200, text="<html>oops</html>"))), b"{}")


def _chain(exc: BaseException) -> str:
    """Everything an error carries that could be printed or logged: its message, attributes and causes."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None:
        parts += [str(current), repr(current.args), repr(vars(current))]
        current = current.__cause__ or current.__context__
    return " ".join(parts)


ANSWERS_QUOTING_THE_KEY = {
    "anthropic": [
        {"id": "m", "role": "assistant", "content": [{"type": KEY}], "stop_reason": "end_turn"},
        {"id": "m", "role": "assistant", "content": [], "usage": {"input_tokens": KEY, "output_tokens": 1}},
        {"id": "m", "role": "assistant", "content": [{"type": KEY[:14] + "…"}]},
        {"id": "m", "role": "assistant", "content": [{"type": f"{KEY[:8]}****{KEY[-4:]}"}]},
    ],
    "openai": [
        {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [{"type": KEY}]}}]},
        {"choices": [{"message": {"role": "assistant", "content": "x"}}], "usage": {"prompt_tokens": KEY}},
    ],
}


@pytest.mark.parametrize("make", PROVIDERS, ids=["anthropic", "openai"])
def test_a_2xx_answer_the_parser_refuses_never_carries_the_key_whole_or_in_part(
    make: Callable[[httpx.AsyncBaseTransport], Provider],
) -> None:
    name = make(httpx.MockTransport(lambda r: httpx.Response(200))).name
    for answer in ANSWERS_QUOTING_THE_KEY[name]:
        body = canonical_json(answer)
        with pytest.raises(ProviderError) as info:
            _send(make(httpx.MockTransport(lambda r, b=body: httpx.Response(200, content=b))), b"{}")
        seen = _chain(info.value)
        for piece in (KEY, KEY[:14], KEY[-8:], KEY[8:18]):
            assert piece not in seen, (answer, seen)
        assert "[redacted]" in str(info.value), str(info.value)


@pytest.mark.parametrize("make", PROVIDERS, ids=["anthropic", "openai"])
def test_a_streamed_answer_the_assembler_refuses_never_carries_the_key(
    make: Callable[[httpx.AsyncBaseTransport], Provider],
) -> None:
    streams = [
        f"event: {KEY}\ndata: {{}}\n\n".encode(),
        f'data: {{"type": "{KEY}"}}\n\n'.encode(),
        f'event: error\ndata: {{"type": "error", "error": {{"type": "{KEY}", "message": "{KEY[:12]}"}}}}\n\n'.encode(),
    ]
    for raw in streams:
        transport = httpx.MockTransport(
            lambda r, b=raw: httpx.Response(200, content=b, headers={"content-type": "text/event-stream"})
        )
        provider = make(transport)

        async def go(p: Provider = provider) -> ProviderResponse:
            try:
                return await p.send(b"{}", stream=True)
            finally:
                await p.aclose()

        with pytest.raises(ProviderError) as info:
            asyncio.run(go())
        seen = _chain(info.value)
        for piece in (KEY, KEY[:12], KEY[-8:]):
            assert piece not in seen, (raw, seen)


def _send_each(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    provider_for: Callable[[str], Provider],
    bodies: list[Body],
) -> None:
    """Send each body through ``provider_for(url)`` to a local server whose connections ``serve`` handles;
    returns once the provider is closed and every handler has seen its connection end."""
    handlers: list[asyncio.Task[None]] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        await serve(reader, writer)

    async def go() -> None:
        server = await asyncio.start_server(tracked, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        provider = provider_for(f"http://127.0.0.1:{port}")
        try:
            for body in bodies:
                await provider.send(body)
        finally:
            await provider.aclose()  # closes the connection: each handler reads its end and closes too
            await asyncio.gather(*handlers)
            server.close()
            await server.wait_closed()

    asyncio.run(go())


def _raw_requests(provider_for: Callable[[str], Provider], bodies: list[Body]) -> list[bytes]:
    """Each body sent by a provider over HTTP/1.1 to a local socket: the request's bytes as they arrived."""
    received: list[bytes] = []
    answer = canonical_json(ANTHROPIC_ANSWER)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            received.append(head + await reader.readexactly(length))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)
            )
            writer.write(answer)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    _send_each(serve, provider_for, bodies)
    return received


def test_a_body_in_parts_is_the_same_request_on_the_wire_as_the_body_in_one_bytes() -> None:
    body = AnthropicMessagesSerializer().serialize(request([user("a long question " * 8_000)], max_tokens=64), None)
    assert len(body) > 100_000
    cuts = [0, 1, 40_000, 40_001, 99_000, len(body)]
    parts = BodyParts(tuple(body[a:b] for a, b in itertools.pairwise(cuts)))
    assert len(parts) == len(body)
    assert bytes(parts) == body
    transport = httpx.AsyncHTTPTransport(http2=False, retries=0)
    whole, parted, again = _raw_requests(lambda url: AnthropicProvider(transport, KEY, url), [body, parts, parts])
    assert whole.endswith(b"\r\n\r\n" + body)
    assert parted == whole == again  # a retry posts the same parts again
    assert b"transfer-encoding" not in whole.lower()


def _h2_requests(provider_for: Callable[[str], Provider], bodies: list[Body]) -> list[tuple[list[Any], bytes]]:
    """Each body sent by a provider over HTTP/2 (prior knowledge, no TLS) to a local socket: its headers and
    its data as they arrived; the receive window starts at h2's 64 KiB, so a long body waits for updates."""
    received: list[tuple[list[Any], bytes]] = []
    answer = canonical_json(ANTHROPIC_ANSWER)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        streams: dict[int, tuple[list[Any], bytearray]] = {}
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    streams[event.stream_id] = (list(event.headers or []), bytearray())
                elif isinstance(event, h2.events.DataReceived):
                    streams[event.stream_id][1].extend(event.data or b"")
                    conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    headers, body = streams.pop(event.stream_id)
                    received.append((headers, bytes(body)))
                    status = [(":status", "200"), ("content-type", "application/json")]
                    conn.send_headers(event.stream_id, [*status, ("content-length", str(len(answer)))])
                    conn.send_data(event.stream_id, answer, end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    _send_each(serve, provider_for, bodies)
    return received


def test_a_body_in_parts_is_the_same_request_over_http2_as_the_body_in_one_bytes() -> None:
    body = AnthropicMessagesSerializer().serialize(request([user("a long question " * 8_000)], max_tokens=64), None)
    cuts = [0, 16_384, 16_385, 90_000, len(body)]
    parts = BodyParts(tuple(body[a:b] for a, b in itertools.pairwise(cuts)))
    transport = httpx.AsyncHTTPTransport(http1=False, http2=True, retries=0)
    whole, parted = _h2_requests(lambda url: AnthropicProvider(transport, KEY, url), [body, parts])
    assert whole[1] == parted[1] == body
    assert whole[0] == parted[0]
    assert (b"content-length", str(len(body)).encode()) in whole[0]


def test_a_configured_server_under_its_own_name_gets_the_loop_requests_that_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FOLDLINE_OPENAI_COMPATIBLE=vllm=<url>/v1 and VLLM_API_KEY: a loop whose CallConfig names provider vllm
    posts to <url>/v1/chat/completions with that key, over the network, and logs what it sent."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from foldline.adapters.memory_log import MemoryEventLog
    from foldline.config import Config
    from foldline.config.factories import providers
    from foldline.core import CallConfig
    from foldline.core.events import RequestDispatch
    from foldline.loop import Agent, AgentOptions

    seen: list[tuple[str, str | None, dict[str, Any]]] = []
    answer = canonical_json(
        {
            **OPENAI_ANSWER,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
        }
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append((self.path, self.headers.get("authorization"), json.loads(body)))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        config = Config.from_env(
            {"FOLDLINE_OPENAI_COMPATIBLE": f"vllm={url}", "VLLM_API_KEY": KEY, "FOLDLINE_PROVIDER_HTTP2": "false"}
        )
        provider = providers(config)["vllm"]
        log = MemoryEventLog()
        agent = Agent("s", log, provider, AgentOptions(CallConfig("vllm", "llama-3", max_tokens=64)))
        result = asyncio.run(agent.run_turn("hello"))
        asyncio.run(provider.aclose())
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.text == "hi"
    assert [(path, auth, body["model"]) for path, auth, body in seen] == [
        ("/v1/chat/completions", f"Bearer {KEY}", "llama-3")
    ]
    dispatch = next(e.data for e in log.read("s") if isinstance(e.data, RequestDispatch))
    assert dispatch.serializer == "openai-chat"
