"""The emulator over a real socket: the HTTP adapters run unchanged with httpx's default transport."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Iterator

import httpx
import pytest

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import TextBlock, Usage
from foldline.core.projection import Message
from foldline.errors import ProviderStatusError
from foldline.ports.attachments import AttachmentStore
from foldline.providers import AnthropicProvider, OpenAIProvider
from foldline.providers.base import Provider
from foldline.providers.emulator import Emulator, EmulatorServer, ServerLimits

from .helpers import FakeClock, drive, image_block, user

KEY = "emulator-key-0123456789"


@pytest.fixture
def server() -> Iterator[EmulatorServer]:
    with EmulatorServer("127.0.0.1", 0, emulator=Emulator(clock=FakeClock(), api_key=KEY)) as s:
        yield s


def run_loop(
    provider: Provider, steps: int, *, messages: list[Message], store: AttachmentStore | None = None
) -> list[Usage]:
    async def go() -> list[Usage]:
        try:
            return (await drive(provider, steps, messages=messages, store=store))[0]
        finally:
            await provider.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("make", [AnthropicProvider, OpenAIProvider])
def test_http_round_trip_with_cache_hits(
    server: EmulatorServer, make: type[AnthropicProvider | OpenAIProvider]
) -> None:
    assert server.port > 0
    store = MemoryAttachmentStore()
    first = [Message("user", (TextBlock("What is in this image?"), image_block(store)))]
    usages = run_loop(make(httpx.AsyncHTTPTransport(), KEY, server.url), 6, messages=first, store=store)
    assert usages[0].cache_read == 0
    assert all(u.cache_read > 0 for u in usages[1:])
    assert all(u.output > 0 for u in usages)


@pytest.mark.parametrize("make", [AnthropicProvider, OpenAIProvider])
def test_a_wrong_key_is_a_401_whose_message_does_not_contain_the_key(
    server: EmulatorServer, make: type[AnthropicProvider | OpenAIProvider]
) -> None:
    wrong = "wrong-key-abcdef-987654"
    with pytest.raises(ProviderStatusError) as info:
        run_loop(make(httpx.AsyncHTTPTransport(), wrong, server.url), 1, messages=[user("hi")])
    assert info.value.status == 401
    assert wrong not in str(info.value)
    assert KEY not in str(info.value)


def test_health_and_unknown_routes(server: EmulatorServer) -> None:
    with httpx.Client(base_url=server.url, trust_env=False) as client:
        assert client.get("/health").json() == {"ok": True}
        assert client.post("/v1/nothing", content=b"{}").status_code == 404
        assert client.get("/v1/messages").status_code == 405


# ---------------------------------------------------------------------------- HTTP limits (h11 framing)


def _connect(server: EmulatorServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
    return sock


def _read_all(sock: socket.socket, deadline_s: float) -> tuple[bytes, bool]:
    """What the server sends until it closes the connection or ``deadline_s`` passes; whether it closed."""
    sock.settimeout(0.2)
    received = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received, True
        if not chunk:
            return received, True
        received += chunk
    return received, False


def test_half_sent_requests_are_answered_408_and_closed_after_the_head_timeout() -> None:
    limits = ServerLimits(head_timeout_s=0.5)
    with EmulatorServer(emulator=Emulator(clock=FakeClock()), limits=limits) as server:
        socks = [_connect(server) for _ in range(300)]
        try:
            for sock in socks:
                sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: emulator\r\nContent-Le")
            started = time.monotonic()
            outcomes = [_read_all(sock, 15.0) for sock in socks]
            waited = time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
        assert all(closed for _, closed in outcomes), "every half-sent request's connection is closed"
        assert all(received.startswith(b"HTTP/1.1 408 ") for received, _ in outcomes)
        assert waited < 10.0
        with httpx.Client(base_url=server.url, trust_env=False) as client:  # the server still serves
            assert client.get("/health").json() == {"ok": True}


def test_a_slow_body_is_cut_after_the_body_timeout() -> None:
    with EmulatorServer(emulator=Emulator(clock=FakeClock()), limits=ServerLimits(body_timeout_s=0.5)) as server:
        sock = _connect(server)
        try:
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: emulator\r\nContent-Length: 100\r\n\r\n{")
            received, closed = _read_all(sock, 10.0)
        finally:
            sock.close()
    assert closed
    assert received.startswith(b"HTTP/1.1 408 ")


def test_two_different_content_lengths_are_a_400_not_a_hang(server: EmulatorServer) -> None:
    sock = _connect(server)
    try:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: emulator\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\n{}"
        )
        received, closed = _read_all(sock, 10.0)
    finally:
        sock.close()
    assert closed
    status, _, rest = received.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request"
    assert b"Content-Length" in rest.split(b"\r\n\r\n", 1)[1]  # the error names what is wrong


def test_a_100_kb_header_is_a_431(server: EmulatorServer) -> None:
    sock = _connect(server)
    try:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: emulator\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        received, closed = _read_all(sock, 10.0)
    finally:
        sock.close()
    assert closed
    assert received.startswith(b"HTTP/1.1 431 ")


def test_a_body_over_the_limit_is_a_413_before_it_is_read() -> None:
    with EmulatorServer(emulator=Emulator(clock=FakeClock()), limits=ServerLimits(max_body_bytes=1000)) as server:
        sock = _connect(server)
        try:
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: emulator\r\nContent-Length: 5000\r\n\r\n")
            received, closed = _read_all(sock, 10.0)
        finally:
            sock.close()
    assert closed
    assert received.startswith(b"HTTP/1.1 413 ")


def test_keep_alive_pipelining_and_chunked_request_bodies_work(server: EmulatorServer) -> None:
    body = json.dumps({"max_tokens": 16, "messages": [{"content": "hi", "role": "user"}], "model": "m"}).encode()
    head = b"POST /v1/messages HTTP/1.1\r\nHost: e\r\nanthropic-version: 2023-06-01\r\nx-api-key: " + KEY.encode()
    plain = head + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    chunked = head + b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    closing = b"GET /health HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n"
    sock = _connect(server)
    try:
        sock.sendall(plain + chunked + closing)  # three requests at once on one connection
        received, closed = _read_all(sock, 10.0)
    finally:
        sock.close()
    assert closed
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert received.endswith(b'{"ok":true}')
