"""Wire serialization throughput (issue 3 target: >= 200 MB/s) for a realistic 200-message request.

The request: a ~4 KB system prompt, 5 tools, and 200 messages of an agent session — user questions,
assistant text with tool calls, ~1.5 KB tool results. Throughput is body bytes / wall time of
``serializer.serialize(request, None)``, best of several rounds, for both serializers. The serializers are
stateless (no per-message byte cache): every call encodes the whole request, exactly as ``foldline verify``
and the invariant companion do, so this one figure covers the loop and replay alike.

    python -m benchmarks.bench_serialize
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from foldline.core import (
    CallConfig,
    GenerateOptions,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolSpec,
    build_request,
    make_header,
)
from foldline.core.projection import Message
from foldline.providers import AnthropicMessagesSerializer, OpenAIChatSerializer
from foldline.providers.base import Serializer

TARGET_MB_S = 200.0
MESSAGES = 200


def _text(seed: int, size: int) -> str:
    words = ("fold", "line", "event", "prefix", "cache", "request", "header", "session", "tool", "result")
    out: list[str] = []
    n = 0
    while n < size:
        w = words[(seed * 7 + len(out) * 3) % len(words)]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def _messages(count: int) -> list[Message]:
    """A session: cycles of user question, two tool rounds, text answer; ends on a tool round."""
    out: list[Message] = []
    i = 0

    def tool_round() -> None:
        arguments = json.dumps({"path": f"src/module_{i}.py", "limit": 200, "pattern": _text(i, 40)})
        out.append(Message("assistant", (TextBlock(_text(i, 200)), ToolCallBlock(f"call_{i}", "read_file", arguments))))
        out.append(Message("tool", (ToolResultBlock(f"call_{i}", (TextBlock(_text(i, 1500)),)),)))

    while len(out) < count - 2:
        out.append(Message("user", (TextBlock(_text(i, 300)),)))
        tool_round()
        tool_round()
        out.append(Message("assistant", (TextBlock(_text(i, 400)),)))
        i += 1
    del out[count - 2 :]
    tool_round()
    return out


def _header_tools() -> list[ToolSpec]:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}, "pattern": {"type": "string"}},
        "required": ["path"],
    }
    return [ToolSpec(name, _text(k, 200), schema) for k, name in enumerate(("read_file", "grep", "ls", "edit", "run"))]


def realistic_request() -> GenerateOptions:
    messages = _messages(MESSAGES)
    assert len(messages) == MESSAGES
    header = make_header(CallConfig("anthropic", "model-x", max_tokens=1024), _text(1, 4000), _header_tools())
    return build_request(tuple(messages), header)


def _best_mb_s(work: Callable[[], int], rounds: int = 7, min_seconds: float = 0.05) -> float:
    best = 0.0
    for _ in range(rounds):
        done = 0
        start = time.perf_counter()
        while True:
            done += work()
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = max(best, done / elapsed / 1e6)
    return best


def measure(serializer: Serializer) -> tuple[float, int]:
    """(best MB/s, body bytes) for the realistic request."""
    request = realistic_request()
    size = len(serializer.serialize(request, None))

    def once() -> int:
        return len(serializer.serialize(request, None))

    return _best_mb_s(once), size


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for serializer in (AnthropicMessagesSerializer(), OpenAIChatSerializer()):
        mb_s, size = measure(serializer)
        rows.append(
            {
                "name": f"{serializer.name} v{serializer.version}: 200-message request ({size / 1024:.0f} KB)",
                "value": round(mb_s, 1),
                "unit": "MB/s",
                "target": f">= {TARGET_MB_S:.0f} MB/s",
                "ok": mb_s >= TARGET_MB_S,
            }
        )
    return rows


if __name__ == "__main__":
    for row in run():
        mark = "ok" if row["ok"] else "MISSED"
        print(f"{row['value']:>8} {row['unit']}  (target {row['target']})  {mark}  {row['name']}")
