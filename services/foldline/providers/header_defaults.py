"""Config a serializer fills into the logged header when the caller leaves it unset.

The loop renders the header of every step through :func:`header_config`, so the value lands in the
``request/header`` snapshot — the log, not the serializer, holds it, and a rebuild needs nothing else:

* ``openai-responses``: ``promptCacheKey`` = ``"foldline-"`` + the first 32 hex digits of sha256(session id).
  The Responses API routes requests with one key to the same cache, so every step of a session (and nothing
  else) shares it; a fork gets its own key with its first ``resume`` snapshot.
"""

from __future__ import annotations

import hashlib

from ..core.header import CallConfig
from .base import Serializer

__all__ = ["header_config", "prompt_cache_key"]


def prompt_cache_key(session_id: str) -> str:
    return "foldline-" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:32]


def header_config(serializer: Serializer, session_id: str, config: CallConfig) -> CallConfig:
    """``config`` completed with what ``serializer`` derives from the session (see the module docstring)."""
    if serializer.name == "openai-responses" and config.prompt_cache_key is None:
        return config.with_overrides(prompt_cache_key=prompt_cache_key(session_id))
    return config
