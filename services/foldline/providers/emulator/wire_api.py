"""What each provider API the emulator serves provides: :class:`WireApi`, one subclass per wire format."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from .answer import Answer
from .cache import CacheUsage, PrefixCache
from .checks import RequestRejected
from .prompt import Prompt, Resume
from .script import Api

__all__ = ["WireApi"]

PolicyT = TypeVar("PolicyT")


class WireApi(abc.ABC, Generic[PolicyT]):
    """One API: its route, credential, parser, cache accounting under ``policy``, and answer and error shapes."""

    name: ClassVar[Api]
    path: ClassVar[str]
    #: its parser takes ``resume`` (a request is parsed from where it differs from one seen: :mod:`.prefix`)
    resumable: ClassVar[bool] = False

    def __init__(self, policy: PolicyT) -> None:
        self.policy = policy

    @abc.abstractmethod
    def credential(self, headers: Mapping[str, str]) -> str | None:
        """The API key the request carries (``headers`` keys are lower case)."""

    def check_headers(self, headers: Mapping[str, str]) -> None:
        """Reject a request that lacks a header this API requires; by default none is required."""

    @abc.abstractmethod
    def parse(self, payload: Any, resume: Resume | None = None) -> Prompt:
        """The decoded JSON body → a complete :class:`~.prompt.Prompt`, or :class:`RequestRejected`.

        ``resume`` (only when :attr:`resumable`): the body's message list holds only the messages after a
        prefix parsed before, which ``resume`` describes; the result is the prompt of the whole request."""

    @abc.abstractmethod
    def account(self, cache: PrefixCache, prompt: Prompt) -> CacheUsage:
        """Read and write the prompt's prefixes the way this API caches."""

    @abc.abstractmethod
    def render(self, prompt: Prompt, answer: Answer, usage: CacheUsage, clock: Callable[[], float]) -> dict[str, Any]:
        """The answer as this API's JSON response body; ``clock`` is read only for a timestamp the API sends."""

    @abc.abstractmethod
    def error_body(self, exc: RequestRejected, request_id: str | None) -> dict[str, Any]:
        """A rejection as this API's JSON error body (``request_id``: the id in the request-id header)."""

    @abc.abstractmethod
    def status_error(self, status: int) -> RequestRejected:
        """An injected error status in this API's words: its error type (and code) and a message like its own."""
