"""The emulator over a real socket: the HTTP adapters run unchanged with httpx's default transport."""

from __future__ import annotations

import asyncio
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
from foldline.providers.emulator import Emulator, EmulatorServer

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
