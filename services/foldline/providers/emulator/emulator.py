"""The :class:`Emulator`: one request in, one answer out — route, parse, account the cache, ask the script.

Every wire format is a :class:`~.wire_api.WireApi` (its route, credential header, parser, cache model, answer
and error shapes); ``Emulator.apis`` routes by path, so an endpoint is one more such object.
Nothing here reads the clock except through the injected ``clock``, and nothing is random.

Every request that reaches a model route gets an index (0, 1, …, over all APIs) and a request id built from
it (``req_emu_<index>``, in the API's request-id header). A :class:`~.faults.FaultPlan` may answer it with a
fault instead (:mod:`.faults`); a request whose body says ``"stream": true`` is answered as the API's event
stream (:mod:`.streaming`), the same answer it would get unstreamed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...collector import collector_paused
from ...core.codec import canonical_json
from .answer import answer
from .anthropic_messages import AnthropicMessages
from .cache import AnthropicCachePolicy, OpenAICachePolicy, PrefixCache
from .checks import RequestRejected
from .faults import Fault, FaultPlan
from .openai_chat import OpenAIChat, ReasoningChat
from .openai_responses import OpenAIResponses
from .prefix import SeenPrompts
from .prompt import Prompt
from .script import Script, ToolLoopScript
from .streaming import anthropic_stream, openai_chat_stream, responses_stream, stream_error_event
from .wire_api import WireApi

__all__ = ["Emulator", "EmulatorResponse"]

#: The request-id header of each API.
_REQUEST_ID_HEADERS = {"anthropic": "request-id"}  # the others: x-request-id


@dataclass(frozen=True, slots=True)
class EmulatorResponse:
    """An answer, and how to deliver it: ``chunks`` are the stream's events (``body`` is their bytes joined);
    ``reset_after`` cuts the connection after that many chunks (a stream) or bytes (a body) — 0 before any
    byte, status line included; ``delay_s`` holds the first byte back."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] | None = None
    reset_after: int | None = None
    delay_s: float = 0.0


