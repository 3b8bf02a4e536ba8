"""The HTTP half shared by the adapters: post exact bytes, map failures to ProviderError, never leak keys.

:class:`JsonHttpProvider` is that half as a :class:`~foldline.providers.base.Provider`: an adapter names its
path, its auth headers and its answer parser; sending, closing and ``repr`` are here.

Every failure becomes a :class:`~foldline.errors.ProviderError` (transport) or
:class:`~foldline.providers.base.ProviderStatusError` (non-2xx). Messages carry the status and a short
excerpt of the answer with every configured secret replaced, so an API key echoed by a proxy or an error
page cannot reach a log line. Auth headers are never formatted into any message.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx

from ..core.codec import loads
from ..errors import ProviderError, ProviderStatusError
from .base import Provider, ProviderResponse

__all__ = ["EXCERPT_CHARS", "JsonHttpProvider", "post_json", "redact"]

EXCERPT_CHARS = 300
_REDACTED = "[redacted]"


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every non-empty secret replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _REDACTED)
    return text


async def post_json(
    client: httpx.AsyncClient,
    provider: str,
    path: str,
    body: bytes,
    *,
    headers: Mapping[str, str],
    secrets: tuple[str, ...],
) -> dict[str, Any]:
    """POST ``body`` unchanged to ``path``; the decoded JSON object of a 2xx answer."""
    try:
        response = await client.post(path, content=body, headers=dict(headers))
        raw = await response.aread()
    except httpx.HTTPError as exc:
        detail = redact(f"{type(exc).__name__}: {exc}", secrets)
        raise ProviderError(f"{provider}: POST {path} failed before an answer arrived ({detail})") from exc
    if not 200 <= response.status_code < 300:
        text = raw[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
        excerpt = redact(text, secrets)[:EXCERPT_CHARS]
        raise ProviderStatusError(provider, response.status_code, excerpt)
    try:
        value = loads(raw)
    except ValueError:
        excerpt = redact(raw[:EXCERPT_CHARS].decode("utf-8", errors="replace"), secrets)
        raise ProviderError(f"{provider}: POST {path} answered non-JSON: {excerpt!r}") from None
    if not isinstance(value, dict):
        raise ProviderError(f"{provider}: POST {path} answered JSON that is not an object")
    return value


class JsonHttpProvider(Provider):
    """Posts serialized bodies to ``{base_url}{path}`` over the given httpx transport and parses the JSON answer.

    ``api_key`` goes only into the ``headers`` the subclass builds from it and never into an error message.
    Environment proxy settings are ignored (``trust_env=False``) so the transport passed in is the one used;
    give a transport configured with a proxy if one is needed.
    """

    path: ClassVar[str]

    def __init_subclass__(cls, *, name: str, path: str, **kwargs: Any) -> None:
        """An adapter's class header names its provider and the path it posts to."""
        super().__init_subclass__(**kwargs)
        cls.name = name
        cls.path = path

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        api_key: str | None,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float,
    ) -> None:
        self._api_key = api_key
        self._headers = {"content-type": "application/json", **headers}
        self._client = httpx.AsyncClient(transport=transport, base_url=base_url, timeout=timeout, trust_env=False)

    @abc.abstractmethod
    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        """The decoded answer → content, usage and stop reason; a malformed answer raises ProviderError."""

    async def send(self, body: bytes) -> ProviderResponse:
        secrets = (self._api_key,) if self._api_key else ()
        payload = await post_json(self._client, self.name, self.path, body, headers=self._headers, secrets=secrets)
        return self.parse(payload)

    async def aclose(self) -> None:
        await self._client.aclose()

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"{type(self).__name__}(base_url={str(self._client.base_url)!r}, api_key={key})"
