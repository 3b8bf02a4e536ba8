"""An independent reconstructor written from docs/FORMAT.md alone (§1, §3, §5, §9): it imports nothing of foldline.

Given a session's events (their canonical JSON bytes; sealed ones are opened with the session's data key, §3.5)
and a directory of attachment objects, it folds the log,
rebuilds every loop request and every compaction summarize body, serializes each with the logged serializer
version, and reports the SHA-256 digest and length of each — to be compared with ``request/dispatch`` and
``compaction/summary.inputDigest``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

Json = Any

# ---------------------------------------------------------------------------- §1 canonical JSON

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _float(x: float) -> str:
    if x == 0 or 1e-5 <= abs(x) < 1e16:
        text = repr(x)
        if "e" in text or "E" in text:  # repr uses exponents below 1e-4; write positionally
            digits, _, exp = repr(x).partition("e")
            sign = "-" if digits.startswith("-") else ""
            digits = digits.lstrip("-").replace(".", "")
            shift = int(exp)
            text = sign + "0." + "0" * (-shift - 1) + digits.rstrip("0")
        return text if "." in text else text + ".0"
    mantissa, _, exp = repr(x).partition("e")
    if not exp:
        mantissa, exp = f"{x:.17e}".partition("e")[0], f"{x:.17e}".partition("e")[2]
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    e = int(exp)
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


class Ordered(dict):  # type: ignore[type-arg]
    """An ordered value (§1.9): written with its keys in document order, and every object inside it too."""


def canonical(value: Json, ordered: bool = False) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError("NaN and infinities are not representable")
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical(v, ordered) for v in value) + "]"
    if isinstance(value, dict):
        ordered = ordered or isinstance(value, Ordered)
        keys = list(value) if ordered else sorted(value)
        return "{" + ",".join(_string(k) + ":" + canonical(value[k], ordered) for k in keys) + "}"
    raise TypeError(f"not JSON: {type(value).__name__}")


def mark_ordered(event: dict[str, Any]) -> dict[str, Any]:
    """§1.9 / §3.4: each tool's ``inputSchema`` in a ``request/header`` is an ordered value (``json.loads`` keeps the
    document order of the text)."""
    if event["type"] == "request/header":
        header = event["data"]["header"]
        for tool in header.get("tools", []):
            tool["inputSchema"] = Ordered(tool["inputSchema"])
        if "outputSchema" in header["config"]:
            header["config"]["outputSchema"] = Ordered(header["config"]["outputSchema"])
    return event


def body_bytes(value: Json) -> bytes:
    return canonical(value).encode("utf-8")


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- §5 the folds


@dataclass
class Fold:
    surface: list[dict[str, Any]]  # the visible surface events (their data), in order
    header: dict[str, Any] | None = None

    def messages(self) -> list[dict[str, Any]]:
        out = []
        for data in self.surface:
            if data.get("role") in ("user", "assistant"):
                out.append({"role": data["role"], "content": data["content"]})
            else:
                block: dict[str, Any] = {
                    "type": "tool-result",
                    "toolCallId": data["callId"],
                    "content": data["content"],
                }
                if data.get("isError"):
                    block["isError"] = True
                out.append({"role": "tool", "content": [block]})
        return out


SURFACE = {"user/message", "assistant/message", "tool/result"}


def apply(fold: Fold, event: dict[str, Any]) -> None:
    kind, data = event["type"], event["data"]
    if kind == "request/header":
        fold.header = data["header"]
    elif kind in SURFACE:
        op = data["surfaceOp"]
        if op == "append":
            fold.surface.append(data)
        else:
            fold.surface[op["start"] : op["end"] + 1] = [data]


# ---------------------------------------------------------------------------- §9.0 shared pieces


def tool_input(arguments: str) -> dict[str, Json]:
    """§9.1 "Arguments → input": the JSON object of a tool call's raw arguments, by the number and key rules. Its
    keys are in the order they first appear in the text, a repeated key with its last value (§9.8: what v4
    writes); every earlier version sorts them."""

    def constant(name: str) -> Json:
        raise Refused(f"arguments hold {name}, which is not JSON")

    def number(text: str) -> float:
        value = float(text)
        if math.isinf(value):
            raise Refused(f"arguments hold {text[:20]}, beyond the double range")
        return value

    def integer(text: str) -> int | float:
        value = int(text)
        if -(2**63) <= value <= 2**64 - 1:
            return value
        try:
            return float(value)
        except OverflowError:
            raise Refused(f"arguments hold an integer of {len(text)} digits, beyond the double range") from None

    try:
        value = json.loads(arguments, parse_constant=constant, parse_float=number, parse_int=integer)
    except ValueError as exc:
        raise Refused(f"arguments are not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise Refused("arguments are not an object")
    return value


class Refused(Exception):
    """The serializer refuses the request (§9.0)."""


class Objects:
    """Attachment objects in the filesystem store's layout (§6), verified on every read (§3.3)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def base64(self, ref: dict[str, Any]) -> str:
        if self.root is None:
            raise Refused("an image needs the attachment objects")
        hexdigest = ref["attachmentId"].removeprefix("sha256:")
        data = (self.root / "objects" / hexdigest[:2] / hexdigest).read_bytes()
        if hashlib.sha256(data).hexdigest() != hexdigest or len(data) != ref["bytes"]:
            raise Refused(f"attachment {ref['attachmentId']} is corrupt")
        return base64.b64encode(data).decode("ascii")


