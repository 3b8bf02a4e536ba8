"""OpenAI Chat Completions as the emulator serves it (``POST /v1/chat/completions``): the parser and the answer.

The parser checks a body the way the API does — unknown keys, value ranges, which content part kinds each
role may carry, every ``tool_calls`` entry answered by a ``tool`` message before anything else follows —
and builds the :class:`~.prompt.Prompt`. Leading ``system``/``developer`` messages make up the system
prompt a script sees. A new role is one entry in :data:`_ROLES`, a new content part kind one in
:data:`_CONTENT_PARTS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, assert_never

from ...core.codec import canonical_json, loads
from . import checks
from .answer import Answer, StopReason
from .cache import CacheUsage, OpenAICachePolicy, PrefixCache
from .checks import RequestRejected
from .prompt import Prompt
from .script import Api, ImagePart, Part, ReasoningPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from .wire_api import WireApi

__all__ = ["PATH", "REASONING_PATH", "OpenAIChat", "ReasoningChat", "parse_openai"]

PATH: Final = "/v1/chat/completions"
REASONING_PATH: Final = "/chat/completions"  # DeepSeek's path

_TOP: Final = frozenset(
    {
        "model", "messages", "max_completion_tokens", "max_tokens", "temperature", "stop", "reasoning_effort",
        "tools", "tool_choice", "parallel_tool_calls", "top_p", "seed", "stream", "user", "metadata", "n",
        "prompt_cache_key", "service_tier", "store", "response_format", "stream_options",
    }
)  # fmt: skip


_FINISH: Final[dict[StopReason, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "stop",  # with the text in ``message.refusal``
    "pause_turn": "stop",
    "model_context_window_exceeded": "length",
}


# ---------------------------------------------------------------------------- content parts


def _text_part(item: dict[str, Any], where: str) -> TextPart:
    checks.exact_keys(item, frozenset({"type", "text"}), where)
    return TextPart(checks.string(item.get("text"), f"{where}.text"))


def _image_url_part(item: dict[str, Any], where: str) -> ImagePart:
    checks.exact_keys(item, frozenset({"type", "image_url"}), where)
    image = checks.json_object(item.get("image_url"), f"{where}.image_url")
    checks.exact_keys(image, frozenset({"url", "detail"}), f"{where}.image_url")
    at = f"{where}.image_url.url"
    head, sep, payload = checks.string(image.get("url"), at).partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise RequestRejected(400, f"{at}: the emulator only takes base64 data URLs for images")
    media_type = head[len("data:") : -len(";base64")]
    return checks.decode_image(checks.decode_base64(payload, at), media_type, at)


#: Content part kinds: whether the part is an image (allowed in user messages only) and its parser.
_CONTENT_PARTS: Final[dict[str, tuple[bool, Callable[[dict[str, Any], str], TextPart | ImagePart]]]] = {
    "text": (False, _text_part),
    "image_url": (True, _image_url_part),
}


def _content(content: Any, where: str, *, images: bool) -> list[TextPart | ImagePart]:
    """A message's ``content``: a string is one text part; otherwise a list of parts."""
    if isinstance(content, str):
        return [TextPart(content)]
    out: list[TextPart | ImagePart] = []
    for at, item in checks.objects(content, where):
        kind = item.get("type")
        entry = _CONTENT_PARTS.get(kind) if isinstance(kind, str) else None
        if entry is None or (entry[0] and not images):
            raise RequestRejected(400, f"{at}.type: unexpected content part type {kind!r} here")
        out.append(entry[1](item, at))
    return out


# ---------------------------------------------------------------------------- messages by role


