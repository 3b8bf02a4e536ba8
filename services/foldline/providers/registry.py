"""Every serializer version this build can replay, registered in :data:`foldline.providers.base.SERIALIZERS`.

Importing :mod:`foldline.providers` imports this module. Registration happens here and only here: each
adapter module defines its serializer versions (``ANTHROPIC_MESSAGES_V3`` in :mod:`.anthropic`, ...) and
imports nothing back, so the adapters depend on this module never (``tests/test_layering.py`` holds it). A
new wire format version is a new serializer instance in its adapter, listed here next to the old one (old
logs keep replaying with the version that wrote them), plus its golden fixtures under
``tests/fixtures/golden/<name>/v<version>/``.
"""

from __future__ import annotations

from .anthropic import (
    ANTHROPIC_MESSAGES_V1,
    ANTHROPIC_MESSAGES_V2,
    ANTHROPIC_MESSAGES_V3,
    ANTHROPIC_MESSAGES_V4,
    ANTHROPIC_MESSAGES_V5,
)
from .base import Serializer, register_serializer
from .openai import OPENAI_CHAT_V1, OPENAI_CHAT_V2, OPENAI_CHAT_V3, OPENAI_CHAT_V4
from .openai_responses import OPENAI_RESPONSES_V1, OPENAI_RESPONSES_V2, OPENAI_RESPONSES_V3, OPENAI_RESPONSES_V4
from .reasoning_chat import REASONING_CHAT_V1, REASONING_CHAT_V2, REASONING_CHAT_V3, REASONING_CHAT_V4

__all__ = [
    "ANTHROPIC_MESSAGES_V1",
    "ANTHROPIC_MESSAGES_V2",
    "ANTHROPIC_MESSAGES_V3",
    "ANTHROPIC_MESSAGES_V4",
    "ANTHROPIC_MESSAGES_V5",
    "OPENAI_CHAT_V1",
    "OPENAI_CHAT_V2",
    "OPENAI_CHAT_V3",
    "OPENAI_CHAT_V4",
    "OPENAI_RESPONSES_V1",
    "OPENAI_RESPONSES_V2",
    "OPENAI_RESPONSES_V3",
    "OPENAI_RESPONSES_V4",
    "REASONING_CHAT_V1",
    "REASONING_CHAT_V2",
    "REASONING_CHAT_V3",
    "REASONING_CHAT_V4",
    "REGISTERED",
]

#: Every version, in the order they are registered.
REGISTERED: tuple[Serializer, ...] = (
    ANTHROPIC_MESSAGES_V1,
    ANTHROPIC_MESSAGES_V2,
    ANTHROPIC_MESSAGES_V3,
    ANTHROPIC_MESSAGES_V4,
    ANTHROPIC_MESSAGES_V5,
    OPENAI_CHAT_V1,
    OPENAI_CHAT_V2,
    OPENAI_CHAT_V3,
    OPENAI_CHAT_V4,
    OPENAI_RESPONSES_V1,
    OPENAI_RESPONSES_V2,
    OPENAI_RESPONSES_V3,
    OPENAI_RESPONSES_V4,
    REASONING_CHAT_V1,
    REASONING_CHAT_V2,
    REASONING_CHAT_V3,
    REASONING_CHAT_V4,
)

for _serializer in REGISTERED:
    register_serializer(_serializer)