def schema(tool: dict[str, Any], ordered: bool) -> Any:
    """§9.0 "Tool schemas": sorted before §9.8, in document order from it; the empty one is ours, sorted."""
    if not tool["inputSchema"]:
        return {"properties": {}, "type": "object"}
    return Ordered(tool["inputSchema"]) if ordered else dict(tool["inputSchema"])


def data_url(ref: dict[str, Any], objects: Objects) -> str:
    return f"data:{ref['mediaType']};base64,{objects.base64(ref)}"


REASONING = {"reasoning", "redacted-reasoning", "encrypted-reasoning"}


# ---------------------------------------------------------------------------- §9.1 / §9.2 Anthropic Messages


def anthropic(version: int, header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects) -> Json:
    """v1, v2 (§9.2, also what v3 extends) and v4 (v2's rules with §9.8's key order; its streaming is §9.7's)."""
    config = header["config"]
    ordered = version == 4
    marker: dict[str, Any] = {"type": "ephemeral"}
    if version >= 2 and "cacheTtl" in config:
        if config["cacheTtl"] not in ("5m", "1h"):
            raise Refused("cacheTtl")
        marker["ttl"] = config["cacheTtl"]
    if version >= 2 and "maxTokens" not in config:
        raise Refused("maxTokens is required")
    body: dict[str, Any] = {
        "cache_control": marker,
        "max_tokens": config.get("maxTokens", 1024),
        "model": config["model"],
    }
    if "stop" in config:
        body["stop_sequences"] = config["stop"]
    if "system" in header:
        body["system"] = [{"cache_control": marker, "text": header["system"], "type": "text"}]
    if "temperature" in config:
        if config["temperature"] > 1.0:
            raise Refused("temperature")
        body["temperature"] = config["temperature"]
    if "tools" in header:
        tools = []
        for k, tool in enumerate(header["tools"]):
            t: dict[str, Any] = {"input_schema": schema(tool, ordered), "name": tool["name"]}
            if tool["description"]:
                t["description"] = tool["description"]
            if k == len(header["tools"]) - 1:
                t["cache_control"] = marker
            tools.append(t)
        body["tools"] = tools
    if version >= 2:
        effort = config.get("reasoningEffort")
        if "thinkingBudget" in config:
            if effort == "off" or config["thinkingBudget"] >= config["maxTokens"]:
                raise Refused("thinkingBudget")
            body["thinking"] = {"budget_tokens": config["thinkingBudget"], "type": "enabled"}
        elif effort == "off":
            body["thinking"] = {"type": "disabled"}
        elif effort is not None:
            body["thinking"] = {"type": "adaptive"}
        if effort not in (None, "off"):
            if effort not in ("low", "medium", "high", "xhigh", "max"):
                raise Refused("effort")
            body["output_config"] = {"effort": effort}

    def image(ref: dict[str, Any]) -> dict[str, Any]:
        return {
            "source": {"data": objects.base64(ref), "media_type": ref["mediaType"], "type": "base64"},
            "type": "image",
        }

    def block(b: dict[str, Any], role: str) -> dict[str, Any] | None:
        kind = b["type"]
        if kind == "text":
            return {"text": b["text"], "type": "text"} if b["text"] else None
        if kind == "image":
            if role == "assistant":
                raise Refused("image in an assistant message")
            return image(b["attachment"])
        if kind == "tool-call":
            if role != "assistant":
                raise Refused("tool call outside an assistant message")
            arguments = tool_input(b["arguments"])
            return {
                "id": b["id"],
                "input": Ordered(arguments) if ordered else arguments,
                "name": b["name"],
                "type": "tool_use",
            }
        if kind == "tool-result":
            if role == "assistant":
                raise Refused("tool result in an assistant message")
            out: dict[str, Any] = {"tool_use_id": b["toolCallId"], "type": "tool_result"}
            items = [
                {"text": p["text"], "type": "text"} if p["type"] == "text" else image(p["attachment"])
                for p in b["content"]
                if p["type"] != "text" or p["text"]
            ]
            if items:
                out["content"] = items
            if b.get("isError"):
                out["is_error"] = True
            return out
        assert kind in REASONING
        if version == 1:
            return None
        if role != "assistant":
            raise Refused("reasoning outside an assistant message")
        if kind == "reasoning":
            signature = b.get("signature")
            return None if signature is None else {"signature": signature, "thinking": b["text"], "type": "thinking"}
        if kind == "redacted-reasoning":
            return {"data": b["data"], "type": "redacted_thinking"}
        return None

    wire: list[dict[str, Any]] = []
    for m in messages:
        role = "assistant" if m["role"] == "assistant" else "user"
        blocks = [x for x in (block(b, m["role"]) for b in m["content"]) if x is not None]
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"content": blocks, "role": role})
    body["messages"] = wire
    return body