class Emulator:
    """The provider backend: parse, answer through the script, account tokens and cache. Thread-safe.

    ``api_key``: when set, requests must carry it (``x-api-key`` / ``Authorization: Bearer``), else 401.
    ``signing_key``: the key of the MAC over thinking blocks and reasoning items (:mod:`.sealing`).
    ``faults``: which requests get a fault instead of their answer. ``piece_chars``: the size of the text,
    tool-input and reasoning pieces of a streamed answer; ``event_delay_s``: the pause between two of its events.
    ``latency_s``: how long a model takes to answer — every answer of a model route is held that long before
    its first byte (a ``slow-first-byte`` fault holds it for the fault's delay instead; an injected status or
    reset comes at once, as a provider's refusal does); with ``latency_spread`` ``f``, each answer takes
    between ``(1 - f)`` and ``(1 + f)`` times it, spread evenly and fixed by the request's index (a model's time
    varies with what it writes; sessions started together then drift apart as they would against a model).
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        clock: Callable[[], float] = time.time,
        anthropic_cache: AnthropicCachePolicy | None = None,
        openai_cache: OpenAICachePolicy | None = None,
        api_key: str | None = None,
        signing_key: bytes = b"foldline-emulator-reasoning",
        faults: FaultPlan | None = None,
        piece_chars: int = 16,
        event_delay_s: float = 0.0,
        latency_s: float = 0.0,
        latency_spread: float = 0.0,
    ) -> None:
        if latency_s < 0 or event_delay_s < 0:
            raise ValueError("the emulator's latency and event delay must be >= 0 seconds")
        if not 0 <= latency_spread < 1:
            raise ValueError("the emulator's latency spread must be within [0, 1)")
        self.script: Script = script if script is not None else ToolLoopScript()
        self.clock = clock
        self.anthropic_cache = anthropic_cache or AnthropicCachePolicy()
        self.openai_cache = openai_cache or OpenAICachePolicy()
        self.api_key = api_key
        self.faults = faults
        self.piece_chars = piece_chars
        self.event_delay_s = event_delay_s  # a pause between two events of a stream (a model's pace)
        self.latency_s = latency_s  # before the first byte of every model answer (a model's time)
        self.latency_spread = latency_spread
        self._index = 0
        self._faulted = 0
        self._index_lock = threading.Lock()
        self._anthropic = AnthropicMessages(self.anthropic_cache, signing_key)
        self._openai = OpenAIChat(self.openai_cache)
        self._responses = OpenAIResponses(self.openai_cache, signing_key)
        self._reasoning_chat = ReasoningChat(self.openai_cache)
        apis: tuple[WireApi[Any], ...] = (self._anthropic, self._openai, self._responses, self._reasoning_chat)
        self.apis: dict[str, WireApi[Any]] = {api.path: api for api in apis}
        self._cache = PrefixCache(clock)
        # a body that extends one seen before is parsed from where they differ (its cost: its new messages)
        self.prompts = SeenPrompts()

    @property
    def requests(self) -> int:
        """Requests that reached the cache (parsed and valid), in every API."""
        return self._cache.requests

    @property
    def received(self) -> int:
        """Requests that reached a model route (the next request's index)."""
        return self._index

    @property
    def faulted(self) -> int:
        """Requests answered with an injected fault."""
        return self._faulted

    # ------------------------------------------------------------------ HTTP-shaped entry point

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        """Answer one HTTP request (path without query). Never raises for a bad request."""
        lower = {k.lower(): v for k, v in headers.items()}
        api = self.apis.get(path)
        fault: Fault | None = None
        ids: tuple[tuple[str, str], ...] = ()
        index = -1
        if api is not None and method == "POST":
            with self._index_lock:
                index = self._index
                self._index += 1
            ids = ((_REQUEST_ID_HEADERS.get(api.name, "x-request-id"), f"req_emu_{index:08d}"),)
            fault = self.faults.fault_for(index) if self.faults is not None else None
            if fault is not None:
                with self._index_lock:
                    self._faulted += 1
        if fault is not None and fault.kind == "status":
            return self._status_fault(api or self._anthropic, fault, ids)
        if fault is not None and fault.kind == "reset-before":
            return EmulatorResponse(0, b"", headers=ids, reset_after=0)
        answered = self._answer(api, method, path, lower, body, ids)
        if fault is not None and fault.kind == "reset-mid":
            size = len(answered.chunks) if answered.chunks is not None else len(answered.body)
            return _with(answered, reset_after=max(1, size // 2))
        if fault is not None and fault.kind == "error-mid" and api is not None and answered.status == 200:
            return self._stream_error(api, fault, answered, ids)
        if fault is not None and fault.kind == "slow-first-byte":
            return _with(answered, delay_s=fault.delay_s)
        if self.latency_s and index >= 0:
            return _with(answered, delay_s=self.latency_for(index))
        return answered

    def latency_for(self, index: int) -> float:
        """How long the answer to request ``index`` is held: ``latency_s`` within its spread, by the index."""
        if not self.latency_spread:
            return self.latency_s
        even = (index * 2654435761 % 2**32) / 2**32  # Knuth's multiplicative hash: spread evenly over [0, 1)
        return self.latency_s * (1.0 - self.latency_spread + 2.0 * self.latency_spread * even)

    def _status_fault(self, api: WireApi[Any], fault: Fault, ids: tuple[tuple[str, str], ...]) -> EmulatorResponse:
        """The API's error answer for the fault's status, in its words (``error_type`` and ``message`` override
        them). Anthropic marks a transient one of its own types ``x-should-retry: true``, as its answers do."""
        rejected = api.status_error(fault.status)
        if fault.error_type is not None:
            rejected.kind = fault.error_type
            rejected.code = fault.error_type if rejected.code is not None else None
        if fault.message is not None:
            rejected.message = fault.message
        headers = list(ids)
        if fault.retry_after_s is not None:
            headers.append(("retry-after", str(math.ceil(fault.retry_after_s))))
            headers.append(("retry-after-ms", str(round(fault.retry_after_s * 1000))))
        transient = fault.status in (408, 409, 429) or fault.status >= 500
        if api.name == "anthropic" and transient and fault.error_type is None:
            headers.append(("x-should-retry", "true"))
        body = canonical_json(api.error_body(rejected, ids[0][1] if ids else None))
        return EmulatorResponse(fault.status, body, headers=tuple(headers))

    def _stream_error(
        self, api: WireApi[Any], fault: Fault, answered: EmulatorResponse, ids: tuple[tuple[str, str], ...]
    ) -> EmulatorResponse:
        """The stream cut after half its events by the API's error event; an unstreamed request gets the status
        answer of the same failure instead (529 for Anthropic's overloaded error, else 500)."""
        if answered.chunks is None:
            overloaded = (fault.error_type or "overloaded_error") == "overloaded_error" and api.name == "anthropic"
            return self._status_fault(
                api, Fault("status", 529 if overloaded else 500, error_type=fault.error_type), ids
            )
        kept = answered.chunks[: max(1, len(answered.chunks) // 2)]
        chunks = (*kept, stream_error_event(api.name, fault.error_type, len(kept)))
        return _with(answered, chunks=chunks, body=b"".join(chunks))

    def _answer(
        self,
        api: WireApi[Any] | None,
        method: str,
        path: str,
        lower: Mapping[str, str],
        body: bytes,
        ids: tuple[tuple[str, str], ...],
    ) -> EmulatorResponse:
        try:
            if api is None:
                routes = " or ".join(self.apis)
                raise RequestRejected(404, f"no route for {path}; POST {routes}", "not_found_error")
            if method != "POST":
                raise RequestRejected(405, f"{method} {path}: only POST is supported", "invalid_request_error")
            if self.api_key is not None and api.credential(lower) != self.api_key:
                raise api.status_error(401)
            api.check_headers(lower)
            try:
                decoded = self.prompts.decode(api, body)
            except ValueError as exc:
                raise RequestRejected(400, f"body is not valid JSON: {exc}") from None
            stream, include_usage = _stream_options(decoded.payload)
            if decoded.resume is None:  # parsed whole: a long conversation's objects, none of them cyclic
                with collector_paused():
                    prompt = api.parse(decoded.payload)
            else:
                prompt = api.parse(decoded.payload, decoded.resume)
            self.prompts.keep(decoded, prompt)
            answered = self._respond(api, prompt)
            if not stream:
                return EmulatorResponse(200, canonical_json(answered), headers=ids)
            if api.name == "anthropic":
                chunks = anthropic_stream(answered, self.piece_chars)
            elif api.name == "openai-responses":
                chunks = responses_stream(answered, self.piece_chars)
            else:
                chunks = openai_chat_stream(answered, include_usage, self.piece_chars)
            return EmulatorResponse(200, b"".join(chunks), "text/event-stream", ids, tuple(chunks))
        except RequestRejected as exc:
            request_id = ids[0][1] if ids else None
            return EmulatorResponse(
                exc.status, canonical_json((api or self._anthropic).error_body(exc, request_id)), headers=ids
            )

    # ------------------------------------------------------------------ the APIs (parsed JSON in, JSON out)

    def anthropic_messages(self, payload: Any) -> dict[str, Any]:
        return self._exchange(self._anthropic, payload)

    def openai_chat(self, payload: Any) -> dict[str, Any]:
        return self._exchange(self._openai, payload)

    def openai_responses(self, payload: Any) -> dict[str, Any]:
        return self._exchange(self._responses, payload)

    def reasoning_chat(self, payload: Any) -> dict[str, Any]:
        return self._exchange(self._reasoning_chat, payload)

    def _exchange(self, api: WireApi[Any], payload: Any) -> dict[str, Any]:
        return self._respond(api, api.parse(payload))

    def _respond(self, api: WireApi[Any], prompt: Prompt) -> dict[str, Any]:
        usage = api.account(self._cache, prompt)
        said = answer(self.script, prompt)
        return api.render(prompt, said, usage, self.clock)

    def reset_caches(self) -> None:
        self._cache.clear()
        self.prompts.clear()


def _with(answered: EmulatorResponse, **changes: Any) -> EmulatorResponse:
    return replace(answered, **changes)


def _stream_options(payload: Any) -> tuple[bool, bool]:
    """Whether the body asks for a stream, and (OpenAI) for the usage chunk at its end."""
    if not isinstance(payload, dict):
        return False, False
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestRejected(400, "stream: Input should be a valid boolean")
    options = payload.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise RequestRejected(400, "stream_options: only allowed when stream is true")
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise RequestRejected(400, "stream_options: expected an object with include_usage")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise RequestRejected(400, "stream_options.include_usage: Input should be a valid boolean")
    return stream, include
