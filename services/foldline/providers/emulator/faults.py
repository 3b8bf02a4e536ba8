"""Injected faults: what the emulator does instead of (or to) an answer, chosen by request index or by rate.

A :class:`FaultPlan` picks at most one :class:`Fault` per request, from the request's index (0 for the first
request that reaches a model route, counted over every API): first the faults given for that index, then
the rates, each request drawing a number in ``[0, 1)`` from the sha256 of the plan's seed and its index — so a
plan answers the same request index the same way in every run, and nothing is random.

The kinds, as a real provider shows them:

* ``status`` — an error answer before the request is looked at: 429 (with ``retry-after`` / ``retry-after-ms``
  when ``retry_after_s`` is set), 529, 500 or any other status, in the error shape and vocabulary of the API
  asked (Anthropic: ``rate_limit_error``, ``overloaded_error``, ``api_error``; OpenAI-style: ``requests`` /
  ``rate_limit_exceeded``, ``service_unavailable_error`` / ``server_is_overloaded``, ``server_error``), with
  ``error_type`` in place of the API's type when given;
* ``reset-before`` — the connection is closed before the first byte of an answer (no status line);
* ``reset-mid`` — the answer starts (status, headers, the first half of its bytes or of its stream's
  events) and the connection is then closed;
* ``error-mid`` — a streamed answer stops after the first half of its events with the API's ``error`` event
  (Anthropic ``event: error`` with ``overloaded_error``; Chat Completions a chunk holding an ``error`` object of
  type ``server_error``; Responses an ``error`` event with code ``server_error``; ``error_type`` names another
  type) and the stream ends there, the connection intact. A request that does not stream gets the error as
  its status answer instead (529 or 500);
* ``slow-first-byte`` — the answer is held ``delay_s`` seconds before its first byte.

The in-process transport and the HTTP server both carry them out (an httpx ``ReadError`` / a closed socket).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = ["Fault", "FaultKind", "FaultPlan"]

FaultKind: TypeAlias = Literal["status", "reset-before", "reset-mid", "error-mid", "slow-first-byte"]


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    status: int = 0  # for ``status``
    retry_after_s: float | None = None  # for ``status``: sent as retry-after (whole seconds, rounded up) and -ms
    delay_s: float = 0.0  # for ``slow-first-byte``
    # ``status``: overrides the API's type for the status (e.g. a quota 429); ``error-mid``: the event's type
    error_type: str | None = None
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
    def stream_error(error_type: str | None = None) -> Fault:
        """A streamed answer broken off by the API's ``error`` event (a transient type unless ``error_type``)."""
        return Fault("error-mid", error_type=error_type)

    @staticmethod
    def parse(text: str) -> Fault:
        """A fault from its short form: ``429`` or ``429:2.5`` (a status, with retry-after seconds), ``529``,
        ``500``, ``reset-before``, ``reset-mid``, ``error-mid`` or ``error-mid:TYPE`` (a mid-stream error event),
        ``slow:1.5`` (first byte after 1.5 s)."""
        head, _, arg = text.partition(":")
        try:
            if head == "reset-before" and not arg:
                return Fault("reset-before")
            if head == "reset-mid" and not arg:
                return Fault("reset-mid")
            if head == "error-mid":
                return Fault("error-mid", error_type=arg or None)
            if head == "slow":
                return Fault("slow-first-byte", delay_s=float(arg))
            return Fault("status", int(head), float(arg) if arg else None)
        except ValueError:
            raise ValueError(
                f"fault {text!r}: expected STATUS[:RETRY_AFTER_S], reset-before, reset-mid, error-mid[:TYPE] or "
                "slow:SECONDS"
            ) from None

    def __post_init__(self) -> None:
        if self.kind == "status" and not 400 <= self.status <= 599:
            raise ValueError(f"a status fault needs an error status (400..599), got {self.status}")
        if self.delay_s < 0 or (self.retry_after_s is not None and self.retry_after_s < 0):
            raise ValueError("fault delays must be >= 0")
        if self.error_type is not None and not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", self.error_type):
            raise ValueError(
                f"a fault's error type is a lower-case identifier (e.g. overloaded_error), got {self.error_type!r}"
            )


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