# ---------------------------------------------------------------------------- §9.3 / §9.5 Chat Completions


def chat(
    reasoning_chat: bool, header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects, version: int = 1
) -> Json:
    """openai-chat v1 (§9.3) and v3 (§9.8); reasoning-chat v1 (§9.5) and v3 (§9.9). Streaming is §9.7's."""
    config = header["config"]
    ordered = version == 3
    documented = reasoning_chat and version == 3  # §9.9: DeepSeek's documented content shapes and switch

    def joined(items: list[str]) -> str:
        return "\n\n".join(t for t in items if t)

    body: dict[str, Any] = {"model": config["model"]}
    if "maxTokens" in config:
        body["max_tokens" if reasoning_chat else "max_completion_tokens"] = config["maxTokens"]
    if "temperature" in config:
        body["temperature"] = config["temperature"]
    if "stop" in config:
        body["stop"] = config["stop"]
    effort = config.get("reasoningEffort")
    if reasoning_chat:
        if effort == "off":
            body["thinking"] = {"type": "disabled"}
        elif effort is not None:
            body["reasoning_effort"] = effort
            if documented:
                body["thinking"] = {"type": "enabled"}
    elif effort is not None:
        body["reasoning_effort"] = "none" if effort == "off" else effort
    if "tools" in header:
        functions = []
        for tool in header["tools"]:
            f: dict[str, Any] = {"name": tool["name"], "parameters": schema(tool, ordered)}
            if tool["description"]:
                f["description"] = tool["description"]
            functions.append({"function": f, "type": "function"})
        body["tools"] = functions

    def image(ref: dict[str, Any]) -> dict[str, Any]:
        return {"image_url": {"url": data_url(ref, objects)}, "type": "image_url"}

    def texts(items: list[str]) -> Any:
        return items[0] if len(items) == 1 else [{"text": t, "type": "text"} for t in items]

    wire: list[dict[str, Any]] = []
    if "system" in header:
        wire.append({"content": header["system"], "role": "system"})
    pending: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] != "tool" and pending:
            wire.append({"content": pending, "role": "user"})
            pending = []
        if m["role"] == "user":
            parts = []
            for b in m["content"]:
                if b["type"] == "text":
                    parts.append({"text": b["text"], "type": "text"})
                elif b["type"] == "image":
                    parts.append(image(b["attachment"]))
                elif b["type"] not in REASONING:
                    raise Refused(f"{b['type']} in a user message")
            if len(parts) == 1 and parts[0]["type"] == "text":
                wire.append({"content": parts[0]["text"], "role": "user"})
            elif parts and documented and all(x["type"] == "text" for x in parts):
                wire.append({"content": joined([x["text"] for x in parts]), "role": "user"})
            elif parts:
                wire.append({"content": parts, "role": "user"})
        elif m["role"] == "assistant":
            said, calls, thoughts = [], [], []
            for b in m["content"]:
                if b["type"] == "text":
                    said.append(b["text"])
                elif b["type"] == "tool-call":
                    calls.append(
                        {
                            "function": {"arguments": b["arguments"], "name": b["name"]},
                            "id": b["id"],
                            "type": "function",
                        }
                    )
                elif b["type"] == "reasoning":
                    thoughts.append(b["text"])
                elif b["type"] not in REASONING:
                    raise Refused(f"{b['type']} in an assistant message")
            if not said and not calls:
                continue
            out: dict[str, Any] = {"role": "assistant"}
            if documented:
                out["content"] = joined(said) if said else None
            elif said:
                out["content"] = texts(said)
            if calls:
                out["tool_calls"] = calls
            if reasoning_chat and thoughts:
                out["reasoning_content"] = "".join(thoughts)
            wire.append(out)
        else:
            (result,) = m["content"]
            said = [p["text"] for p in result["content"] if p["type"] == "text"]
            content = joined(said) if documented else texts(said) if said else ""
            wire.append({"content": content, "role": "tool", "tool_call_id": result["toolCallId"]})
            images = [image(p["attachment"]) for p in result["content"] if p["type"] == "image"]
            if images:
                pending.append({"text": f"Images returned by tool call {result['toolCallId']}:", "type": "text"})
                pending.extend(images)
    if pending:
        wire.append({"content": pending, "role": "user"})
    body["messages"] = wire
    return body


