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
    ToolSpec,
)
from foldline.core.projection import Message
from foldline.ports.attachments import AttachmentStore

from .helpers import PNG_3X2, image_block, request, user

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "golden"

#: The cases a serializer version refuses (it raises ProviderError, so there is no fixture): v2 and later of
#: anthropic-messages require maxTokens, the Responses API has no stop sequences, and every version before
#: the streaming ones refuses a config that streams.
REFUSED: dict[tuple[str, int], frozenset[str]] = {
    ("anthropic-messages", 1): frozenset({"streaming"}),
    ("anthropic-messages", 2): frozenset({"minimal", "streaming"}),
    ("anthropic-messages", 3): frozenset({"minimal"}),
    ("anthropic-messages", 4): frozenset({"minimal"}),
    ("openai-chat", 1): frozenset({"streaming"}),
    ("openai-responses", 1): frozenset({"tools_and_config", "streaming"}),
    ("openai-responses", 2): frozenset({"tools_and_config"}),
    ("openai-responses", 3): frozenset({"tools_and_config"}),
    ("reasoning-chat", 1): frozenset({"streaming"}),
}
#: The cases that ask for structured output: every version before the structured-output ones (§9.10) refuses them.
STRUCTURED_CASES = frozenset({"structured_output", "structured_plain"})
#: The first version of each serializer that writes an output schema.
STRUCTURED_SINCE: dict[str, int] = {
    "anthropic-messages": 5,
    "openai-chat": 4,
    "openai-responses": 4,
    "reasoning-chat": 4,
}
for _name, _version in [(n, v) for n, top in STRUCTURED_SINCE.items() for v in range(1, top)]:
    REFUSED[(_name, _version)] = REFUSED.get((_name, _version), frozenset()) | STRUCTURED_CASES
REFUSED[("anthropic-messages", 5)] = frozenset({"minimal"})
REFUSED[("openai-responses", 4)] = frozenset({"tools_and_config"})
#: Each version that adds streaming, and the version it extends: without ``stream`` they write the same bytes.
STREAMING_VERSIONS: dict[tuple[str, int], int] = {
    ("anthropic-messages", 3): 2,
    ("openai-chat", 2): 1,
    ("openai-responses", 2): 1,
    ("reasoning-chat", 2): 1,
}
#: Each version that sends tool schemas (and anthropic-messages' tool-call inputs) in their author's key order
#: (docs/FORMAT.md §9.8), and the version it extends: with every object sorted again, their bodies are equal.
#: (reasoning-chat v3 changes more, §9.9, so it is not here.)
ORDERED_VERSIONS: dict[tuple[str, int], int] = {
    ("anthropic-messages", 4): 3,
    ("openai-chat", 3): 2,
    ("openai-responses", 3): 2,
}
#: Each version that adds structured output, and the version it extends: on every other case the bytes are equal.
STRUCTURED_VERSIONS: dict[tuple[str, int], int] = {
    (name, version): version - 1 for name, version in STRUCTURED_SINCE.items()
}
#: The provider documentation each case of a version follows where the version departs from the one before:
#: its fixture directory's README.md names the page beside the fixture (a test holds them to it).
DEEPSEEK_REFERENCE = "https://api-docs.deepseek.com/api/create-chat-completion"
DEEPSEEK_THINKING = "https://api-docs.deepseek.com/guides/thinking_mode"
DOCUMENTED: dict[tuple[str, int], dict[str, str]] = {
    ("anthropic-messages", 4): {"ordered_schema": "https://docs.claude.com/en/docs/agents-and-tools/tool-use/overview"},
    ("openai-chat", 3): {"ordered_schema": "https://platform.openai.com/docs/guides/structured-outputs"},
    ("openai-responses", 3): {"ordered_schema": "https://platform.openai.com/docs/guides/structured-outputs"},
    ("reasoning-chat", 3): {
        "ordered_schema": "https://platform.openai.com/docs/guides/structured-outputs",
        "tool_calls_only": DEEPSEEK_REFERENCE,
        "several_texts": DEEPSEEK_REFERENCE,
        "thinking_effort": DEEPSEEK_THINKING,
    },
    ("anthropic-messages", 5): {
        "structured_output": "https://docs.claude.com/en/docs/build-with-claude/structured-outputs",
        "structured_plain": "https://docs.claude.com/en/docs/build-with-claude/structured-outputs",
    },
    ("openai-chat", 4): {
        "structured_output": "https://platform.openai.com/docs/api-reference/chat/create",
        "structured_plain": "https://platform.openai.com/docs/guides/structured-outputs",
    },
    ("openai-responses", 4): {
        "structured_output": "https://platform.openai.com/docs/api-reference/responses/create",
        "structured_plain": "https://platform.openai.com/docs/guides/structured-outputs",
    },
    ("reasoning-chat", 4): {
        "structured_output": "https://api-docs.deepseek.com/guides/json_mode",
        "structured_plain": "https://api-docs.deepseek.com/guides/json_mode",
    },
}

