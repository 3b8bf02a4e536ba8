"""A streamed answer broken off by a transient ``error`` event is retried end to end over HTTP, and logged.

``foldline emulator --fault 0=error-mid`` serves each wire format in a child process; the first answer stops
halfway with the API's own error event (Anthropic ``overloaded_error``, OpenAI ``server_error`` as a chunk or a
Responses ``error`` event). foldline's transport retries it (the provider ended the answer itself and says it may
be tried again, docs/TRANSPORT.md), the log holds the failed attempt as ``llm/retry`` before the answer, and
``foldline verify`` proves every attempt's request against its digest.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.core import CallConfig
from foldline.core.events import AssistantMessage, LlmRetry, RequestDispatch
from foldline.loop import Agent, AgentOptions, Toolset
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.base import Provider
from foldline.providers.openai import OpenAIProvider
from foldline.providers.openai_responses import OpenAIResponsesProvider
from foldline.providers.reasoning_chat import ReasoningChatProvider
from foldline.providers.retry import RetryingSender
from foldline.providers.settings import TransportSettings

FOLDLINE = Path(sys.executable).with_name("foldline")
FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.002)

#: wire format → (adapter, call-config provider, model, the error type its stream breaks off with)
WIRES: dict[str, tuple[type[Any], str, str, str]] = {
    "anthropic-messages": (AnthropicProvider, "anthropic", "claude-sonnet-4-5", "overloaded_error"),
    "openai-chat": (OpenAIProvider, "openai", "gpt-4.1", "server_error"),
    "openai-responses": (OpenAIResponsesProvider, "openai", "gpt-5", "server_error"),
    "reasoning-chat": (ReasoningChatProvider, "deepseek", "deepseek-reasoner", "server_error"),
}


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


@pytest.fixture
def emulator_cli() -> Iterator[str]:
    """``foldline emulator --fault 0=error-mid`` in a child process; its base URL once it serves."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(FOLDLINE), "emulator", "--port", str(port), "--fault", "0=error-mid"]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, "`foldline emulator` exited before serving"
                assert time.monotonic() < deadline, "`foldline emulator` did not serve within 60 s"
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def tools() -> Toolset:
    toolset = Toolset()

    @toolset.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return toolset


@pytest.mark.parametrize("wire", sorted(WIRES))
def test_a_transient_mid_stream_error_is_retried_logged_and_verified(
    emulator_cli: str, tmp_path: Path, wire: str
) -> None:
    adapter, provider_name, model, error_type = WIRES[wire]
    provider: Provider = adapter(None, None, emulator_cli, settings=FAST)
    log = SqliteEventLog(tmp_path)
    options = AgentOptions(
        config=CallConfig(provider_name, model, max_tokens=2048, stream=True),
        system="You are a test agent.",
        tools=tools(),
        sender=RetryingSender(FAST, rng=random.Random(0)),
    )

    async def main() -> str:
        agent = Agent("s", log, provider, options)
        try:
            return (await agent.run_turn("Please work.")).reason
        finally:
            await provider.aclose()

    assert asyncio.run(main()) == "completed"
    events = log.read("s")
    log.close()
    (retry,) = [e for e in events if isinstance(e.data, LlmRetry)]
    failed = retry.data
    assert isinstance(failed, LlmRetry)
    assert (failed.attempt, failed.error_type, failed.status) == (1, error_type, None)
    assert failed.received_bytes > 0  # broken off in the middle of the answer
    assert failed.wait_ms is not None  # and retried
    assert retry.ignorable
    first_dispatch = next(e.seq for e in events if isinstance(e.data, RequestDispatch))
    first_answer = next(e.seq for e in events if isinstance(e.data, AssistantMessage))
    assert first_dispatch < retry.seq < first_answer  # logged before the answer the retry got
    assert {e.data.serializer for e in events if isinstance(e.data, RequestDispatch)} == {wire}
    verified = subprocess.run(
        [str(FOLDLINE), "verify", "--data-dir", str(tmp_path), "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["status"] == "verified"
    assert report["retries"] == 1
    assert report["checked"] == report["matched"] > 0
