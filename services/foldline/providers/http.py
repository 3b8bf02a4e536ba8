"""The HTTP half shared by the adapters: post exact bytes once, read or stream the answer, map every failure.

:class:`JsonHttpProvider` is that half as a :class:`~foldline.providers.base.Provider`: an adapter names its
path, its auth headers, its answer parser and its stream assembler; one attempt of sending, closing and
``repr`` are here (the retry layer, :mod:`foldline.providers.retry`, makes the attempts). A body in parts
(:class:`~foldline.providers.base.BodyParts`) is posted with the ``Content-Length`` httpx gives a body in one
``bytes``, its parts written one after another: the same request, without joining them first.

Every failure is typed, and says what the provider said about retrying it:

* a non-2xx answer → :class:`~foldline.errors.ProviderStatusError` with the status, the body's error type,
  the provider's request id, ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date), ``x-should-retry``
  and ``final`` (a 429 that is a quota or spend limit, not a rate limit); a context window overflow (a 400
  whose error says the prompt is too long) → :class:`~foldline.errors.ContextOverflow`;
* a connection failure → :class:`~foldline.errors.ProviderTransportError` with the answer bytes received
  before it (0: nothing had arrived, so the same bytes may be sent again);
* a stream that cannot be assembled → :class:`~foldline.errors.ProviderStreamError`; an answer over
  ``max_answer_bytes`` → :class:`~foldline.errors.AnswerTooLarge`.

Messages carry a short excerpt of the answer with every configured secret replaced — whole, and any piece of
it four characters or longer, and any ``***``-masked token (providers echo partial keys such as
``sk-…****abcd``) — so an API key echoed by a proxy or an error page cannot reach a log line, an event or a
metric. Auth headers are never formatted into any message.
"""

from __future__ import annotations

import abc
import email.utils
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Final

import httpx

from ..core.codec import loads
from ..errors import (
    AnswerTooLarge,
    ConfigError,
    ContextOverflow,
    ProviderError,
    ProviderStatusError,
    ProviderStreamError,
    ProviderTransportError,
)
from .base import Body, BodyParts, Provider, ProviderResponse
from .settings import TransportSettings
from .sse import SSEDecoder
from .streaming import AnswerProgress, StreamAssembler

__all__ = ["EXCERPT_CHARS", "JsonHttpProvider", "post_url", "redact", "scrubbed", "status_error"]

EXCERPT_CHARS = 300
_REDACTED = "[redacted]"
_MASKED_TOKEN = re.compile(r"[^\s\"',;:()\[\]{}]*\*{3,}[^\s\"',;:()\[\]{}]*")
_KEYLIKE_RUN = re.compile(r"[A-Za-z0-9_\-]{4,}")
_ERROR_TYPE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MIN_SECRET_PIECE: Final = 4

#: Body markers of a context window overflow (Anthropic: "prompt is too long"; OpenAI: the code
#: ``context_length_exceeded``, "maximum context length").
_OVERFLOW_MARKERS: Final = ("prompt is too long", "context_length_exceeded", "maximum context length", "context window")
#: Body markers of a 429 that waiting will not cure: a quota, a billing or a spend limit.
_FINAL_429_MARKERS: Final = ("insufficient_quota", "quota", "billing", "spend limit", "credit balance", "usage limit")


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every non-empty secret replaced, whole or in pieces of four characters or more, and every
    ``***``-masked token (a partially shown key) replaced."""
    live = tuple(s for s in secrets if s)
    if not live:
        return text
    for secret in live:
        text = text.replace(secret, _REDACTED)
    text = _MASKED_TOKEN.sub(_REDACTED, text)

    def piece(m: re.Match[str]) -> str:
        run = m.group()
        for secret in live:
            if run in secret:
                return _REDACTED
            # a run that holds a long enough piece of the secret (a key glued to other text)
            for size in range(min(len(run), len(secret)), _MIN_SECRET_PIECE * 2 - 1, -1):
                if any(run[i : i + size] in secret for i in range(len(run) - size + 1)):
                    return _REDACTED
        return run

    return _KEYLIKE_RUN.sub(piece, text)


def scrubbed(exc: BaseException, secrets: tuple[str, ...]) -> BaseException:
    """``exc`` with every secret redacted (:func:`redact`) from its message and from the exceptions it was
    raised from: an error quotes what it refused, and an answer may echo the key. Returns ``exc`` itself."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(redact(a, secrets) if isinstance(a, str) else a for a in current.args)
        for name in ("excerpt", "error_type"):
            value = getattr(current, name, None)
            if isinstance(value, str):
                setattr(current, name, redact(value, secrets))
        current = current.__cause__ or current.__context__
    return exc


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds to wait the answer asks for: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return max(0.0, float(email.utils.mktime_tz(parsed)) - time.time())


def _should_retry(headers: httpx.Headers) -> bool | None:
    value = (headers.get("x-should-retry") or "").strip().lower()
    return True if value == "true" else False if value == "false" else None


