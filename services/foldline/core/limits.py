"""How large one event and one request may be: limits every backend holds, and the checks that keep them.

* :data:`MAX_EVENT_BYTES` — an event's canonical JSON (its stored and exported form, docs/FORMAT.md) is at most
  4 MiB. Every log refuses a larger one on append (:class:`~foldline.errors.EventTooLarge`, rule
  ``event-size``) and an import refuses a longer line before decoding it. Every backend holds it with room:
  a Kafka record of it (Avro, smaller than the JSON) within the 8 MiB the log's topics, producers and
  consumers are set to (``adapters/kafka/records.py``), a Redis fold entry (512 MB), a SQLite row (1 GB), an
  archive segment.
* The limit is on an event's own canonical form, its content as it is. Stored sealed (docs/ERASURE.md) an event
  takes more room — each content string becomes base64 of its bytes plus 28 — and every backend holds that too
  (a 4 MiB event seals to at most about 5.6 MiB: within a Kafka record's 8 MiB). :func:`check_stored_size`
  checks the limit on a sealed event's stored bytes without encoding its plain form again, but where it could
  be over.
* :data:`MAX_REQUEST_BODY_BYTES` — a request body a loop builds is at most 32 MiB (the Anthropic Messages
  API's own request limit, 32 MB): a larger one is :class:`~foldline.errors.RequestTooLarge` before anything
  is logged for it or sent.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import EventTooLarge, RequestTooLarge

__all__ = ["MAX_EVENT_BYTES", "MAX_REQUEST_BODY_BYTES", "check_event_size", "check_request_size", "check_stored_size"]

MAX_EVENT_BYTES = 4 * 1024 * 1024
MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024


def check_event_size(size: int, seq: int | None = None, what: str = "the event") -> None:
    """:class:`EventTooLarge` when an event's canonical encoding of ``size`` bytes is over the limit."""
    if size > MAX_EVENT_BYTES:
        raise EventTooLarge(size, MAX_EVENT_BYTES, what, seq=seq)


def check_stored_size(stored: int, sealed: bool, plain: Callable[[], int], seq: int | None = None) -> None:
    """:func:`check_event_size` of an event stored in ``stored`` bytes — sealed or not. A sealed event's plain
    form is at most 4.5 times its stored bytes (a content byte escapes to at most 6 bytes of JSON and seals to at
    least 4/3 of a byte of base64), so ``plain()`` (its plain size) is computed only when that could be over."""
    if not sealed:
        check_event_size(stored, seq)
    elif stored * 9 > 2 * MAX_EVENT_BYTES:
        check_event_size(plain(), seq)


def check_request_size(size: int) -> None:
    """:class:`RequestTooLarge` when a request body of ``size`` bytes is over the limit."""
    if size > MAX_REQUEST_BODY_BYTES:
        raise RequestTooLarge(size, MAX_REQUEST_BODY_BYTES)
