"""What both response parsers share: token counts, and a malformed answer mapped to ProviderError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ProviderError

__all__ = ["answer_shape", "token_count"]


def token_count(value: Any) -> int:
    """A usage field: absent (None) is 0; anything but a non-negative integer is a malformed answer."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"token count {value!r}")
    return value


@contextmanager
def answer_shape(provider: str, api: str) -> Iterator[None]:
    """Read an answer inside this: a missing field or a value of the wrong shape becomes a ProviderError."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ProviderError(f"{provider}: unusable {api} answer ({type(exc).__name__}: {exc})") from None
