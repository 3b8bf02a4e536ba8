"""The requests whose exact wire bytes are locked under ``tests/fixtures/golden/<serializer>/v<version>/``.

Regenerate deliberately (after a reviewed wire change, which must come with a *new serializer version*
unless the old bytes were wrong) with::

    FOLDLINE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/providers/test_golden.py

and commit the changed files; ``git diff`` shows the exact byte changes.
"""

from __future__ import annotations

from pathlib import Path

from foldline.core import GenerateOptions, TextBlock, ToolCallBlock, ToolResultBlock
from foldline.core.projection import Message
from foldline.ports.attachments import AttachmentStore

from .helpers import PNG_3X2, image_block, request, user

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "golden"


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
    }