# ---------------------------------------------------------------------------- §9.4 Responses


def responses(header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects, version: int = 1) -> Json:
    """v1 (§9.4) and v3 (§9.8); streaming is §9.7's."""
    config = header["config"]
    if "stop" in config:
        raise Refused("stop")
    body: dict[str, Any] = {"include": ["reasoning.encrypted_content"], "model": config["model"], "store": False}
    if "maxTokens" in config:
        body["max_output_tokens"] = config["maxTokens"]
    if "temperature" in config:
        body["temperature"] = config["temperature"]
    if "reasoningEffort" in config:
        effort = config["reasoningEffort"]
        body["reasoning"] = {"effort": "none"} if effort == "off" else {"effort": effort, "summary": "auto"}
    if "promptCacheKey" in config:
        body["prompt_cache_key"] = config["promptCacheKey"]
    if "cacheTtl" in config:
        retention = {"5m": "in_memory", "24h": "24h"}.get(config["cacheTtl"])
        if retention is None:
            raise Refused("cacheTtl")
        body["prompt_cache_retention"] = retention
    if "system" in header:
        body["instructions"] = header["system"]
    if "tools" in header:
        functions = []
        for tool in header["tools"]:
            f: dict[str, Any] = {
                "name": tool["name"],
                "parameters": schema(tool, version == 3),
                "strict": False,
                "type": "function",
            }
            if tool["description"]:
                f["description"] = tool["description"]
            functions.append(f)
        body["tools"] = functions

    def part(b: dict[str, Any]) -> dict[str, Any]:
        if b["type"] == "text":
            return {"text": b["text"], "type": "input_text"}
        return {"detail": "auto", "image_url": data_url(b["attachment"], objects), "type": "input_image"}

    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "user":
            if any(b["type"] not in ("text", "image") for b in m["content"]):
                raise Refused("user message block")
            if m["content"]:
                items.append({"content": [part(b) for b in m["content"]], "role": "user", "type": "message"})
        elif m["role"] == "assistant":
            for b in m["content"]:
                if b["type"] == "text":
                    if b["text"]:
                        items.append({"content": b["text"], "role": "assistant", "type": "message"})
                elif b["type"] == "tool-call":
                    items.append(
                        {"arguments": b["arguments"], "call_id": b["id"], "name": b["name"], "type": "function_call"}
                    )
                elif b["type"] == "encrypted-reasoning":
                    items.append(
                        {
                            "encrypted_content": b["encryptedContent"],
                            "id": b["id"],
                            "summary": [{"text": s, "type": "summary_text"} for s in b["summary"]],
                            "type": "reasoning",
                        }
                    )
                elif b["type"] not in ("reasoning", "redacted-reasoning"):
                    raise Refused("assistant message block")
        else:
            (result,) = m["content"]
            parts = result["content"]
            output: Any
            if not parts:
                output = ""
            elif len(parts) == 1 and parts[0]["type"] == "text":
                output = parts[0]["text"]
            else:
                output = [part(p) for p in parts]
            items.append({"call_id": result["toolCallId"], "output": output, "type": "function_call_output"})
    body["input"] = items
    return body


