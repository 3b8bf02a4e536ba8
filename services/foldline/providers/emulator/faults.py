"""Injected faults: what the emulator does instead of (or to) an answer, chosen by request index or by rate.

A :class:`FaultPlan` picks at most one :class:`Fault` per request, from the request's index (0 for the first
request that reaches a model route, counted over every API): first the faults given for that index, then
the rates, each request drawing a number in ``[0, 1)`` from the sha256 of the plan's seed and its index — so a
plan answers the same request index the same way in every run, and nothing is random.

The kinds, as a real provider shows them:

* ``status`` — an error answer before the request is looked at: 429 (``rate_limit_error``, with
  ``retry-after`` / ``retry-after-ms`` when ``retry_after_s`` is set), 529 (``overloaded_error``), 500
  (``api_error``) or any other status, in the error shape of the API asked;
* ``reset-before`` — the connection is closed before the first byte of an answer (no status line);
* ``reset-mid`` — the answer starts (status, headers, the first half of its bytes or of its stream's
  events) and the connection is then closed;
* ``slow-first-byte`` — the answer is held ``delay_s`` seconds before its first byte.

The in-process transport and the HTTP server both carry them out (an httpx ``ReadError`` / a closed socket).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = ["Fault", "FaultKind", "FaultPlan"]

FaultKind: TypeAlias = Literal["status", "reset-before", "reset-mid", "slow-first-byte"]

#: The error type each API names a status with (Anthropic's words; OpenAI's error bodies use the same keys).
STATUS_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    status: int = 0  # for ``status``
    retry_after_s: float | None = None  # for ``status``: sent as retry-after (whole seconds, rounded up) and -ms
    delay_s: float = 0.0  # for ``slow-first-byte``
    error_type: str | None = None  # for ``status``: overrides the API's type for the status (e.g. a quota 429)
    message: str | None = None

    @staticmethod
    def rate_limited(retry_after_s: float | None = 1.0) -> Fault:
        return Fault("status", 429, retry_after_s)

    @staticmethod
    def overloaded() -> Fault:
        return Fault("status", 529)

    @staticmethod
    def server_error() -> Fault:
        return Fault("status", 500)

    @staticmethod
    def parse(text: str) -> Fault:
        """A fault from its short form: ``429`` or ``429:2.5`` (a status, with retry-after seconds), ``529``,
        ``500``, ``reset-before``, ``reset-mid``, ``slow:1.5`` (first byte after 1.5 s)."""
        head, _, arg = text.partition(":")
        try:
            if head == "reset-before" and not arg:
                return Fault("reset-before")
            if head == "reset-mid" and not arg:
                return Fault("reset-mid")
            if head == "slow":
                return Fault("slow-first-byte", delay_s=float(arg))
            return Fault("status", int(head), float(arg) if arg else None)
        except ValueError:
            raise ValueError(
                f"fault {text!r}: expected STATUS[:RETRY_AFTER_S], reset-before, reset-mid or slow:SECONDS"
            ) from None

    def __post_init__(self) -> None:
        if self.kind == "status" and not 400 <= self.status <= 599:
            raise ValueError(f"a status fault needs an error status (400..599), got {self.status}")
        if self.delay_s < 0 or (self.retry_after_s is not None and self.retry_after_s < 0):
            raise ValueError("fault delays must be >= 0")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Which requests fail, and how: ``by_index`` (request index → fault) first, then ``rates`` ((rate, fault)
    pairs; their rates add up to at most 1) drawn per request from ``seed``."""

    by_index: Mapping[int, Fault] = field(default_factory=dict)
    rates: Sequence[tuple[float, Fault]] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        total = sum(rate for rate, _ in self.rates)
        if any(rate < 0 for rate, _ in self.rates) or total > 1.0 + 1e-9:
            raise ValueError(f"fault rates must be >= 0 and add up to at most 1, got {total}")

    def fault_for(self, index: int) -> Fault | None:
        chosen = self.by_index.get(index)
        if chosen is not None or not self.rates:
            return chosen
        digest = hashlib.sha256(f"{self.seed}:{index}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for rate, fault in self.rates:
            edge += rate
            if draw < edge:
                return fault
        return None
