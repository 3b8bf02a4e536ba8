"""The HTTP half shared by the adapters: post exact bytes, map failures to ProviderError, never leak keys.

Every failure becomes a :class:`~foldline.errors.ProviderError` (transport) or
:class:`~foldline.providers.base.ProviderStatusError` (non-2xx). Messages carry the status and a short
excerpt of the answer with every configured secret replaced, so an API key echoed by a proxy or an error
page cannot reach a log line. Auth headers are never formatted into any message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ..core.codec import loads
from ..errors import ProviderError, ProviderStatusError

__all__ = ["EXCERPT_CHARS", "post_json", "redact"]

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