Serialize = Callable[[dict[str, Any], list[dict[str, Any]], Objects], Json]


# ---------------------------------------------------------------------------- §9.7 the streaming versions


def no_stream(base: Serialize) -> Serialize:
    """A version before streaming: a config that streams is refused."""

    def serialize(header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects) -> Json:
        if header["config"].get("stream"):
            raise Refused("this version predates streaming")
        return base(header, messages, objects)

    return serialize


def streaming(base: Serialize, fields: dict[str, Any]) -> Serialize:
    """The version ``base`` extends, plus ``fields`` at the top level when ``config.stream`` is true."""

    def serialize(header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects) -> Json:
        plain = {**header, "config": {k: v for k, v in header["config"].items() if k != "stream"}}
        body = base(plain, messages, objects)
        if header["config"].get("stream"):
            body.update(fields)
        return body

    return serialize


# ---------------------------------------------------------------------------- §9.10 structured output


def no_output(base: Serialize) -> Serialize:
    """A version before structured output: a config with an output schema is refused."""

    def serialize(header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects) -> Json:
        if "outputSchema" in header["config"]:
            raise Refused("this version predates structured output")
        return base(header, messages, objects)

    return serialize


def output_schema(config: dict[str, Any]) -> Any:
    """The logged schema in its document order; the empty object is sent as §9.0's empty tool schema."""
    return Ordered(config["outputSchema"]) if config["outputSchema"] else {"properties": {}, "type": "object"}


def structured(base: Serialize, kind: str) -> Serialize:
    """The version ``base`` extends, plus the output schema in the API's field (§9.10) when one is logged."""

    def serialize(header: dict[str, Any], messages: list[dict[str, Any]], objects: Objects) -> Json:
        config = header["config"]
        if "outputSchema" not in config:
            return base(header, messages, objects)
        plain = {**header, "config": {k: v for k, v in config.items() if k not in ("outputSchema", "outputName")}}
        name, schema_value = config["outputName"], output_schema(config)
        if kind == "json_object":
            instruction = f"Answer with one JSON object that matches this JSON Schema ({name}):\n" + canonical(
                schema_value
            )
            plain["system"] = f"{header['system']}\n\n{instruction}" if "system" in header else instruction
        body = base(plain, messages, objects)
        assert isinstance(body, dict)
        if kind == "output_config":
            body["output_config"] = {
                **body.get("output_config", {}),
                "format": {"schema": schema_value, "type": "json_schema"},
            }
        elif kind == "response_format":
            body["response_format"] = {
                "json_schema": {"name": name, "schema": schema_value, "strict": True},
                "type": "json_schema",
            }
        elif kind == "text":
            body["text"] = {"format": {"name": name, "schema": schema_value, "strict": True, "type": "json_schema"}}
        else:
            body["response_format"] = {"type": "json_object"}
        return body

    return serialize