#: An output schema as pydantic writes a model declared ``city, temperature, conditions`` (properties in declaration
#: order, a nested model in ``$defs``), with ``additionalProperties: false`` on each object (loop/output.py).
WEATHER = {
    "$defs": {
        "Wind": {
            "additionalProperties": False,
            "properties": {
                "speed": {"title": "Speed", "type": "number"},
                "bearing": {"title": "Bearing", "type": "integer"},
            },
            "required": ["speed", "bearing"],
            "title": "Wind",
            "type": "object",
        }
    },
    "properties": {
        "city": {"title": "City", "type": "string"},
        "temperature": {"title": "Temperature", "type": "integer"},
        "conditions": {"enum": ["sunny", "rain", "snow"], "title": "Conditions", "type": "string"},
        "wind": {"$ref": "#/$defs/Wind"},
    },
    "required": ["city", "temperature", "conditions", "wind"],
    "title": "Weather",
    "type": "object",
    "additionalProperties": False,
}

#: A reasoning session as each provider returns it: thinking with signatures and redacted thinking
#: (Anthropic), encrypted reasoning items (Responses), plain reasoning text (reasoning_content chat).
THINKING = (
    ReasoningBlock("The user wants the listing. I should call list_dir.", "c2lnbmF0dXJlLTE="),
    RedactedReasoningBlock("RURBQ1RFRA=="),
)
ITEM = EncryptedReasoningBlock("rs_0001", ("Listing the directory first.", "Then reading."), "ZW5jcnlwdGVk")
PLAIN = ReasoningBlock("I need the directory listing; list_dir gives it.")

#: A tool whose parameters are a pydantic model declared ``zeta, alpha, mid``, its schema exactly as
#: ``Probe.model_json_schema()`` writes it (pydantic sorts the keywords of each schema object and keeps
#: ``properties`` in declaration order), plus a nested object of our own in a non-sorted order.
PROBE = ToolSpec(
    "probe",
    "Record a probe reading.",
    {
        "$defs": {"Unit": {"enum": ["mm", "in"], "title": "Unit", "type": "string"}},
        "properties": {
            "zeta": {"title": "Zeta", "type": "string"},
            "alpha": {"title": "Alpha", "type": "integer"},
            "mid": {
                "anyOf": [{"items": {"type": "number"}, "type": "array"}, {"type": "null"}],
                "default": None,
                "title": "Mid",
            },
            "unit": {"$ref": "#/$defs/Unit", "default": "mm"},
        },
        "required": ["zeta", "alpha"],
        "title": "Probe",
        "type": "object",
        "x-display": {"order": 2, "label": "Probe", "group": "sensors"},
    },
)


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
        # A tool whose schema's properties are not in sorted order, called with arguments not in sorted order (a
        # key given twice, a nested object): the versions of docs/FORMAT.md §9.8 keep both orders.
        "ordered_schema": request(
            [
                user("Take a reading."),
                Message(
                    "assistant",
                    (
                        ToolCallBlock(
                            "call_7",
                            "probe",
                            '{"zeta": "z1", "alpha": 3, "mid": [2.5, 1], "alpha": 4, "x": {"b": 1, "a": 2}}',
                        ),
                    ),
                ),
                Message("tool", (ToolResultBlock("call_7", (TextBlock("recorded"),)),)),
            ],
            tools=(PROBE,),
            max_tokens=256,
        ),
        # An assistant turn of tool calls only (reasoning-chat v3: "content": null, DeepSeek's reference).
        "tool_calls_only": request(
            [
                user("Read both files."),
                Message(
                    "assistant",
                    (
                        ToolCallBlock("call_3", "read_file", '{"path":"a.py"}'),
                        ToolCallBlock("call_4", "read_file", '{"path":"b.py"}'),
                    ),
                ),
                Message("tool", (ToolResultBlock("call_3", (TextBlock("print(1)"),)),)),
                Message("tool", (ToolResultBlock("call_4", (TextBlock("print(2)"),)),)),
            ],
            max_tokens=256,
        ),
        # Several text blocks in one message of every role, an empty one among them (reasoning-chat v3: one string
        # each, the non-empty texts joined by a blank line).
        "several_texts": request(
            [
                Message("user", (TextBlock("Context: the repo is small."), TextBlock(""), TextBlock("Question: why?"))),
                Message(
                    "assistant",
                    (TextBlock("First, a look."), TextBlock("Then the answer."), ToolCallBlock("call_6", "now", "{}")),
                ),
                Message("tool", (ToolResultBlock("call_6", (TextBlock("12:00"), TextBlock("UTC"))),)),
                Message("user", (TextBlock(""), TextBlock(""))),
            ],
            max_tokens=256,
        ),
        # An effort and no reasoning in the history (reasoning-chat v3: the thinking switch sent explicitly).
        "thinking_effort": request(
            [user("Think it through.")], system=None, tools=None, max_tokens=2048, reasoning_effort="medium"
        ),
        # Structured output (§9.10) beside a system prompt, tools and an effort: each API's native field, the schema
        # in its author's key order (Anthropic: output_config.format beside output_config.effort).
        "structured_output": request(
            [user("Weather in Lyon, as JSON.")],
            max_tokens=512,
            reasoning_effort="low",
            output_schema=WEATHER,
            output_name="Weather",
        ),
        # Structured output alone: no system prompt, no tools (reasoning-chat v4: the instruction is the system text).
        "structured_plain": request(
            [user("Weather in Oslo.")],
            system=None,
            tools=None,
            max_tokens=256,
            output_schema=WEATHER,
            output_name="Weather",
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
