"""The OpenAI Responses API as the emulator serves it (``POST /v1/responses``): the parser and the answer.

The parser checks a body the way the API does — unknown keys at every level (400 ``Unknown parameter:
'input[2].parsed_arguments'.``, code ``unknown_parameter``), item shapes, every ``function_call_output``
answering an earlier ``function_call``, no ``previous_response_id`` (the emulator stores nothing, as with
``store: false``) — and opens every ``reasoning`` item's ``encrypted_content`` (:mod:`.sealing`): an item whose
content was altered or issued for another id is a 400, and a reasoning item without encrypted content cannot be
resolved because nothing is stored. Consecutive assistant-side items (reasoning, assistant messages, function
calls) form one assistant turn for the script. Caching is automatic, like Chat Completions.

The answer: with reasoning on (``reasoning.effort`` other than ``none``, or a model whose name says
``reasoning`` when no effort is given), a ``reasoning`` item with a summary and sealed ``encrypted_content``
first, then the message and the function calls — inside the whole response object the live API sends: the
request's settings echoed (``instructions``, ``tools``, ``tool_choice``, ``temperature``, ``store``, ``reasoning``
…) and ``usage`` with cached, written and reasoning tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, assert_never

from ...core.codec import canonical_json, loads
from . import checks
from .answer import Answer
from .cache import CacheUsage, OpenAICachePolicy, PrefixCache
from .checks import RequestRejected
from .openai_chat import openai_error, openai_status_error
from .prompt import Prompt, Resume
from .script import Api, ImagePart, Part, ReasoningPart, Role, TextPart, ToolCallPart, ToolDef, ToolResultPart
from .sealing import open_reasoning, seal_reasoning
from .structured import responses_format
from .tokens import output_tokens
from .wire_api import WireApi

__all__ = ["PATH", "OpenAIResponses", "parse_responses"]

PATH: Final = "/v1/responses"

_TOP: Final = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "temperature", "tools", "tool_choice", "reasoning",
        "include", "store", "prompt_cache_key", "prompt_cache_retention", "parallel_tool_calls", "metadata",
        "stream", "top_p", "truncation", "user", "service_tier", "text", "previous_response_id", "safety_identifier",
        "max_tool_calls", "top_logprobs", "background", "stream_options",
    }
)  # fmt: skip
_EFFORTS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})


def _parts(content: Any, where: str, *, user: bool) -> list[TextPart | ImagePart]:
    if isinstance(content, str):
        return [TextPart(content)]
    out: list[TextPart | ImagePart] = []
    for at, part in checks.objects(content, where, brackets=True):
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            checks.known_parameters(part, frozenset({"type", "text", "annotations", "logprobs"}), at)
            out.append(TextPart(checks.string(part.get("text"), f"{at}.text")))
        elif kind == "input_image" and user:
            checks.known_parameters(part, frozenset({"type", "image_url", "detail", "file_id"}), at)
            head, sep, payload = checks.string(part.get("image_url"), f"{at}.image_url").partition(",")
            if not sep or not head.startswith("data:") or not head.endswith(";base64"):
                raise RequestRejected(400, f"{at}.image_url: the emulator only takes base64 data URLs for images")
            media_type = head[len("data:") : -len(";base64")]
            out.append(checks.decode_image(checks.decode_base64(payload, at), media_type, at))
        else:
            raise RequestRejected(400, f"{at}.type: unexpected content part type {kind!r} here")
    return out


class _Turns:
    """Builds the prompt's turns: consecutive assistant-side items join one assistant turn."""

    def __init__(self, prompt: Prompt) -> None:
        self.prompt = prompt
        self.role: Role | None = None
        self.parts: list[Part] = []

    def add(self, role: Role, parts: list[Part]) -> None:
        if role != self.role or role != "assistant":
            self.flush()
        self.role = role
        self.parts.extend(parts)

    def flush(self) -> None:
        if self.role is not None and self.parts:
            self.prompt.add_turn(self.role, self.parts)
        self.role, self.parts = None, []