USAGE_CHUNK = {"stream": True, "stream_options": {"include_usage": True}}
BEFORE_OUTPUT: dict[tuple[str, int], Serialize] = {
    ("anthropic-messages", 1): no_stream(lambda h, m, o: anthropic(1, h, m, o)),
    ("anthropic-messages", 2): no_stream(lambda h, m, o: anthropic(2, h, m, o)),
    ("anthropic-messages", 3): streaming(lambda h, m, o: anthropic(2, h, m, o), {"stream": True}),
    ("anthropic-messages", 4): streaming(lambda h, m, o: anthropic(4, h, m, o), {"stream": True}),
    ("openai-chat", 1): no_stream(lambda h, m, o: chat(False, h, m, o)),
    ("openai-chat", 2): streaming(lambda h, m, o: chat(False, h, m, o), USAGE_CHUNK),
    ("openai-chat", 3): streaming(lambda h, m, o: chat(False, h, m, o, 3), USAGE_CHUNK),
    ("reasoning-chat", 1): no_stream(lambda h, m, o: chat(True, h, m, o)),
    ("reasoning-chat", 2): streaming(lambda h, m, o: chat(True, h, m, o), USAGE_CHUNK),
    ("reasoning-chat", 3): streaming(lambda h, m, o: chat(True, h, m, o, 3), USAGE_CHUNK),
    ("openai-responses", 1): no_stream(responses),
    ("openai-responses", 2): streaming(responses, {"stream": True}),
    ("openai-responses", 3): streaming(lambda h, m, o: responses(h, m, o, 3), {"stream": True}),
}
STRUCTURED = {
    ("anthropic-messages", 5): (("anthropic-messages", 4), "output_config"),
    ("openai-chat", 4): (("openai-chat", 3), "response_format"),
    ("openai-responses", 4): (("openai-responses", 3), "text"),
    ("reasoning-chat", 4): (("reasoning-chat", 3), "json_object"),
}
SERIALIZERS: dict[tuple[str, int], Serialize] = {key: no_output(s) for key, s in BEFORE_OUTPUT.items()}
SERIALIZERS.update({key: structured(BEFORE_OUTPUT[base], kind) for key, (base, kind) in STRUCTURED.items()})

# ---------------------------------------------------------------------------- §9.6 the summarize body

SUMMARIZE_V1 = (
    "You compress the earlier part of an agent conversation so the agent can continue without it. Write a faithful "
    "summary: the user's requests, the facts established (quote tool results that matter exactly, with their call "
    "ids), decisions taken and open questions. Do not add anything that is not in the transcript. Images in the "
    "transcript are part of it; describe what matters about them.",
    "Summarize the conversation above as instructed.",
)


