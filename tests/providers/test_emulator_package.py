"""The emulator package's public surface, and ``foldline emulator`` serving its wire formats over HTTP."""

from __future__ import annotations

import asyncio
import importlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from foldline.core import Usage
from foldline.providers import AnthropicProvider, OpenAIProvider

from .helpers import drive

FOLDLINE = Path(sys.executable).with_name("foldline")

PUBLIC = {
    "AnthropicCachePolicy": "cache",
    "Api": "script",
    "Conversation": "script",
    "Emulator": "emulator",
    "EmulatorResponse": "emulator",
    "EmulatorServer": "server",
    "EmulatorTransport": "transport",
    "Fault": "faults",
    "FaultPlan": "faults",
    "ImagePart": "script",
    "OpenAICachePolicy": "cache",
    "Part": "script",
    "ReasoningPart": "script",
    "Reply": "script",
    "Role": "script",
    "Script": "script",
    "ScriptedCall": "script",
    "ServerLimits": "server",
    "StopOverride": "script",
    "TextPart": "script",
    "ToolCallPart": "script",
    "ToolDef": "script",
    "ToolLoopScript": "script",
    "ToolResultPart": "script",
    "Turn": "script",
    "count_tokens": "tokens",
    "scripted_arguments": "script",
    "serve": "server",
}


def test_every_public_name_imports_from_the_package_and_is_the_object_its_module_defines() -> None:
    package = importlib.import_module("foldline.providers.emulator")
    assert sorted(package.__all__) == sorted(PUBLIC)
    for name, module in PUBLIC.items():
        home = importlib.import_module(f"foldline.providers.emulator.{module}")
        assert getattr(package, name) is getattr(home, name), name
    star: dict[str, object] = {}
    exec("from foldline.providers.emulator import *", star)
    assert set(star) - {"__builtins__"} == set(PUBLIC)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


@pytest.fixture(params=[()], ids=["plain"])
def cli_emulator(request: pytest.FixtureRequest) -> Iterator[str]:
    """``foldline emulator`` in a child process (with the options of the test's ``cli_emulator`` parameter);
    its base URL once ``/health`` answers."""
    assert FOLDLINE.exists(), f"{FOLDLINE} missing: install the package with `make` (pip install -e .)"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(FOLDLINE), "emulator", "--host", "127.0.0.1", "--port", str(port), *request.param]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2, trust_env=False).json() == {"ok": True}:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    pytest.fail(f"`foldline emulator` exited {proc.returncode} before serving")
                if time.monotonic() > deadline:
                    pytest.fail("`foldline emulator` did not answer /health within 60 s")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            assert proc.stdout is not None
            banner = proc.stdout.read()
    assert f"emulator listening on {url}" in banner


@pytest.mark.parametrize("make", [AnthropicProvider, OpenAIProvider])
def test_the_cli_serves_both_apis_over_http_with_prefix_caching(
    cli_emulator: str, make: type[AnthropicProvider | OpenAIProvider]
) -> None:
    async def go() -> list[Usage]:
        provider = make(httpx.AsyncHTTPTransport(), None, cli_emulator)
        try:
            return (await drive(provider, 3))[0]
        finally:
            await provider.aclose()

    usages = asyncio.run(go())
    assert usages[0].cache_read == 0
    assert all(u.cache_read > 0 for u in usages[1:])
    assert all(u.output > 0 for u in usages)


@pytest.mark.parametrize("cli_emulator", [("--fault-at", "0=429:2", "--fault-at", "1=529")], indirect=True)
def test_the_cli_injects_the_faults_it_is_given(cli_emulator: str) -> None:
    body = {"max_tokens": 16, "messages": [{"content": "hi", "role": "user"}], "model": "m"}
    headers = {"anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=cli_emulator, trust_env=False, timeout=10) as client:
        first = client.post("/v1/messages", json=body, headers=headers)
        second = client.post("/v1/messages", json=body, headers=headers)
        third = client.post("/v1/messages", json=body, headers=headers)
        stats = client.get("/stats").json()
    assert (first.status_code, first.headers["retry-after"], first.headers["retry-after-ms"]) == (429, "2", "2000")
    assert first.json()["error"]["type"] == "rate_limit_error"
    assert first.headers["request-id"] == "req_emu_00000000"
    assert (second.status_code, second.json()["error"]["type"]) == (529, "overloaded_error")
    assert third.status_code == 200
    assert stats == {"disconnects": 0, "faults": 2, "requests": 3}
