"""What the response parsers share: token counts, the Messages API's usage (its whole answers and its streams' partial
answers), and a malformed answer mapped to ProviderError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.content import Usage
from ..errors import ProviderError

__all__ = ["answer_shape", "messages_usage", "part_count", "token_count"]


def token_count(value: Any) -> int:
    """A usage field: absent (None) is 0; anything but a non-negative integer is a malformed answer."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"token count {value!r}")
    return value


def part_count(details: Any, key: str, whole: int, of: str) -> int | None:
    """An optional breakdown count (``details[key]``, a part of the ``whole`` count named ``of``): ``None`` when
    the answer does not give it; a malformed answer when it is not a token count or exceeds the whole."""
    if details is None:
        return None
    value = details.get(key)
    if value is None:
        return None
    count = token_count(value)
    if count > whole:
        raise TypeError(f"{key} {count} exceeds {of} {whole}")
    return count


def messages_usage(u: Any) -> Usage:
    """Messages API usage: ``input_tokens`` is the uncached input; cache reads and writes are reported apart,
    and the writes split by TTL in ``cache_creation`` (the 1-hour part is logged as ``cacheWrite1h``)."""
    written = token_count(u.get("cache_creation_input_tokens"))
    return Usage(
        input=token_count(u["input_tokens"]),
        output=token_count(u["output_tokens"]),
        cache_read=token_count(u.get("cache_read_input_tokens")),
        cache_write=written,
        cache_write_1h=part_count(
            u.get("cache_creation"), "ephemeral_1h_input_tokens", written, "cache_creation_input_tokens"
        ),
    )


@contextmanager
def answer_shape(provider: str, api: str) -> Iterator[None]:
    """Read an answer inside this: a missing field or a value of the wrong shape becomes a ProviderError."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ProviderError(f"{provider}: unusable {api} answer ({type(exc).__name__}: {exc})") from None
