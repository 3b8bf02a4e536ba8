"""The requests whose exact wire bytes are locked under ``tests/fixtures/golden/<serializer>/v<version>/``.

Regenerate deliberately (after a reviewed wire change, which must come with a *new serializer version*
unless the old bytes were wrong) with::

    FOLDLINE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/providers/test_golden.py

and commit the changed files; ``git diff`` shows the exact byte changes.
"""

from __future__ import annotations

from pathlib import Path

from foldline.core import (
    EncryptedReasoningBlock,
    GenerateOptions,
    ReasoningBlock,
    RedactedReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from foldline.core.projection import Message
from foldline.ports.attachments import AttachmentStore

from .helpers import PNG_3X2, image_block, request, user

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "golden"

#: The cases a serializer version refuses (it raises ProviderError, so there is no fixture): v2 and v3 of
#: anthropic-messages require maxTokens, the Responses API has no stop sequences, and every version before
#: the streaming ones refuses a config that streams.
REFUSED: dict[tuple[str, int], frozenset[str]] = {
    ("anthropic-messages", 1): frozenset({"streaming"}),
    ("anthropic-messages", 2): frozenset({"minimal", "streaming"}),
    ("anthropic-messages", 3): frozenset({"minimal"}),
    ("openai-chat", 1): frozenset({"streaming"}),
    ("openai-responses", 1): frozenset({"tools_and_config", "streaming"}),
    ("openai-responses", 2): frozenset({"tools_and_config"}),
    ("reasoning-chat", 1): frozenset({"streaming"}),
}
#: Each version that adds streaming, and the version it extends: without ``stream`` they write the same bytes.
STREAMING_VERSIONS: dict[tuple[str, int], int] = {
    ("anthropic-messages", 3): 2,
    ("openai-chat", 2): 1,
    ("openai-responses", 2): 1,
    ("reasoning-chat", 2): 1,
}

#: A reasoning session as each provider returns it: thinking with signatures and redacted thinking
#: (Anthropic), encrypted reasoning items (Responses), plain reasoning text (reasoning_content chat).
THINKING = (
    ReasoningBlock("The user wants the listing. I should call list_dir.", "c2lnbmF0dXJlLTE="),
    RedactedReasoningBlock("RURBQ1RFRA=="),
)
ITEM = EncryptedReasoningBlock("rs_0001", ("Listing the directory first.", "Then reading."), "ZW5jcnlwdGVk")
PLAIN = ReasoningBlock("I need the directory listing; list_dir gives it.")


def cases(store: AttachmentStore) -> dict[str, GenerateOptions]:
    image = image_block(store, PNG_3X2)
    return {
        # The smallest request: one user message, no system, no tools, no config scalars.
        "minimal": request([user("Hello")], system=None, tools=None),
        # A tool round trip with every call-config scalar set.
        "tools_and_config": request(
            [
                user("Which files are in src?"),
                Message(
                    "assistant",
                    (
                        TextBlock("Let me look."),
                        ToolCallBlock("call_1", "list_dir", '{"path": "src"}'),
                        ToolCallBlock("call_2", "read_file", '{"path":"src/a.py","limit":10}'),
                    ),
                ),
                Message("tool", (ToolResultBlock("call_1", (TextBlock("a.py\nb.py"),)),)),
                Message("tool", (ToolResultBlock("call_2", (TextBlock("print('hi')"),)),)),
                Message("assistant", (TextBlock("There are two files."),)),
                user('Thanks — and the time? \u00e9\u00e8 \U0001f600 "quoted"'),
            ],
            max_tokens=2048,
            temperature=0.25,
            stop=("STOP", "\n\nHuman:"),
            reasoning_effort="low",
        ),
        # Images in a user message and in a tool result; an error result; an empty tool result.
        "images_and_errors": request(
            [
                Message("user", (TextBlock("What is in this picture?"), image)),
                Message(
                    "assistant",
                    (
                        ToolCallBlock("call_9", "read_file", '{"path":"shot.png"}'),
                        ToolCallBlock("call_10", "now", "{}"),
                    ),
                ),
                Message("tool", (ToolResultBlock("call_9", (TextBlock("the screenshot"), image)),)),
                Message("tool", (ToolResultBlock("call_10", (), is_error=True),)),
                user("And now?"),
            ],
            max_tokens=300,
        ),
        # A thinking tool loop: every kind of reasoning block in the assistant turns, an effort and a cache TTL.
        "reasoning": request(
            [
                user("List src, then tell me what is there."),
                Message("assistant", (*THINKING, ITEM, PLAIN, ToolCallBlock("call_1", "list_dir", '{"path":"src"}'))),
                Message("tool", (ToolResultBlock("call_1", (TextBlock("a.py"), TextBlock("b.py"))),)),
                Message(
                    "assistant",
                    (
                        ReasoningBlock("Two files.", "c2lnbmF0dXJlLTI="),
                        ReasoningBlock(" Done."),
                        TextBlock("a.py, b.py"),
                    ),
                ),
                user("Thanks."),
            ],
            max_tokens=4096,
            reasoning_effort="high",
            cache_ttl="5m",
            prompt_cache_key="foldline-0123456789abcdef",
        ),
        # A fixed thinking budget and the 1-hour TTL (Anthropic); effort off (Responses: none; chat: thinking off).
        "reasoning_budget": request(
            [user("Think briefly."), Message("assistant", (THINKING[0], TextBlock("Done."))), user("Again.")],
            max_tokens=8000,
            thinking_budget=2048,
            reasoning_effort="max",
        ),
        "reasoning_off": request(
            [user("No thinking, please.")], system=None, tools=None, max_tokens=100, reasoning_effort="off"
        ),
        # A tool round trip whose logged config asks for a streamed answer.
        "streaming": request(
            [
                user("Stream the answer, please."),
                Message("assistant", (ToolCallBlock("call_5", "now", "{}"),)),
                Message("tool", (ToolResultBlock("call_5", (TextBlock("12:00"),)),)),
            ],
            max_tokens=512,
            stream=True,
        ),
    }
