"""What the adapters of OpenAI-style APIs share on the HTTP side: the request headers and the constructor.

OpenAI's two APIs (Chat Completions, :mod:`foldline.providers.openai`; Responses,
:mod:`foldline.providers.openai_responses`) authenticate alike: ``Authorization: Bearer <key>`` when a key is
given, ``OpenAI-Organization`` when an organization is. The ``reasoning_content`` chat servers
(:mod:`foldline.providers.reasoning_chat`) take the same bearer header.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Generic, TypeVar

import httpx

from .http import JsonHttpProvider
from .json_body import JsonBodySerializer
from .settings import TransportSettings

__all__ = ["OPENAI_BASE_URL", "OpenAIHttpProvider", "bearer_headers"]

OPENAI_BASE_URL = "https://api.openai.com/v1"  # as the OpenAI SDK takes it

S = TypeVar("S", bound=JsonBodySerializer)


def bearer_headers(api_key: str | None, organization: str | None = None) -> dict[str, str]:
    """``authorization: Bearer <api_key>`` when a key is given, ``openai-organization`` when an organization is."""
    headers: dict[str, str] = {}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if organization:
        headers["openai-organization"] = organization
    return headers


class OpenAIHttpProvider(JsonHttpProvider, Generic[S]):
    """Posts serialized bodies to ``{base_url}{path}`` of an OpenAI API with the headers of
    :func:`bearer_headers`; ``base_url`` as the OpenAI SDK takes it (``https://api.openai.com/v1``) or without
    the ``/v1`` (:func:`~foldline.providers.http.post_url`). An adapter names its provider and path, and the
    serializer it sends with when given none (:meth:`default_serializer`). ``name``: the provider name of
    another server of the API (vLLM, a gateway), as its CallConfig gives it."""

    request_id_headers: ClassVar[tuple[str, ...]] = ("x-request-id", "request-id")

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        base_url: str = OPENAI_BASE_URL,
        *,
        organization: str | None = None,
        serializer: S | None = None,  # default: the adapter's default_serializer()
        timeout: float | httpx.Timeout | None = None,
        settings: TransportSettings | None = None,
        name: str | None = None,
    ) -> None:
        self.serializer: S = serializer or self.default_serializer()
        headers = bearer_headers(api_key, organization)
        super().__init__(transport, api_key, base_url, headers=headers, timeout=timeout, settings=settings, name=name)

    @abc.abstractmethod
    def default_serializer(self) -> S:
        """The serializer version this adapter sends with when the caller names none."""