def _error_fields(raw: bytes) -> tuple[str | None, str]:
    """The error type (or code) and message of an error body, when it is the JSON either API sends."""
    try:
        value = loads(raw)
    except ValueError:
        return None, ""
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict):
        return None, ""
    kind = error.get("code") if isinstance(error.get("code"), str) and error.get("code") else error.get("type")
    return (kind if isinstance(kind, str) else None), str(error.get("message", ""))


async def _each(body: BodyParts) -> AsyncIterator[bytes]:
    """The parts as the request's content: the transport writes each as it comes, none joined."""
    for part in body.parts:
        yield part


def status_error(
    provider: str, status: int, headers: httpx.Headers, raw: bytes, secrets: tuple[str, ...], request_id: str | None
) -> ProviderStatusError:
    """The typed error of a non-2xx answer (credential-free)."""
    text = raw[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
    excerpt = redact(text, secrets)[:EXCERPT_CHARS]
    kind, message = _error_fields(raw)
    if kind is not None:
        kind = redact(kind, secrets)
        if not _ERROR_TYPE.match(kind):
            kind = "unrecognised"
    lowered = f"{kind or ''} {message}".lower()
    should_retry = _should_retry(headers)
    fields: dict[str, Any] = {
        "error_type": kind,
        "request_id": request_id,
        "retry_after": _retry_after(headers),
        "should_retry": should_retry,
    }
    if status in (400, 413) and any(m in lowered for m in _OVERFLOW_MARKERS):
        return ContextOverflow(provider, status, excerpt, final=True, **fields)
    final = status == 429 and should_retry is not True and any(m in lowered for m in _FINAL_429_MARKERS)
    return ProviderStatusError(provider, status, excerpt, final=final, **fields)


def post_url(base_url: httpx.URL | str, path: str) -> httpx.URL:
    """Where an adapter posts ``path`` (e.g. ``/v1/chat/completions``) under ``base_url``, its path kept.

    The official SDKs differ on the API version: OpenAI's takes it in the base URL
    (``https://api.openai.com/v1``), Anthropic's adds it to each path (``https://api.anthropic.com``). Both
    forms are accepted for every adapter: a base URL ending in ``/v1`` is not given a second one.
    ``https://host/sub`` and ``https://host/sub/v1`` both post to ``https://host/sub/v1/chat/completions``.
    """
    base = httpx.URL(base_url)
    prefix = base.raw_path.rstrip(b"/") + b"/"  # the client's base URL always ends with a slash
    wanted = path.encode("ascii")
    if prefix.endswith(b"/v1/") and wanted.startswith(b"/v1/"):
        wanted = wanted[len(b"/v1") :]
    return base.copy_with(raw_path=prefix + wanted.lstrip(b"/"))


class JsonHttpProvider(Provider):
    """Posts serialized bodies to ``{base_url}{path}`` over an httpx transport and parses the JSON answer.

    ``transport``: the httpx transport to send through (``None``: a network transport built from
    ``settings`` — pool limits, HTTP/2). Timeouts come from ``settings`` (separate connect, read, write and
    pool timeouts) unless ``timeout`` is given. ``api_key`` goes only into the ``headers`` the subclass
    builds from it and never into an error message. Environment proxy settings are ignored
    (``trust_env=False``) so the transport passed in is the one used; give a transport configured with a
    proxy if one is needed.
    """

    path: ClassVar[str]
    #: Response headers that carry the provider's request id, first found wins.
    request_id_headers: ClassVar[tuple[str, ...]] = ("request-id", "x-request-id")

    def __init_subclass__(cls, *, name: str | None = None, path: str | None = None, **kwargs: Any) -> None:
        """An adapter's class header names its provider and the path it posts to; a base that several adapters
        share (abstract) names neither."""
        super().__init_subclass__(**kwargs)
        if (name is None) != (path is None):
            raise TypeError(f"{cls.__name__}: an adapter names both its provider and its path, or neither")
        if name is not None and path is not None:
            cls.name = name
            cls.path = path

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None,
        api_key: str | None,
        base_url: str,
        *,
        headers: Mapping[str, str],
        timeout: float | httpx.Timeout | None = None,
        settings: TransportSettings | None = None,
        name: str | None = None,
    ) -> None:
        if name is not None:
            if not name:
                raise ConfigError("a provider's name must be non-empty (it is what CallConfig.provider names)")
            self.name = name  # a server of this API under another name (a gateway, vLLM, DeepSeek, ...)
        self.settings = settings if settings is not None else TransportSettings()
        self._api_key = api_key
        self._headers = {"content-type": "application/json", **headers}
        self._client = httpx.AsyncClient(
            transport=transport if transport is not None else self.settings.http_transport(),
            base_url=base_url,
            timeout=timeout if timeout is not None else self.settings.timeout(),
            trust_env=False,
        )
        self._url = post_url(self._client.base_url, self.path)

    @abc.abstractmethod
    def parse(self, payload: dict[str, Any]) -> ProviderResponse:
        """The decoded answer → content, usage and stop reason; a malformed answer raises ProviderError."""

    @abc.abstractmethod
    def assembler(self) -> StreamAssembler:
        """A fresh assembler for one streamed answer of this API."""

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,) if self._api_key else ()

    def _request_id(self, headers: httpx.Headers) -> str | None:
        for name in self.request_id_headers:
            value = headers.get(name)
            if value:
                return redact(value, self.secrets)[:200]
        return None

    async def send(
        self, body: Body, *, stream: bool = False, progress: AnswerProgress | None = None
    ) -> ProviderResponse:
        progress = progress if progress is not None else AnswerProgress()
        secrets = self.secrets
        limit = self.settings.max_answer_bytes
        content: bytes | AsyncIterator[bytes] = body if isinstance(body, bytes) else _each(body)
        headers = self._headers
        if isinstance(body, BodyParts):  # the length httpx states for bytes, so the request is the same
            headers = {**headers, "Content-Length": str(body.size)}
        try:
            async with self._client.stream("POST", self._url, content=content, headers=headers) as response:
                request_id = progress.request_id = self._request_id(response.headers)
                if not 200 <= response.status_code < 300:
                    raw = await self._read(response, None, min(limit, 64 * 1024), truncate=True)
                    raise status_error(self.name, response.status_code, response.headers, raw, secrets, request_id)
                if stream:
                    payload = await self._assemble(response, progress, limit)
                else:
                    payload = self._decode(await self._read(response, progress, limit))
        except httpx.HTTPError as exc:
            detail = redact(f"{type(exc).__name__}: {exc}", secrets)
            where = "before an answer arrived" if not progress.received_bytes else "in the middle of the answer"
            raise ProviderTransportError(
                f"{self.name}: POST {self.path} failed {where} ({detail})",
                received_bytes=progress.received_bytes,
                error_type=type(exc).__name__,
            ) from exc
        except ProviderStreamError as exc:
            exc.received_bytes = progress.received_bytes
            exc.request_id = progress.request_id
            raise scrubbed(exc, secrets) from exc.__cause__
        except ProviderError as exc:
            raise scrubbed(exc, secrets) from exc.__cause__
        try:
            parsed = self.parse(payload)
        except ProviderError as exc:  # a 2xx answer the parser refuses quotes the answer, which may echo the key
            raise scrubbed(exc, secrets) from exc.__cause__
        message_id = payload.get("id")
        return replace(parsed, request_id=request_id, message_id=message_id if isinstance(message_id, str) else None)

    async def _read(
        self, response: httpx.Response, progress: AnswerProgress | None, limit: int, *, truncate: bool = False
    ) -> bytes:
        """The body (an error body is not an answer: pass no ``progress``, so its bytes do not count)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            if progress is not None:
                progress.received(len(chunk))
            size += len(chunk)
            if size > limit:
                if truncate:
                    parts.append(chunk)
                    break
                raise AnswerTooLarge(
                    f"{self.name}: the answer is larger than max_answer_bytes ({limit}); it was not kept",
                    received_bytes=size,
                )
            parts.append(chunk)
        return b"".join(parts)

    def _decode(self, raw: bytes) -> dict[str, Any]:
        try:
            value = loads(raw)
        except ValueError:
            excerpt = redact(raw[:EXCERPT_CHARS].decode("utf-8", errors="replace"), self.secrets)
            raise ProviderError(f"{self.name}: POST {self.path} answered non-JSON: {excerpt!r}") from None
        if not isinstance(value, dict):
            raise ProviderError(f"{self.name}: POST {self.path} answered JSON that is not an object")
        return value

    async def _assemble(self, response: httpx.Response, progress: AnswerProgress, limit: int) -> dict[str, Any]:
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raw = await self._read(response, None, min(limit, 64 * 1024), truncate=True)
            excerpt = redact(raw[:EXCERPT_CHARS].decode("utf-8", errors="replace"), self.secrets)
            raise ProviderStreamError(
                f"{self.name}: a streamed request was answered with {content_type or 'no content type'!r}, "
                f"not text/event-stream: {excerpt!r}",
                error_type="not-a-stream",
            )
        assembler = self.assembler()
        progress.stream(assembler)
        decoder = SSEDecoder()
        async for chunk in response.aiter_bytes():
            progress.received(len(chunk))
            if progress.received_bytes > limit:
                raise AnswerTooLarge(
                    f"{self.name}: the streamed answer grew past max_answer_bytes ({limit}); it was not kept",
                    received_bytes=progress.received_bytes,
                )
            events = decoder.feed(chunk)
            if events:
                if progress.on_events is not None:
                    logged = progress.on_events(progress.attempt, events)
                    if logged is not None:
                        await logged  # e.g. appended to the log before the next read
                for event in events:
                    if assembler.feed(event):
                        progress.token()
        tail = decoder.close()
        for event in tail:
            assembler.feed(event)
        if not assembler.complete:
            raise ProviderStreamError(
                f"{self.name}: the stream ended before its final event; the answer is incomplete and was not kept",
                error_type="incomplete-stream",
            )
        return assembler.payload()

    async def aclose(self) -> None:
        await self._client.aclose()

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"{type(self).__name__}(base_url={str(self._client.base_url)!r}, api_key={key})"