def _item(turns: _Turns, item: dict[str, Any], where: str, calls: set[str], key: bytes) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        checks.known_parameters(item, frozenset({"type", "role", "content", "id", "status", "phase"}), where)
        role = item.get("role")
        if role in ("system", "developer"):
            texts = _parts(item.get("content"), f"{where}.content", user=False)
            turns.add("system", list(texts))
        elif role in ("user", "assistant"):
            turns.add(role, list(_parts(item.get("content"), f"{where}.content", user=role == "user")))
        else:
            raise RequestRejected(400, f"{where}.role: Input should be 'user', 'assistant', 'system' or 'developer'")
    elif kind == "function_call":
        checks.known_parameters(item, frozenset({"type", "arguments", "call_id", "name", "id", "status"}), where)
        call_id = checks.string(item.get("call_id"), f"{where}.call_id")
        arguments = checks.string(item.get("arguments"), f"{where}.arguments")
        try:
            parsed: Any = loads(arguments)
        except ValueError:
            parsed = arguments
        calls.add(call_id)
        turns.add("assistant", [ToolCallPart(call_id, checks.string(item.get("name"), f"{where}.name"), parsed)])
    elif kind == "function_call_output":
        checks.known_parameters(item, frozenset({"type", "call_id", "output", "id", "status"}), where)
        call_id = checks.string(item.get("call_id"), f"{where}.call_id")
        if call_id not in calls:
            raise RequestRejected(400, f"No tool call found for function call output with call_id {call_id}.")
        output = _parts(item.get("output"), f"{where}.output", user=True) if item.get("output") != "" else []
        turns.add("tool", [ToolResultPart(call_id, tuple(output))])
    elif kind == "reasoning":
        checks.known_parameters(
            item, frozenset({"type", "id", "summary", "encrypted_content", "content", "status"}), where
        )
        item_id = checks.string(item.get("id"), f"{where}.id")
        for at, s in checks.objects(item.get("summary"), f"{where}.summary", brackets=True):
            checks.known_parameters(s, frozenset({"type", "text"}), at)
            checks.string(s.get("text"), f"{at}.text")
        sealed = item.get("encrypted_content")
        if sealed is None:
            raise RequestRejected(
                404,
                f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. Try again "
                "with `store` set to true, or remove this item from your input.",
            )
        text = open_reasoning(key, item_id, checks.string(sealed, f"{where}.encrypted_content"))
        if text is None:
            raise RequestRejected(400, f"The encrypted content for item {item_id} could not be verified.")
        turns.add("assistant", [ReasoningPart(text)])
    else:
        raise RequestRejected(400, f"{where}.type: unexpected input item type {kind!r}")


def _add_tools(prompt: Prompt, tools: Any) -> None:
    for where, tool in checks.objects(tools, "tools", brackets=True):
        checks.known_parameters(tool, frozenset({"type", "name", "description", "parameters", "strict"}), where)
        if tool.get("type") != "function":
            raise RequestRejected(400, f"{where}.type: the emulator only offers function tools")
        params = checks.json_object(tool.get("parameters"), f"{where}.parameters")
        prompt.add_tool(
            ToolDef(checks.string(tool.get("name"), f"{where}.name"), str(tool.get("description", "")), params)
        )


def parse_responses(body: Any, key: bytes = b"") -> Prompt:
    req = checks.json_object(body, "body")
    checks.known_parameters(req, _TOP, "")
    if req.get("previous_response_id") is not None:
        raise RequestRejected(400, "previous_response_id: the emulator stores no responses; send the whole input")
    model = checks.string(req.get("model"), "model")
    prompt = Prompt("openai-responses", model)
    limit = req.get("max_output_tokens")
    if limit is not None and not checks.positive_int(limit):
        raise RequestRejected(400, "max_output_tokens: expected a positive integer")
    prompt.max_tokens = limit
    temperature = req.get("temperature")
    if temperature is not None and not checks.number_within(temperature, 2):
        raise RequestRejected(400, "temperature: expected a number between 0 and 2")
    effort = None
    if req.get("reasoning") is not None:
        reasoning = checks.json_object(req["reasoning"], "reasoning")
        checks.known_parameters(reasoning, frozenset({"effort", "summary", "context"}), "reasoning")
        effort = reasoning.get("effort")
        if effort is not None and effort not in _EFFORTS:
            raise RequestRejected(400, f"reasoning.effort: unsupported value {effort!r}")
    prompt.thinking = effort != "none" if effort is not None else "reasoning" in model
    _add_tools(prompt, req.get("tools", []))
    if (instructions := req.get("instructions")) is not None:
        text = checks.string(instructions, "instructions")
        prompt.system.append(text)
        prompt.add_turn("system", [TextPart(text)])
    items = req.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    turns = _Turns(prompt)
    calls: set[str] = set()
    for where, item in checks.objects(items, "input", brackets=True):
        _item(turns, item, where, calls, key)
    turns.flush()
    if not prompt.turns or prompt.turns[-1].role == "system":
        raise RequestRejected(400, "input: at least one input item is required")
    prompt.echo = _echo(req, effort)
    prompt.output = responses_format(req)
    return prompt


