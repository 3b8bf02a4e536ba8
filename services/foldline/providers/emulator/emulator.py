"""The :class:`Emulator`: one request in, one answer out — route, parse, account the cache, ask the script.

Every wire format is a :class:`~.wire_api.WireApi` (its route, credential header, parser, cache model, answer
and error shapes); ``Emulator.apis`` routes by path, so an endpoint is one more such object.
Nothing here reads the clock except through the injected ``clock``, and nothing is random.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.codec import canonical_json, loads
from .answer import answer
from .anthropic_messages import AnthropicMessages
from .cache import AnthropicCachePolicy, OpenAICachePolicy, PrefixCache
from .checks import RequestRejected
from .openai_chat import OpenAIChat, ReasoningChat
from .openai_responses import OpenAIResponses
from .script import Script, ToolLoopScript
from .wire_api import WireApi

__all__ = ["Emulator", "EmulatorResponse"]


@dataclass(frozen=True, slots=True)
class EmulatorResponse:
    status: int
    body: bytes
    content_type: str = "application/json"


class Emulator:
    """The provider backend: parse, answer through the script, account tokens and cache. Thread-safe.

    ``api_key``: when set, requests must carry it (``x-api-key`` / ``Authorization: Bearer``), else 401.
    ``signing_key``: the key of the MAC over thinking blocks and reasoning items (:mod:`.sealing`).
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
    ) -> None:
        self.script: Script = script if script is not None else ToolLoopScript()
        self.clock = clock
        self.anthropic_cache = anthropic_cache or AnthropicCachePolicy()
        self.openai_cache = openai_cache or OpenAICachePolicy()
        self.api_key = api_key
        self._anthropic = AnthropicMessages(self.anthropic_cache, signing_key)
        self._openai = OpenAIChat(self.openai_cache)
        self._responses = OpenAIResponses(self.openai_cache, signing_key)
        self._reasoning_chat = ReasoningChat(self.openai_cache)
        apis: tuple[WireApi[Any], ...] = (self._anthropic, self._openai, self._responses, self._reasoning_chat)
        self.apis: dict[str, WireApi[Any]] = {api.path: api for api in apis}
        self._cache = PrefixCache(clock)

    @property
    def requests(self) -> int:
        """Requests that reached the cache (parsed and valid), in every API."""
        return self._cache.requests

    # ------------------------------------------------------------------ HTTP-shaped entry point

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        """Answer one HTTP request (path without query). Never raises for a bad request."""
        lower = {k.lower(): v for k, v in headers.items()}
        api = self.apis.get(path)
        try:
            if api is None:
                routes = " or ".join(self.apis)
                raise RequestRejected(404, f"no route for {path}; POST {routes}", "not_found_error")
            if method != "POST":
                raise RequestRejected(405, f"{method} {path}: only POST is supported", "invalid_request_error")
            if self.api_key is not None and api.credential(lower) != self.api_key:
                raise RequestRejected(401, "invalid api key", "authentication_error")
            api.check_headers(lower)
            try:
                payload = loads(body)
            except ValueError as exc:
                raise RequestRejected(400, f"body is not valid JSON: {exc}") from None
            return EmulatorResponse(200, canonical_json(self._exchange(api, payload)))
        except RequestRejected as exc:
            return EmulatorResponse(exc.status, canonical_json((api or self._anthropic).error_body(exc)))

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
        prompt = api.parse(payload)
        usage = api.account(self._cache, prompt)
        said = answer(self.script, prompt)
        return api.render(prompt, said, usage, self.clock)

    def reset_caches(self) -> None:
        self._cache.clear()