def _system(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    checks.exact_keys(msg, frozenset({"role", "content", "name"}), where)
    texts = _content(msg.get("content"), f"{where}.content", images=False)
    if all(t.role == "system" for t in prompt.turns):  # still leading: part of the system prompt
        prompt.system.extend(p.text for p in texts if isinstance(p, TextPart))
    prompt.add_turn("system", texts)


def _user(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    checks.exact_keys(msg, frozenset({"role", "content", "name"}), where)
    prompt.add_turn("user", _content(msg.get("content"), f"{where}.content", images=True))


def _assistant(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    reasoning = prompt.api == "deepseek"
    keys = {"role", "content", "tool_calls", "name", "refusal"} | ({"reasoning_content"} if reasoning else set())
    checks.exact_keys(msg, frozenset(keys), where)
    parts: list[Part] = []
    if reasoning and msg.get("reasoning_content") is not None:
        parts.append(ReasoningPart(checks.string(msg["reasoning_content"], f"{where}.reasoning_content")))
    elif reasoning and prompt.thinking and msg.get("tool_calls"):
        index = where.removeprefix("messages[").removesuffix("]")
        raise RequestRejected(
            400,
            f"Missing `reasoning_content` field in the assistant message at message index {index}. For more "
            "information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls",
        )
    if msg.get("content") is not None:
        parts.extend(_content(msg.get("content"), f"{where}.content", images=False))
    for at, tc in checks.objects(msg.get("tool_calls", []), f"{where}.tool_calls", brackets=True):
        checks.exact_keys(tc, frozenset({"id", "type", "function"}), at)
        fn = checks.json_object(tc.get("function"), f"{at}.function")
        checks.exact_keys(fn, frozenset({"name", "arguments"}), f"{at}.function")
        arguments = checks.string(fn.get("arguments"), f"{at}.function.arguments")
        try:
            parsed: Any = loads(arguments)
        except ValueError:
            parsed = arguments
        call = ToolCallPart(
            checks.string(tc.get("id"), f"{at}.id"), checks.string(fn.get("name"), f"{at}.function.name"), parsed
        )
        pending.add(call.id)
        parts.append(call)
    prompt.add_turn("assistant", parts)


def _tool(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    checks.exact_keys(msg, frozenset({"role", "content", "tool_call_id"}), where)
    call_id = checks.string(msg.get("tool_call_id"), f"{where}.tool_call_id")
    if call_id not in pending:
        raise RequestRejected(
            400,
            f"{where}: messages with role 'tool' must be a response to a preceding message with "
            f"'tool_calls' (unknown tool_call_id {call_id!r})",
        )
    pending.discard(call_id)
    texts = _content(msg.get("content"), f"{where}.content", images=False)
    prompt.add_turn("tool", [ToolResultPart(call_id, tuple(texts))])


#: Message roles and their parsers; ``pending`` holds the tool call ids not answered yet.
_ROLES: Final[dict[str, Callable[[Prompt, dict[str, Any], str, set[str]], None]]] = {
    "system": _system,
    "developer": _system,
    "user": _user,
    "assistant": _assistant,
    "tool": _tool,
}


# ---------------------------------------------------------------------------- the request


def _add_tools(prompt: Prompt, tools: Any) -> None:
    for where, tool in checks.objects(tools, "tools"):
        checks.exact_keys(tool, frozenset({"type", "function"}), where)
        if tool.get("type") != "function":
            raise RequestRejected(400, f"{where}.type: expected 'function'")
        fn = checks.json_object(tool.get("function"), f"{where}.function")
        checks.exact_keys(fn, frozenset({"name", "description", "parameters", "strict"}), f"{where}.function")
        params = checks.json_object(
            fn.get("parameters", {"type": "object", "properties": {}}), f"{where}.function.parameters"
        )
        prompt.add_tool(
            ToolDef(checks.string(fn.get("name"), f"{where}.function.name"), str(fn.get("description", "")), params)
        )


def _deepseek_thinking(req: dict[str, Any]) -> bool:
    """DeepSeek thinks unless ``thinking: {"type": "disabled"}``."""
    config = req.get("thinking")
    if config is None:
        return True
    tc = checks.json_object(config, "thinking")
    checks.exact_keys(tc, frozenset({"type"}), "thinking")
    if tc.get("type") not in ("enabled", "disabled"):
        raise RequestRejected(400, "thinking.type: expected 'enabled' or 'disabled'")
    return bool(tc["type"] == "enabled")


def parse_openai(body: Any, *, reasoning: bool = False) -> Prompt:
    """A Chat Completions body; ``reasoning``: DeepSeek's dialect (``thinking``, ``reasoning_content``)."""
    req = checks.request_body(body, _TOP | {"thinking"} if reasoning else _TOP)
    prompt = Prompt("deepseek" if reasoning else "openai", checks.string(req.get("model"), "model"))
    if reasoning:
        prompt.thinking = _deepseek_thinking(req)
    limit = req.get("max_completion_tokens", req.get("max_tokens"))
    if limit is not None and not checks.positive_int(limit):
        raise RequestRejected(400, "max_completion_tokens: expected a positive integer")
    prompt.max_tokens = limit
    stop = req.get("stop")
    if isinstance(stop, str):
        prompt.stop = (stop,)
    elif stop is not None:
        prompt.stop = tuple(checks.string(s, "stop[]") for s in checks.array(stop, "stop"))
    temperature = req.get("temperature")
    if temperature is not None and not checks.number_within(temperature, 2):
        raise RequestRejected(400, "temperature: expected a number between 0 and 2")
    _add_tools(prompt, req.get("tools", []))
    pending: set[str] = set()
    for where, msg in checks.objects(checks.message_list(req), "messages", brackets=True):
        role = msg.get("role")
        if role != "tool" and pending:
            raise RequestRejected(
                400,
                f"{where}: an assistant message with 'tool_calls' must be followed by tool messages responding to "
                f"each 'tool_call_id'; missing: {sorted(pending)}",
            )
        parse_message = _ROLES.get(role) if isinstance(role, str) else None
        if parse_message is None:
            raise RequestRejected(400, f"{where}.role: unexpected role {role!r}")
        parse_message(prompt, msg, where, pending)
    if pending:
        raise RequestRejected(400, f"messages: tool calls without responses: {sorted(pending)}")
    return prompt


# ---------------------------------------------------------------------------- the answer


class OpenAIChat(WireApi[OpenAICachePolicy]):
    """Chat Completions: ``Authorization: Bearer``, automatic prefix caching."""

    name: ClassVar[Api] = "openai"
    path = PATH

    def credential(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization", "").removeprefix("Bearer ")

    def parse(self, payload: Any) -> Prompt:
        return parse_openai(payload)

    def account(self, cache: PrefixCache, prompt: Prompt) -> CacheUsage:
        return cache.account_automatic(self.name, prompt.model, prompt.blocks, self.policy)

    def render(self, prompt: Prompt, answer: Answer, usage: CacheUsage, clock: Callable[[], float]) -> dict[str, Any]:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        thoughts: list[str] = []
        for k, part in enumerate(answer.content):
            match part:
                case ReasoningPart(text=text):
                    thoughts.append(text)
                case TextPart(text=text):
                    texts.append(text)
                case ToolCallPart(name=name, arguments=arguments):
                    function = {"arguments": canonical_json(arguments).decode(), "name": name}
                    calls.append({"function": function, "id": answer.call_id("call_emu_", k), "type": "function"})
                case _:
                    assert_never(part)
        said = "".join(texts) or None
        refused = answer.stop_reason == "refusal"
        message: dict[str, Any] = {
            "content": None if refused else said,
            "refusal": said if refused else None,
            "role": "assistant",
        }
        if calls:
            message["tool_calls"] = calls
        if self.name == "deepseek":
            message["reasoning_content"] = "".join(thoughts) or None
        choice = {"finish_reason": _FINISH[answer.stop_reason], "index": 0, "logprobs": None, "message": message}
        total = prompt.tokens
        if self.name == "deepseek":
            return {
                "choices": [choice],
                "created": int(clock()),
                "id": answer.message_id("chatcmpl-emu-"),
                "model": prompt.model,
                "object": "chat.completion",
                "usage": {
                    "completion_tokens": answer.output_tokens,
                    "prompt_cache_hit_tokens": usage.read,
                    "prompt_cache_miss_tokens": total - usage.read,
                    "prompt_tokens": total,
                    "total_tokens": total + answer.output_tokens,
                },
            }
        return {
            "choices": [choice],
            "created": int(clock()),
            "id": answer.message_id("chatcmpl-emu-"),
            "model": prompt.model,
            "object": "chat.completion",
            "usage": {
                "completion_tokens": answer.output_tokens,
                "prompt_tokens": total,
                "prompt_tokens_details": {"cached_tokens": usage.read},
                "total_tokens": total + answer.output_tokens,
            },
        }

    def error_body(self, exc: RequestRejected) -> dict[str, Any]:
        return {"error": {"code": None, "message": exc.message, "param": None, "type": exc.kind}}


class ReasoningChat(OpenAIChat):
    """DeepSeek's Chat Completions (``POST /chat/completions``): ``thinking``, ``reasoning_content`` on assistant
    messages (required back on tool-call turns while thinking), cache hit/miss usage. Caches like OpenAI."""

    name: ClassVar[Api] = "deepseek"
    path = REASONING_PATH

    def parse(self, payload: Any) -> Prompt:
        return parse_openai(payload, reasoning=True)