def _echo(req: dict[str, Any], effort: Any) -> dict[str, Any]:
    """The request's settings as the response repeats them (with the API's defaults where the request has none)."""
    reasoning = req.get("reasoning") or {}
    tools = [
        {
            "description": tool.get("description"),
            "name": tool["name"],
            "parameters": tool.get("parameters"),
            "strict": tool.get("strict", True),
            "type": "function",
        }
        for tool in req.get("tools") or ()
    ]
    return {
        "background": bool(req.get("background", False)),
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "max_tool_calls": req.get("max_tool_calls"),
        "metadata": req.get("metadata") or {},
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": req.get("prompt_cache_key"),
        "prompt_cache_retention": req.get("prompt_cache_retention"),
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "safety_identifier": req.get("safety_identifier"),
        "service_tier": "default",
        "store": req.get("store", True),
        "temperature": req.get("temperature", 1.0),
        "text": req.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": tools,
        "top_logprobs": req.get("top_logprobs", 0),
        "top_p": req.get("top_p", 1.0),
        "truncation": req.get("truncation", "disabled"),
        "user": req.get("user"),
    }


class OpenAIResponses(WireApi[OpenAICachePolicy]):
    """The Responses API: ``Authorization: Bearer``, automatic prefix caching, sealed reasoning items."""

    name: ClassVar[Api] = "openai-responses"
    path = PATH

    def __init__(self, policy: OpenAICachePolicy, key: bytes = b"") -> None:
        super().__init__(policy)
        self.key = key

    def credential(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization", "").removeprefix("Bearer ")

    def parse(self, payload: Any, resume: Resume | None = None) -> Prompt:
        if resume is not None:
            raise ValueError("the Responses API's parser does not resume after a prefix")
        return parse_responses(payload, self.key)

    def account(self, cache: PrefixCache, prompt: Prompt) -> CacheUsage:
        return cache.account_automatic(self.name, prompt.model, prompt.blocks, self.policy)

    def render(self, prompt: Prompt, answer: Answer, usage: CacheUsage, clock: Callable[[], float]) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        reasoning_tokens = 0
        texts: list[str] = []
        for k, part in enumerate(answer.content):
            match part:
                case ReasoningPart(text=text):
                    item_id = answer.call_id("rs_emu_", k)
                    summary = [{"text": text.split(".")[0] + ".", "type": "summary_text"}]
                    output.append(
                        {
                            "encrypted_content": seal_reasoning(self.key, item_id, text),
                            "id": item_id,
                            "summary": summary,
                            "type": "reasoning",
                        }
                    )
                    reasoning_tokens += output_tokens(part)
                case TextPart(text=text):
                    texts.append(text)
                case ToolCallPart(name=name, arguments=arguments):
                    if texts:
                        output.append(_message(answer, texts))
                        texts = []
                    output.append(
                        {
                            "arguments": canonical_json(arguments).decode(),
                            "call_id": answer.call_id("call_emu_", k),
                            "id": answer.call_id("fc_emu_", k),
                            "name": name,
                            "status": "completed",
                            "type": "function_call",
                        }
                    )
                case _:
                    assert_never(part)
        if texts:
            output.append(_message(answer, texts))
        incomplete = answer.stop_reason == "max_tokens"
        total = prompt.tokens
        return {
            **prompt.echo,
            "created_at": int(clock()),
            "error": None,
            "id": answer.message_id("resp_emu_"),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": prompt.model,
            "object": "response",
            "output": output,
            "status": "incomplete" if incomplete else "completed",
            "usage": {
                "input_tokens": total,
                "input_tokens_details": {"cache_write_tokens": usage.write, "cached_tokens": usage.read},
                "output_tokens": answer.output_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, answer.output_tokens)},
                "total_tokens": total + answer.output_tokens,
            },
        }

    def error_body(self, exc: RequestRejected, request_id: str | None) -> dict[str, Any]:
        return openai_error(exc)

    def status_error(self, status: int) -> RequestRejected:
        return openai_status_error(status)


def _message(answer: Answer, texts: list[str]) -> dict[str, Any]:
    return {
        "content": [{"annotations": [], "logprobs": [], "text": "".join(texts), "type": "output_text"}],
        "id": answer.message_id("msg_emu_"),
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