def transcript(region: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    lines: list[str] = []

    def flush() -> None:
        if lines:
            out.append({"type": "text", "text": "\n".join(lines)})
            lines.clear()

    for m in region:
        for b in m["content"]:
            if b["type"] == "text":
                lines.append(f"{m['role']}: {b['text']}")
            elif b["type"] == "image":
                lines.append(f"{m['role']}: [image]")
                flush()
                out.append(b)
            elif b["type"] == "tool-call":
                lines.append(f"{m['role']} calls {b['name']} {b['arguments']} (call {b['id']})")
            elif b["type"] == "tool-result":
                lines.append(f"tool {'error' if b.get('isError') else 'result'} for call {b['toolCallId']}:")
                for p in b["content"]:
                    if p["type"] == "text":
                        lines.append(p["text"])
                    else:
                        lines.append("[image]")
                        flush()
                        out.append(p)
    lines.append("")
    lines.append(instruction)
    flush()
    return out


# ---------------------------------------------------------------------------- §3.5 sealed content


class Opener:
    """Opens the sealed content of one session's events (§3.5) with its data keys (key id -> 32 bytes)."""

    def __init__(self, session: str, keys: Mapping[str, bytes]) -> None:
        self.session = session
        self.keys = keys

    def open(self, event: dict[str, Any]) -> dict[str, Any]:
        sealed = event.pop("sealed", None)
        if sealed is None:
            return event
        assert sealed["v"] == 1, "only sealing version 1 is in FORMAT.md"
        aead = AESGCM(self.keys[sealed["kid"]])
        head = [self.session, sealed["kid"], event["seq"], event["type"]]

        def plain(token: str, path: str) -> bytes:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            aad = body_bytes(["foldline-sealed", 1, *head, path])
            return aead.decrypt(raw[:12], raw[12:], aad)

        def text(holder: dict[str, Any], key: str, path: str) -> None:
            if key in holder:
                holder[key] = plain(holder[key], f"{path}{key}").decode("utf-8")

        def block(b: dict[str, Any], path: str) -> None:
            kind = b["type"]
            if kind == "text":
                text(b, "text", path)
            elif kind == "tool-call":
                text(b, "arguments", path)
            elif kind == "reasoning":
                text(b, "text", path)
                text(b, "signature", path)
            elif kind == "redacted-reasoning":
                text(b, "data", path)
            elif kind == "encrypted-reasoning":
                b["summary"] = [plain(t, f"{path}summary[{i}]").decode() for i, t in enumerate(b["summary"])]
                text(b, "encryptedContent", path)
            elif kind == "image":
                text(b["attachment"], "name", f"{path}attachment.")
            elif kind == "tool-result":
                for i, part in enumerate(b["content"]):
                    block(part, f"{path}content[{i}].")

        data = event["data"]
        kind = event["type"]
        if kind in ("user/message", "assistant/message", "tool/result"):
            for i, b in enumerate(data["content"]):
                block(b, f"content[{i}].")
        elif kind == "tool/call":
            text(data, "arguments", "")
        elif kind == "compaction/summary":
            text(data, "summary", "")
        elif kind == "assistant/chunk":
            text(data, "data", "")
        elif kind == "request/header":
            header = data["header"]
            text(header, "system", "header.")
            for i, tool in enumerate(header.get("tools", [])):
                text(tool, "description", f"header.tools[{i}].")
                tool["inputSchema"] = json.loads(plain(tool["inputSchema"]["sealed"], f"header.tools[{i}].inputSchema"))
            config = header["config"]
            if "outputSchema" in config:
                config["outputSchema"] = json.loads(
                    plain(config["outputSchema"]["sealed"], "header.config.outputSchema")
                )
        return event


# ---------------------------------------------------------------------------- the walk


@dataclass(frozen=True)
class Check:
    seq: int
    what: str  # "dispatch" | "summarize"
    recorded: str
    rebuilt: str
    recorded_bytes: int | None = None
    rebuilt_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.recorded == self.rebuilt and self.recorded_bytes == self.rebuilt_bytes


def reconstruct(events: Iterable[bytes], attachments: Path | None = None, opener: Opener | None = None) -> list[Check]:
    """Every digest the log records, and the digest this reconstructor rebuilds for it; ``opener`` opens sealed
    events (§3.5)."""
    objects = Objects(attachments)
    fold = Fold([])
    region: list[dict[str, Any]] = []
    checks: list[Check] = []
    for raw in events:
        event = mark_ordered(json.loads(raw))
        assert body_bytes(event) == raw, "an event is not in canonical form (§1)"
        if "sealed" in event:
            assert opener is not None, "a sealed event (§3.5) and no key to open it"
            event = mark_ordered(opener.open(event))  # an opened inputSchema is ordered too (§3.5)
        data = event["data"]
        if event["type"] == "request/dispatch":
            assert fold.header is not None
            serialize = SERIALIZERS[(data["serializer"], data["serializerVersion"])]
            body = body_bytes(serialize(fold.header, fold.messages(), objects))
            checks.append(Check(event["seq"], "dispatch", data["digest"], digest(body), data["bytes"], len(body)))
        elif event["type"] == "compaction/start":
            region = fold.messages()[data["start"] : data["end"] + 1]
        elif event["type"] == "compaction/summary" and "inputDigest" in data:
            provider = data["provider"]
            key = (
                (data["serializer"], data["serializerVersion"])
                if "serializer" in data
                else (
                    {"anthropic": "anthropic-messages", "openai": "openai-chat"}[provider],
                    1,
                )
            )
            version = data.get("promptVersion", 1)
            assert version == 1, f"summarize prompt version {version} is not in FORMAT.md"
            system, instruction = SUMMARIZE_V1
            header = {
                "config": {"maxTokens": data["maxTokens"], "model": data["model"], "provider": provider},
                "system": system,
            }
            body = body_bytes(
                SERIALIZERS[key](header, [{"role": "user", "content": transcript(region, instruction)}], objects)
            )
            checks.append(Check(event["seq"], "summarize", data["inputDigest"], digest(body)))
        apply(fold, event)
    return checks
