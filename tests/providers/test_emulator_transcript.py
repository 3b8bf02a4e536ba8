"""The emulator's answers, byte for byte: a committed transcript of scripted exchanges in both wire formats.

Every answer the emulator gives (status and body) for the exchanges below is locked in
``tests/fixtures/emulator/transcript.jsonl``: conversations driven through both serializers (token counts,
both cache models with TTLs, refreshes, the lookback window, a 1-hour breakpoint), stop sequences and
``max_tokens``, and one rejected request per check the parsers make. A change to how the emulator counts,
caches, answers or rejects shows up here as a diff. Regenerate deliberately with::

    FOLDLINE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/providers/test_emulator_transcript.py
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import TextBlock, ToolCallBlock, ToolResultBlock
from foldline.core.codec import canonical_json
from foldline.core.projection import Message
from foldline.providers.anthropic import parse_response as parse_anthropic
from foldline.providers.emulator import (
    AnthropicCachePolicy,
    Conversation,
    Emulator,
    OpenAICachePolicy,
    Reply,
    ScriptedCall,
    ToolLoopScript,
)
from foldline.providers.openai import parse_response as parse_openai
from foldline.providers.registry import ANTHROPIC_MESSAGES_V1, OPENAI_CHAT_V1

from .helpers import LONG_SYSTEM, PNG_3X2, FakeClock, image_block, request, user

TRANSCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "emulator" / "transcript.jsonl"
UPDATE = os.environ.get("FOLDLINE_UPDATE_GOLDEN") == "1"
VERSION = {"anthropic-version": "2023-06-01"}
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
PNG_B64 = base64.b64encode(PNG_3X2).decode()


class Recorder:
    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def post(self, emulator: Emulator, case: str, api: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
        given = headers if headers is not None else (VERSION if api == "anthropic" else {})
        answer = emulator.handle("POST", PATHS[api], given, body)
        self.record(case, answer.status, answer.body, answer.content_type)
        return json.loads(answer.body)

    def record(self, case: str, status: int, body: bytes, content_type: str = "application/json") -> None:
        line = {"body": body.decode(), "case": case, "content_type": content_type, "status": status}
        self.lines.append(canonical_json(line))


def converse(
    rec: Recorder,
    emulator: Emulator,
    case: str,
    api: str,
    steps: int,
    *,
    history: list[Message] | None = None,
    system: str | None = LONG_SYSTEM,
    store: MemoryAttachmentStore | None = None,
    advance: Callable[[int], None] | None = None,
    **config: Any,
) -> list[Message]:
    """Drive a tool loop through the real serializer and response parser, recording every answer."""
    messages = history if history is not None else [user("Please inspect the repository.")]
    serializer = ANTHROPIC_MESSAGES_V1 if api == "anthropic" else OPENAI_CHAT_V1
    parse = parse_anthropic if api == "anthropic" else parse_openai
    for step in range(steps):
        if advance is not None:
            advance(step)
        req = request(tuple(messages), system=system, provider=api, **{"max_tokens": 400, **config})
        payload = rec.post(emulator, f"{case}/{step}", api, serializer.serialize(req, store))
        if "error" in payload:
            break
        answer = parse(payload)
        messages.append(Message("assistant", answer.content))
        calls = [b for b in answer.content if isinstance(b, ToolCallBlock)]
        for c in calls:
            messages.append(Message("tool", (ToolResultBlock(c.id, (TextBlock(f"result {c.arguments}"),)),)))
        if not calls:
            messages.append(user(f"Follow-up question {step}."))
    return messages


class TickingClock:
    """A clock that moves on at every reading, so the answers show how often the emulator reads it."""

    def __init__(self, step: float, now: float = 1_800_000_000.0) -> None:
        self.step = step
        self.now = now

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Wide:
    """Twelve calls at once: more new blocks than the lookback window holds."""

    def reply(self, conversation: Conversation) -> Reply:
        if conversation.turns[-1].role == "user" and len(conversation.turns) > 2:
            return Reply("done")
        return Reply(None, tuple(ScriptedCall("list_dir", {"path": f"d{i}"}) for i in range(12)))


class Unknown:
    def reply(self, conversation: Conversation) -> Reply:
        return Reply("x", (ScriptedCall("no_such_tool", {}),))


def conversations(rec: Recorder) -> None:
    for api in ("anthropic", "openai"):
        clock = FakeClock()
        emulator = Emulator(clock=clock)
        store = MemoryAttachmentStore()
        first = [Message("user", (TextBlock("What is in this image?"), image_block(store)))]
        history = converse(rec, emulator, f"{api}/image-loop", api, 6, history=first, store=store)
        converse(
            rec,
            emulator,
            f"{api}/other-system",
            api,
            1,
            history=list(history),
            store=store,
            system=LONG_SYSTEM + " Brief.",
        )
        converse(rec, emulator, f"{api}/other-model", api, 1, history=list(history), store=store, model="model-y")

        def later(step: int, by: float = 299.0, clock: FakeClock = clock) -> None:
            clock.now += by

        history = converse(rec, emulator, f"{api}/refreshed", api, 2, history=history, store=store, advance=later)
        clock.now += 301
        converse(rec, emulator, f"{api}/expired", api, 1, history=history, store=store)
        converse(rec, emulator, f"{api}/short", api, 3, system="Short.")
        converse(rec, emulator, f"{api}/three-rounds", api, 5, history=[user("Another task.")], temperature=0.5)
        scripted = Emulator(ToolLoopScript(tool_steps=1, calls_per_step=3), clock=FakeClock())
        converse(rec, scripted, f"{api}/three-calls", api, 3)
        converse(rec, Emulator(Wide(), clock=FakeClock()), f"{api}/wide", api, 3)
        converse(rec, Emulator(clock=FakeClock(), api_key="k"), f"{api}/unauthorized", api, 1, history=[user("x")])
        plain = [user("hello there, tool user")]
        converse(
            rec, Emulator(clock=FakeClock()), f"{api}/stop", api, 1, history=list(plain), tools=None, stop=("tool",)
        )
        converse(rec, Emulator(clock=FakeClock()), f"{api}/cut", api, 1, history=list(plain), tools=None, max_tokens=3)
        converse(rec, Emulator(Unknown(), clock=FakeClock()), f"{api}/unknown-tool", api, 1)
    for api in ("anthropic", "openai"):
        converse(rec, Emulator(clock=TickingClock(160.0)), f"{api}/ticking-clock", api, 4)
    low = Emulator(
        clock=FakeClock(),
        anthropic_cache=AnthropicCachePolicy(min_tokens=64, ttl_seconds=10, lookback_blocks=40),
        openai_cache=OpenAICachePolicy(min_tokens=64, granularity=16, ttl_seconds=10),
    )
    for api in ("anthropic", "openai"):
        converse(rec, low, f"{api}/low-policy", api, 4, system="Short.")
        converse(
            rec, Emulator(Wide(), clock=FakeClock(), anthropic_cache=low.anthropic_cache), f"{api}/wide-low", api, 3
        )


def anthropic_bodies() -> dict[str, Any]:
    base: dict[str, Any] = {"max_tokens": 50, "model": "m", "messages": [{"content": "hi", "role": "user"}]}
    tool: dict[str, Any] = {"input_schema": {"properties": {"p": {"type": "string"}}, "type": "object"}, "name": "f"}
    call: dict[str, Any] = {
        "content": [{"id": "c1", "input": {"p": "x"}, "name": "f", "type": "tool_use"}],
        "role": "assistant",
    }
    image: dict[str, Any] = {"source": {"data": PNG_B64, "media_type": "image/png", "type": "base64"}, "type": "image"}
    hour = {"ttl": "1h", "type": "ephemeral"}
    eph = {"type": "ephemeral"}

    def result(**extra: Any) -> dict[str, Any]:
        return {"content": [{"tool_use_id": "c1", "type": "tool_result", **extra}], "role": "user"}

    def msgs(*items: Any) -> dict[str, Any]:
        return {**base, "messages": [base["messages"][0], *items]}

    return {
        "ok/system-string": {**base, "system": "Be kind.", "stop_sequences": ["x"], "temperature": 1},
        "ok/system-blocks-1h": {
            **base,
            "system": [{"cache_control": hour, "text": "A" * 5000, "type": "text"}, {"text": "B", "type": "text"}],
            "tools": [{**tool, "cache_control": eph, "description": "d"}],
            "cache_control": hour,
        },
        "ok/result-string-error": {**msgs(call, result(content="boom", is_error=True)), "tools": [tool]},
        "ok/result-empty-string": {**msgs(call, result(content="")), "tools": [tool]},
        "ok/result-image": {**msgs(call, result(content=[{"text": "t", "type": "text"}, image])), "tools": [tool]},
        "ok/user-image-marked": {
            **base,
            "messages": [{"content": [{**image, "cache_control": eph}, {"text": "?", "type": "text"}], "role": "user"}],
        },
        "ok/thinking-and-metadata": {**base, "metadata": {}, "thinking": {}, "top_k": 1},
        "bad/not-object": [],
        "bad/extra-top": {**base, "tool_config": 1},
        "bad/stream-not-bool": {**base, "stream": "yes"},
        "bad/model": {**base, "model": 1},
        "bad/max-tokens-missing": {k: v for k, v in base.items() if k != "max_tokens"},
        "bad/max-tokens-bool": {**base, "max_tokens": True},
        "bad/stop-not-list": {**base, "stop_sequences": "x"},
        "bad/stop-item": {**base, "stop_sequences": [1]},
        "bad/temperature": {**base, "temperature": 1.5},
        "bad/tools-not-list": {**base, "tools": {}},
        "bad/tool-extra": {**base, "tools": [{**tool, "strict": True}]},
        "bad/tool-schema-type": {**base, "tools": [{**tool, "input_schema": {"type": "array"}}]},
        "bad/tool-duplicate": {**base, "tools": [tool, tool]},
        "bad/tool-cache-type": {**base, "tools": [{**tool, "cache_control": {"type": "permanent"}}]},
        "bad/tool-cache-ttl": {**base, "tools": [{**tool, "cache_control": {"ttl": "2h", "type": "ephemeral"}}]},
        "bad/tool-cache-extra": {**base, "tools": [{**tool, "cache_control": {"scope": 1, "type": "ephemeral"}}]},
        "bad/system-type": {**base, "system": [{"text": "x", "type": "image"}]},
        "bad/system-extra": {**base, "system": [{"text": "x", "type": "text", "x": 1}]},
        "bad/system-not-list": {**base, "system": 3},
        "bad/messages-empty": {**base, "messages": []},
        "bad/messages-missing": {k: v for k, v in base.items() if k != "messages"},
        "bad/message-extra": {**base, "messages": [{"content": "hi", "name": "n", "role": "user"}]},
        "bad/role": {**base, "messages": [{"content": "hi", "role": "system"}]},
        "bad/empty-content": {**base, "messages": [{"content": [], "role": "user"}]},
        "bad/empty-text": {**base, "messages": [{"content": [{"text": "", "type": "text"}], "role": "user"}]},
        "bad/block-type": {**base, "messages": [{"content": [{"text": "x", "type": "txt"}], "role": "user"}]},
        "bad/text-extra": {**base, "messages": [{"content": [{"text": "x", "type": "text", "c": 1}], "role": "user"}]},
        "bad/tool-use-in-user": {**base, "messages": [{"content": call["content"], "role": "user"}]},
        "bad/tool-use-input": {**msgs({"content": [{**call["content"][0], "input": [1]}], "role": "assistant"})},
        "bad/tool-use-extra": {**msgs({"content": [{**call["content"][0], "x": 1}], "role": "assistant"})},
        "bad/result-in-assistant": {**msgs({"content": result()["content"], "role": "assistant"})},
        "bad/result-orphan": {**base, "messages": [result()]},
        "bad/result-extra": {**msgs(call, result(x=1)), "tools": [tool]},
        "bad/result-inner-type": {**msgs(call, result(content=[{"type": "document"}])), "tools": [tool]},
        "bad/image-in-assistant": {**msgs({"content": [image], "role": "assistant"})},
        "bad/image-url-source": {
            **base,
            "messages": [{"content": [{**image, "source": {"type": "url", "url": "u"}}], "role": "user"}],
        },
        "bad/image-base64": {
            **base,
            "messages": [{"content": [{**image, "source": {**image["source"], "data": "!!"}}], "role": "user"}],
        },
        "bad/image-media-type": {
            **base,
            "messages": [
                {"content": [{**image, "source": {**image["source"], "media_type": "image/gif"}}], "role": "user"}
            ],
        },
        "bad/five-breakpoints": {
            **base,
            "messages": [
                {"content": [{"cache_control": eph, "text": str(i), "type": "text"} for i in range(5)], "role": "user"}
            ],
        },
    }


def openai_bodies() -> dict[str, Any]:
    base: dict[str, Any] = {"messages": [{"content": "hi", "role": "user"}], "model": "m"}
    tool: dict[str, Any] = {
        "function": {"name": "f", "parameters": {"properties": {}, "type": "object"}},
        "type": "function",
    }
    call: dict[str, Any] = {"function": {"arguments": "{}", "name": "f"}, "id": "c1", "type": "function"}
    image: dict[str, Any] = {
        "image_url": {"detail": "low", "url": f"data:image/png;base64,{PNG_B64}"},
        "type": "image_url",
    }

    def with_messages(*items: Any) -> dict[str, Any]:
        return {**base, "messages": list(items)}

    hi = base["messages"][0]
    return {
        "ok/developer-and-parts": with_messages(
            {"content": "sys", "role": "developer"},
            {"content": [{"text": "a", "type": "text"}, image], "name": "u", "role": "user"},
            {"content": [{"text": "b", "type": "text"}, {"text": "c", "type": "text"}], "role": "assistant"},
            {"content": "late system", "role": "system"},
            {"content": "more", "role": "user"},
        ),
        "ok/raw-arguments": {
            **with_messages(
                hi,
                {"role": "assistant", "tool_calls": [{**call, "function": {"arguments": "not json", "name": "f"}}]},
                {"content": [{"text": "r", "type": "text"}], "role": "tool", "tool_call_id": "c1"},
            ),
            "tools": [tool, {"function": {"name": "g"}, "type": "function"}],
            "stop": "zz",
            "max_tokens": 30,
            "temperature": 2,
        },
        "ok/stop-list": {**base, "stop": ["a", ""], "max_completion_tokens": 5, "seed": 1, "n": 1},
        "bad/extra-top": {**base, "max_output_tokens": 5},
        "bad/stream-options-without-stream": {**base, "stream_options": {"include_usage": True}},
        "bad/model": {**base, "model": None},
        "bad/limit": {**base, "max_completion_tokens": 0},
        "bad/stop-item": {**base, "stop": [1]},
        "bad/temperature": {**base, "temperature": 3},
        "bad/tool-type": {**base, "tools": [{**tool, "type": "functional"}]},
        "bad/tool-extra": {**base, "tools": [{**tool, "x": 1}]},
        "bad/function-extra": {**base, "tools": [{"function": {"name": "f", "x": 1}, "type": "function"}]},
        "bad/messages-empty": {**base, "messages": []},
        "bad/role": {**base, "messages": [{"content": "hi", "role": "robot"}]},
        "bad/user-extra": {**base, "messages": [{"content": "hi", "role": "user", "x": 1}]},
        "bad/system-image": with_messages({"content": [image], "role": "system"}, hi),
        "bad/part-type": {**base, "messages": [{"content": [{"type": "audio"}], "role": "user"}]},
        "bad/part-extra": {**base, "messages": [{"content": [{"text": "a", "type": "text", "x": 1}], "role": "user"}]},
        "bad/image-url": {
            **base,
            "messages": [{"content": [{"image_url": {"url": "https://x/y.png"}, "type": "image_url"}], "role": "user"}],
        },
        "bad/image-base64": {
            **base,
            "messages": [
                {"content": [{"image_url": {"url": "data:image/png;base64,!!"}, "type": "image_url"}], "role": "user"}
            ],
        },
        "bad/image-extra": {
            **base,
            "messages": [{"content": [{"image_url": {"url": "u", "x": 1}, "type": "image_url"}], "role": "user"}],
        },
        "bad/empty-parts": {**base, "messages": [{"content": [], "role": "user"}]},
        "bad/assistant-empty": with_messages(hi, {"content": None, "role": "assistant"}),
        "bad/call-extra": with_messages(hi, {"role": "assistant", "tool_calls": [{**call, "x": 1}]}),
        "bad/call-function-extra": with_messages(
            hi, {"role": "assistant", "tool_calls": [{**call, "function": {**call["function"], "x": 1}}]}
        ),
        "bad/call-arguments": with_messages(
            hi, {"role": "assistant", "tool_calls": [{**call, "function": {"arguments": {}, "name": "f"}}]}
        ),
        "bad/tool-orphan": with_messages(hi, {"content": "r", "role": "tool", "tool_call_id": "x"}),
        "bad/tool-extra-key": with_messages(
            hi,
            {"role": "assistant", "tool_calls": [call]},
            {"content": "r", "role": "tool", "tool_call_id": "c1", "x": 1},
        ),
        "bad/tool-image": with_messages(
            hi, {"role": "assistant", "tool_calls": [call]}, {"content": [image], "role": "tool", "tool_call_id": "c1"}
        ),
        "bad/unanswered-then-user": with_messages(hi, {"role": "assistant", "tool_calls": [call]}, hi),
        "bad/unanswered-at-end": with_messages(hi, {"role": "assistant", "tool_calls": [call]}),
    }


def exchanges() -> list[bytes]:
    rec = Recorder()
    conversations(rec)
    for api, bodies in (("anthropic", anthropic_bodies()), ("openai", openai_bodies())):
        for name, body in bodies.items():
            rec.post(Emulator(clock=FakeClock()), f"{api}/body/{name}", api, canonical_json(body))
    clock = FakeClock()
    long_lived = Emulator(clock=clock)
    for advance in (0, 1000, 3000, 3601):
        clock.now += advance
        body = canonical_json(anthropic_bodies()["ok/system-blocks-1h"])
        rec.post(long_lived, f"anthropic/one-hour/{advance}", "anthropic", body)
    emulator = Emulator(clock=FakeClock(), api_key="key")
    ok = canonical_json(anthropic_bodies()["ok/system-string"])
    rec.post(emulator, "route/anthropic-no-version", "anthropic", ok, {"x-api-key": "key"})
    rec.post(emulator, "route/anthropic-bad-json", "anthropic", b"{not json", {**VERSION, "x-api-key": "key"})
    rec.post(emulator, "route/anthropic-key", "anthropic", ok, {**VERSION, "X-Api-Key": "key"})
    rec.post(
        emulator,
        "route/openai-bearer",
        "openai",
        canonical_json(openai_bodies()["ok/stop-list"]),
        {"Authorization": "Bearer key"},
    )
    rec.post(emulator, "route/openai-wrong-key", "openai", b"{}", {"authorization": "Bearer nope"})
    for method, path in (("POST", "/v1/other"), ("GET", "/v1/messages"), ("GET", "/v1/chat/completions")):
        answer = Emulator().handle(method, path, {}, b"{}")
        rec.record(f"route/{method} {path}", answer.status, answer.body, answer.content_type)
    return rec.lines


def test_the_emulator_answers_exactly_as_the_committed_transcript() -> None:
    lines = exchanges()
    text = b"\n".join(lines) + b"\n"
    if UPDATE:
        TRANSCRIPT.parent.mkdir(parents=True, exist_ok=True)
        TRANSCRIPT.write_bytes(text)
    expected = TRANSCRIPT.read_bytes().splitlines()
    assert len(lines) == len(expected)
    for got, want in zip(lines, expected, strict=True):
        assert json.loads(got) == json.loads(want)
    assert text == TRANSCRIPT.read_bytes()
