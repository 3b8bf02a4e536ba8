"""The retry layer over a real HTTP server (the emulator): what is retried, how long it waits, and that every
attempt puts the logged bytes on the wire; the adaptive limiter; keys never leak."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from foldline.errors import ContextOverflow, ProviderStatusError, ProviderTransportError, RetriesExhausted
from foldline.metrics import ProviderMetrics, new_registry
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.base import Body, Provider, ProviderResponse
from foldline.providers.emulator import Emulator, EmulatorServer, Fault, FaultPlan
from foldline.providers.limiter import AdaptiveLimiter
from foldline.providers.openai import OpenAIProvider
from foldline.providers.retry import FailedAttempt, RetryingSender, retry_decision
from foldline.providers.settings import TransportSettings

from .helpers import request, user

FAST = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.004, max_attempts=5)


class Recorder:
    """Records the waits and, at each wait, how many failed attempts had been reported before it."""

    def __init__(self) -> None:
        self.failed: list[FailedAttempt] = []
        self.waits: list[tuple[float, int]] = []

    def on_failed(self, failed: FailedAttempt) -> None:
        self.failed.append(failed)

    async def sleep(self, seconds: float) -> None:
        self.waits.append((seconds, len(self.failed)))


def _body(provider: Provider, stream: bool) -> bytes:
    req = request([user("Count to three.")], tools=None, provider=provider.name, max_tokens=64, stream=stream)
    return provider.serializer.serialize(req, None)


def _run(
    provider: Provider, body: bytes, stream: bool, recorder: Recorder, sender: RetryingSender | None = None
) -> ProviderResponse:
    sender = sender or RetryingSender(FAST, sleep=recorder.sleep, rng=random.Random(1))

    async def go() -> ProviderResponse:
        try:
            return await sender.send(provider, body, stream=stream, on_failed_attempt=recorder.on_failed)
        finally:
            await provider.aclose()

    return asyncio.run(go())


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[EmulatorServer] = []

    def start(plan: FaultPlan, **kwargs: Any) -> EmulatorServer:
        server = EmulatorServer(emulator=Emulator(faults=plan, **kwargs), record_bodies=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cls", [AnthropicProvider, OpenAIProvider])
def test_retryable_failures_are_retried_with_the_same_bytes_on_the_wire(
    serve: Any, cls: type[Any], stream: bool
) -> None:
    plan = FaultPlan(
        by_index={
            0: Fault.rate_limited(retry_after_s=0.25),
            1: Fault.overloaded(),
            2: Fault.server_error(),
            3: Fault("reset-before"),
            4: Fault("slow-first-byte", delay_s=0.05),
        }
    )
    server = serve(plan)
    provider = cls(None, None, server.url)
    body = _body(provider, stream)
    recorder = Recorder()
    response = _run(provider, body, stream, recorder)
    assert response.stop_reason == "end_turn"
    assert response.request_id == "req_emu_00000004"
    # five attempts, all the same bytes — the bytes whose digest the log records
    assert [hashlib.sha256(b).hexdigest() for _, b in server.bodies] == [hashlib.sha256(body).hexdigest()] * 5
    # each API's own words: Anthropic's error types, OpenAI's codes (else types)
    words = (
        ("rate_limit_error", "overloaded_error", "api_error")
        if cls is AnthropicProvider
        else ("rate_limit_exceeded", "server_is_overloaded", "server_error")
    )
    assert [(f.attempt, f.status, f.error_type) for f in recorder.failed] == [
        (1, 429, words[0]),
        (2, 529, words[1]),
        (3, 500, words[2]),
        (4, None, recorder.failed[3].error_type),
    ]
    assert recorder.failed[3].error_type in {"ReadError", "RemoteProtocolError"}  # closed before the status line
    assert recorder.failed[0].wait_s == 0.25  # retry-after-ms honoured exactly
    assert all(f.received_bytes == 0 for f in recorder.failed)
    assert recorder.failed[0].request_id == "req_emu_00000000"
    # each failed attempt was reported before its wait
    assert [n for _, n in recorder.waits] == [1, 2, 3, 4]
    assert [w for w, _ in recorder.waits] == [f.wait_s for f in recorder.failed]
    assert all(0.001 * 0.75 <= w <= 0.004 for w, _ in recorder.waits[1:])


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (Fault("status", 400, message="messages: at least one message is required"), ProviderStatusError),
        (Fault("status", 401), ProviderStatusError),
        (Fault("status", 403), ProviderStatusError),
        (Fault("status", 404), ProviderStatusError),
        (Fault("status", 413), ProviderStatusError),
        (
            Fault("status", 429, error_type="insufficient_quota", message="You exceeded your current quota"),
            ProviderStatusError,
        ),
        (Fault("status", 400, message="prompt is too long: 210000 tokens > 200000 maximum"), ContextOverflow),
    ],
)
def test_what_the_provider_marks_final_is_not_retried(serve: Any, fault: Fault, kind: type[Exception]) -> None:
    server = serve(FaultPlan(by_index={0: fault}))
    provider = AnthropicProvider(None, None, server.url)
    recorder = Recorder()
    with pytest.raises(kind) as caught:
        _run(provider, _body(provider, True), True, recorder)
    assert type(caught.value) is kind
    assert len(server.bodies) == 1
    assert [(f.attempt, f.status, f.wait_s) for f in recorder.failed] == [(1, fault.status, None)]
    assert recorder.waits == []


def test_a_stream_reset_after_its_first_bytes_is_sent_again_by_default(serve: Any) -> None:
    server = serve(FaultPlan(by_index={0: Fault("reset-mid")}))
    provider = AnthropicProvider(None, None, server.url)
    recorder = Recorder()
    body = _body(provider, True)
    response = _run(provider, body, True, recorder)
    assert response.stop_reason == "end_turn"
    assert [b for _, b in server.bodies] == [body, body]  # the same bytes again
    (failed,) = recorder.failed
    assert failed.received_bytes > 0  # cut in the middle of the answer
    assert failed.wait_s is not None
    assert [n for _, n in recorder.waits] == [1]  # reported before the wait


def test_a_stream_reset_after_its_first_bytes_is_not_retried_when_cut_streams_are_not(serve: Any) -> None:
    server = serve(FaultPlan(by_index={0: Fault("reset-mid")}))
    provider = AnthropicProvider(None, None, server.url)
    recorder = Recorder()
    settings = TransportSettings(initial_backoff_s=0.001, max_backoff_s=0.004, retry_cut_streams=False)
    with pytest.raises(ProviderTransportError):
        _run(provider, _body(provider, True), True, recorder, RetryingSender(settings, sleep=recorder.sleep))
    assert len(server.bodies) == 1
    (failed,) = recorder.failed
    assert failed.received_bytes > 0
    assert failed.wait_s is None


def test_an_unstreamed_answer_cut_in_the_middle_is_not_sent_again(serve: Any) -> None:
    server = serve(FaultPlan(by_index={0: Fault("reset-mid")}))
    provider = AnthropicProvider(None, None, server.url)
    recorder = Recorder()
    with pytest.raises(ProviderTransportError):
        _run(provider, _body(provider, False), False, recorder)
    assert len(server.bodies) == 1


def test_attempts_and_deadline_are_bounded(serve: Any) -> None:
    server = serve(FaultPlan(rates=[(1.0, Fault.overloaded())]))
    provider = AnthropicProvider(None, None, server.url)
    recorder = Recorder()
    with pytest.raises(RetriesExhausted) as caught:
        _run(provider, _body(provider, False), False, recorder)
    assert caught.value.attempts == FAST.max_attempts == len(server.bodies)
    assert isinstance(caught.value.__cause__, ProviderStatusError)
    assert [f.wait_s is None for f in recorder.failed] == [False] * 4 + [True]

    far = serve(FaultPlan(rates=[(1.0, Fault.rate_limited(retry_after_s=1000))]))
    provider = AnthropicProvider(None, None, far.url)
    recorder = Recorder()
    with pytest.raises(RetriesExhausted):
        _run(provider, _body(provider, False), False, recorder)
    assert len(far.bodies) == 1  # a retry-after beyond max_retry_after_s is not waited for


def test_x_should_retry_overrides_the_status() -> None:
    def answer(status: int, flag: str) -> ProviderStatusError:
        from foldline.providers.http import status_error

        return status_error("p", status, httpx.Headers({"x-should-retry": flag}), b"{}", (), None)

    assert retry_decision(answer(400, "true"))
    assert not retry_decision(answer(503, "false"))
    assert not retry_decision(ProviderTransportError("x", received_bytes=10))
    assert retry_decision(ProviderTransportError("x", received_bytes=0))


def test_the_limiter_halves_once_per_overload_and_grows_back() -> None:
    async def wave(limiter: AdaptiveLimiter, n: int) -> None:
        """``n`` requests at once, each answered at the next turn of the loop: the limit holds them back."""

        async def one() -> None:
            generation = await limiter.acquire()
            await asyncio.sleep(0)
            limiter.release(generation, "success")

        await asyncio.gather(*(one() for _ in range(n)))

    async def go() -> None:
        limiter = AdaptiveLimiter(8, 1, 1024)
        await wave(limiter, 200)
        # slow start: one more per success while used, so the limit doubles per window (8, 16, 32, 64...)
        assert limiter.slow_start
        assert limiter.limit >= 64
        limiter = AdaptiveLimiter(8, 1, 16)
        generations = [await limiter.acquire() for _ in range(8)]
        waiting = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        assert not waiting.done()
        for g in generations[:4]:  # a burst of 429s from requests started under the same limit
            limiter.release(g, "overload")
        assert limiter.limit == 4  # halved once, not four times
        assert not limiter.slow_start  # and for good
        await asyncio.sleep(0)
        assert not waiting.done()  # still four in flight
        for g in generations[4:]:
            limiter.release(g, "other")
        later = await waiting
        limiter.release(later, "overload")  # started under the new limit: halves again
        assert limiter.limit == 2
        limiter.release(await limiter.acquire(), "success")  # one of two slots in use: the limit is used
        assert limiter.limit == 2  # 2.5: one more per window now (congestion avoidance)
        for _ in range(200):  # one request at a time from here: the limit of 2 holds nothing back, so it stays
            limiter.release(await limiter.acquire(), "success")
        assert limiter.limit == 2
        await wave(limiter, 12)
        assert 3 <= limiter.limit <= 5  # roughly one more per window of successes, not one per success
        await wave(limiter, 400)
        assert limiter.limit == 16  # recovered additively, up to the maximum

    asyncio.run(go())


def test_the_sender_bounds_the_requests_in_flight_per_provider() -> None:
    peak = 0
    current = 0

    class Slow(Provider):
        name = "slow"
        serializer = AnthropicProvider(httpx.MockTransport(lambda r: httpx.Response(200))).serializer

        async def send(self, body: Body, *, stream: bool = False, progress: Any = None) -> ProviderResponse:
            nonlocal peak, current
            current += 1
            peak = max(peak, current)
            await asyncio.sleep(0.01)
            current -= 1
            from foldline.core import Usage

            return ProviderResponse((), Usage(), "end_turn")

    registry = new_registry(process=False)
    metrics = ProviderMetrics(registry)
    sender = RetryingSender(TransportSettings(concurrency_initial=5, concurrency_max=5), observer=metrics)

    async def go() -> None:
        await asyncio.gather(*(sender.send(Slow(), b"{}") for _ in range(40)))

    asyncio.run(go())
    assert peak == 5
    text = generate_latest(registry).decode()
    assert 'foldline_provider_concurrency_limit{provider="slow"} 5.0' in text
    assert 'foldline_provider_requests_in_flight{provider="slow"} 0.0' in text


# ---------------------------------------------------------------------------- keys never leak

KEY = "sk-ant-api03-SECRETsecret0123456789abcdefXYZ"


class EchoHandler(BaseHTTPRequestHandler):
    """Answers 429 then 401, echoing every request header in the body and the key in a response header,
    and a partial key the way providers mask one."""

    protocol_version = "HTTP/1.1"
    calls = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).calls += 1
        status = 429 if type(self).calls == 1 else 401
        key = self.headers.get("x-api-key", "")
        message = f"Incorrect API key provided: {key[:10]}****{key[-4:]} (headers: {dict(self.headers.items())})"
        body = json.dumps({"error": {"message": message, "type": "authentication_error"}, "type": "error"}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("request-id", f"req-{key}")
        self.send_header("retry-after-ms", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_keys_never_reach_errors_retry_records_or_metrics() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        registry = new_registry(process=False)
        sender = RetryingSender(FAST, observer=ProviderMetrics(registry))
        provider = AnthropicProvider(None, KEY, f"http://127.0.0.1:{httpd.server_address[1]}")
        recorder = Recorder()
        with pytest.raises(ProviderStatusError) as caught:
            _run(provider, _body(provider, True), True, recorder, sender)
    finally:
        httpd.shutdown()
        httpd.server_close()
    seen = " ".join(
        [
            str(caught.value),
            repr(caught.value.__dict__),
            repr(recorder.failed),
            repr(provider),
            generate_latest(registry).decode(),
        ]
    )
    assert len(recorder.failed) == 2
    for piece in (KEY, KEY[:10], KEY[-4:], KEY[10:20]):
        assert piece not in seen, piece
    assert "[redacted]" in str(caught.value)


def test_faults_parse_from_their_short_form_and_rates_are_deterministic() -> None:
    assert Fault.parse("429:2.5") == Fault("status", 429, 2.5)
    assert Fault.parse("529") == Fault.overloaded()
    assert Fault.parse("reset-mid") == Fault("reset-mid")
    assert Fault.parse("slow:1.5") == Fault("slow-first-byte", delay_s=1.5)
    for bad in ("teapot", "reset-before:1", "slow:x", "200"):
        with pytest.raises(ValueError, match="fault"):
            Fault.parse(bad)
    plan = FaultPlan(rates=[(0.05, Fault.rate_limited(0.05)), (0.01, Fault.overloaded())], seed=3)
    picks = [plan.fault_for(i) for i in range(20_000)]
    assert picks == [FaultPlan(rates=plan.rates, seed=3).fault_for(i) for i in range(20_000)]
    limited = sum(p is not None and p.status == 429 for p in picks) / len(picks)
    overloaded = sum(p is not None and p.status == 529 for p in picks) / len(picks)
    assert 0.045 < limited < 0.055
    assert 0.007 < overloaded < 0.013
    assert FaultPlan(by_index={7: Fault("reset-before")}, rates=plan.rates).fault_for(7) == Fault("reset-before")


def test_the_provider_limit_starts_at_its_ceiling_unless_told_otherwise() -> None:
    """A fleet's sessions do not wait for a slow start: by default the limit starts at ``concurrency_max`` and
    only a provider's overload answers bring it down (docs/TRANSPORT.md)."""
    assert TransportSettings().initial_limit == TransportSettings().concurrency_max == 1024
    assert RetryingSender(TransportSettings()).limiter("anthropic").limit == 1024
    assert RetryingSender(TransportSettings(concurrency_max=200)).limiter("anthropic").limit == 200
    assert RetryingSender(TransportSettings(concurrency_initial=64)).limiter("anthropic").limit == 64
    with pytest.raises(ValueError, match="concurrency_min <= concurrency_initial"):
        TransportSettings(concurrency_initial=2000)
