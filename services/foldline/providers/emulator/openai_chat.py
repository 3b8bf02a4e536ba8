"""OpenAI Chat Completions as the emulator serves it (``POST /v1/chat/completions``): the parser and the answer.

The parser checks a body the way the API does — an unknown top-level argument is a 400 ("Unrecognized request
argument supplied: …"), value ranges, which content part kinds each role may carry, every ``tool_calls`` entry
answered by a ``tool`` message before anything else follows — and builds the :class:`~.prompt.Prompt`. Keys it
does not know *inside* messages are ignored, as the API does for its current models (the ``index`` the
openai SDK's stream helper leaves on the tool calls it hands back, its ``parsed`` fields; docs/EMULATOR.md,
"Strictness"); the keys it knows are type-checked. Leading ``system``/``developer`` messages make up the system
prompt a script sees. A new role is one entry in :data:`_ROLES`, a new content part kind one in
:data:`_CONTENT_PARTS`.

Reasoning: a request with ``reasoning_effort`` other than ``none`` (or none given to a model whose name says
``reasoning``) reasons first. Chat Completions never returns the reasoning; the answer counts it in
``completion_tokens`` and ``completion_tokens_details.reasoning_tokens``. DeepSeek's dialect
(:class:`ReasoningChat`) returns it as ``reasoning_content``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, assert_never

from ...core.codec import canonical_json, loads
from . import checks
from .answer import Answer, StopReason
from .cache import CacheUsage, OpenAICachePolicy, PrefixCache
from .checks import RequestRejected
from .prompt import Prompt, Resume
from .script import Api, ImagePart, Part, ReasoningPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from .structured import chat_format, deepseek_format
from .tokens import output_tokens
from .wire_api import WireApi

__all__ = ["PATH", "REASONING_PATH", "OpenAIChat", "ReasoningChat", "parse_openai"]

PATH: Final = "/v1/chat/completions"
REASONING_PATH: Final = "/chat/completions"  # DeepSeek's path

_TOP: Final = frozenset(
    {
        "model", "messages", "max_completion_tokens", "max_tokens", "temperature", "stop", "reasoning_effort",
        "tools", "tool_choice", "parallel_tool_calls", "top_p", "seed", "stream", "user", "metadata", "n",
        "prompt_cache_key", "service_tier", "store", "response_format", "stream_options", "prompt_cache_retention",
        "safety_identifier", "verbosity", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty",
        "logit_bias", "modalities", "prediction", "web_search_options", "audio",
    }
)  # fmt: skip
_EFFORTS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})


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
    return TextPart(checks.string(item.get("text"), f"{where}.text"))


def _image_url_part(item: dict[str, Any], where: str) -> ImagePart:
    image = checks.json_object(item.get("image_url"), f"{where}.image_url")
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
    texts = _content(msg.get("content"), f"{where}.content", images=False)
    if all(t.role == "system" for t in prompt.turns):  # still leading: part of the system prompt
        prompt.system.extend(p.text for p in texts if isinstance(p, TextPart))
    prompt.add_turn("system", texts)


def _user(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    text_only = prompt.api == "deepseek"  # DeepSeek's chat takes text parts only
    content = msg.get("content")
    if text_only and isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and item.get("type") != "text":
                raise RequestRejected(
                    400,
                    f"Failed to deserialize the JSON body into the target type: {where}: unknown variant "
                    f"`{item.get('type')}`, expected `text`",
                )
    prompt.add_turn("user", _content(content, f"{where}.content", images=True))


def _assistant(prompt: Prompt, msg: dict[str, Any], where: str, pending: set[str]) -> None:
    reasoning = prompt.api == "deepseek"
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
    for at, tc in checks.objects(msg.get("tool_calls") or [], f"{where}.tool_calls", brackets=True):
        if tc.get("type", "function") != "function":
            raise RequestRejected(400, f"{at}.type: the emulator only takes function tool calls", param=f"{at}.type")
        fn = checks.json_object(tc.get("function"), f"{at}.function")
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
    for where, tool in checks.objects(tools, "tools", brackets=True):
        if tool.get("type") != "function":
            raise RequestRejected(400, f"{where}.type: expected 'function'", param=f"{where}.type")
        fn = checks.json_object(tool.get("function"), f"{where}.function")
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
    if tc.get("type") not in ("enabled", "disabled"):
        raise RequestRejected(400, "thinking.type: expected 'enabled' or 'disabled'")
    return bool(tc["type"] == "enabled")


def parse_openai(body: Any, *, reasoning: bool = False, resume: Resume | None = None) -> Prompt:
    """A Chat Completions body; ``reasoning``: DeepSeek's dialect (``thinking``, ``reasoning_content``);
    ``resume``: its messages continue a prefix parsed before (``body`` holds the rest)."""
    req = checks.json_object(body, "body")
    unknown = sorted(set(req) - (_TOP | {"thinking"} if reasoning else _TOP))
    if unknown:
        raise RequestRejected(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    prompt = Prompt("deepseek" if reasoning else "openai", checks.string(req.get("model"), "model"))
    effort = req.get("reasoning_effort")
    if effort is not None and effort not in _EFFORTS:
        raise RequestRejected(
            400, f"Invalid value: '{effort}'. Supported values are: {', '.join(sorted(_EFFORTS))}.",
            param="reasoning_effort", code="invalid_value",
        )  # fmt: skip
    if reasoning:
        prompt.thinking = _deepseek_thinking(req)
    else:
        prompt.thinking = effort != "none" if effort is not None else "reasoning" in prompt.model
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
    first = 0
    if resume is not None:
        prompt.resume(resume)
        pending, first = set(resume.state), resume.messages
    for where, msg in checks.objects(checks.message_list(req), "messages", brackets=True, start=first):
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
        prompt.mark(frozenset(pending))
    if pending:
        raise RequestRejected(400, f"messages: tool calls without responses: {sorted(pending)}")
    if reasoning:
        said = ("system", "user")  # a resumed prompt holds its leading system text among its turns
        texts = [p.text for t in prompt.turns if t.role in said for p in t.parts if isinstance(p, TextPart)]
        prompt.output = deepseek_format(req, texts)
    else:
        prompt.output = chat_format(req)
    return prompt


# ---------------------------------------------------------------------------- the answer


class OpenAIChat(WireApi[OpenAICachePolicy]):
    """Chat Completions: ``Authorization: Bearer``, automatic prefix caching."""

    name: ClassVar[Api] = "openai"
    path = PATH

    def credential(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization", "").removeprefix("Bearer ")

    resumable = True

    def parse(self, payload: Any, resume: Resume | None = None) -> Prompt:
        return parse_openai(payload, resume=resume)

    def account(self, cache: PrefixCache, prompt: Prompt) -> CacheUsage:
        return cache.account_automatic(self.name, prompt.model, prompt.blocks, self.policy)

    def render(self, prompt: Prompt, answer: Answer, usage: CacheUsage, clock: Callable[[], float]) -> dict[str, Any]:
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        thoughts: list[str] = []
        reasoning_tokens = 0
        for k, part in enumerate(answer.content):
            match part:
                case ReasoningPart(text=text):
                    thoughts.append(text)
                    reasoning_tokens += output_tokens(part)
                case TextPart(text=text):
                    texts.append(text)
                case ToolCallPart(name=name, arguments=arguments):
                    function = {"arguments": canonical_json(arguments).decode(), "name": name}
                    calls.append({"function": function, "id": answer.call_id("call_emu_", k), "type": "function"})
                case _:
                    assert_never(part)
        reasoning_tokens = min(reasoning_tokens, answer.output_tokens)
        said = "".join(texts) or None
        refused = answer.stop_reason == "refusal"
        message = self._message(said, refused, calls, "".join(thoughts) if prompt.thinking else None)
        finish = _FINISH[answer.stop_reason]
        if refused and self.name == "deepseek":
            finish = "content_filter"  # DeepSeek has no refusal field: the text, filtered
        choice = {"finish_reason": finish, "index": 0, "logprobs": None, "message": message}
        return {
            "choices": [choice],
            "created": int(clock()),
            "id": self._completion_id(answer),
            "model": prompt.model,
            "object": "chat.completion",
            **self._service(prompt),
            "usage": self._usage(prompt, answer, usage, reasoning_tokens),
        }

    def _message(
        self, said: str | None, refused: bool, calls: list[dict[str, Any]], reasoning: str | None
    ) -> dict[str, Any]:
        """The assistant message as OpenAI sends it: ``annotations`` and ``refusal`` always, ``tool_calls`` when
        there are some; the reasoning is never returned."""
        message: dict[str, Any] = {
            "annotations": [],
            "content": None if refused else said,
            "refusal": said if refused else None,
            "role": "assistant",
        }
        if calls:
            message["tool_calls"] = calls
        return message

    def _completion_id(self, answer: Answer) -> str:
        return answer.message_id("chatcmpl-emu-")

    def _service(self, prompt: Prompt) -> dict[str, Any]:
        """The fields that name the serving backend: OpenAI's tier and a fingerprint of the model."""
        return {"service_tier": "default", "system_fingerprint": fingerprint(prompt.model)}

    def _usage(self, prompt: Prompt, answer: Answer, usage: CacheUsage, reasoning_tokens: int) -> dict[str, Any]:
        """``prompt_tokens`` includes the cached and the written tokens (``prompt_tokens_details``);
        ``completion_tokens`` includes the reasoning tokens (``completion_tokens_details``)."""
        total = prompt.tokens
        return {
            "completion_tokens": answer.output_tokens,
            "completion_tokens_details": {
                "accepted_prediction_tokens": 0,
                "audio_tokens": 0,
                "reasoning_tokens": reasoning_tokens,
                "rejected_prediction_tokens": 0,
            },
            "prompt_tokens": total,
            "prompt_tokens_details": {
                "audio_tokens": 0,
                "cache_write_tokens": usage.write,
                "cached_tokens": usage.read,
            },
            "total_tokens": total + answer.output_tokens,
        }

    def error_body(self, exc: RequestRejected, request_id: str | None) -> dict[str, Any]:
        return openai_error(exc)

    def status_error(self, status: int) -> RequestRejected:
        return openai_status_error(status)


def fingerprint(model: str) -> str:
    """A stable ``system_fingerprint`` for a model (the real ones name a backend configuration)."""
    return "fp_" + hashlib.sha256(b"foldline-emulator\0" + model.encode()).hexdigest()[:10]


def openai_error(exc: RequestRejected) -> dict[str, Any]:
    """An error body in OpenAI's shape: ``{"error": {"code", "message", "param", "type"}}``."""
    return {"error": {"code": exc.code, "message": exc.message, "param": exc.param, "type": exc.kind}}


#: type, code and message of each injected status, in OpenAI's words (its error-codes guide).
_OPENAI_STATUS: Final[dict[int, tuple[str, str | None, str]]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: (
        "invalid_request_error",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported",
    ),
    404: ("invalid_request_error", None, "Not found."),
    408: ("invalid_request_error", None, "Request timed out."),
    409: ("invalid_request_error", None, "The request conflicts with another request."),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for requests per min (RPM). Please try again in 1s. Visit "
        "https://platform.openai.com/account/rate-limits to learn more.",
    ),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", None, "Bad gateway."),
    503: ("service_unavailable_error", "server_is_overloaded", "The server is overloaded. Please try again later."),
    529: ("service_unavailable_error", "server_is_overloaded", "The server is overloaded. Please try again later."),
}


def openai_status_error(status: int) -> RequestRejected:
    kind, code, message = _OPENAI_STATUS.get(
        status, ("invalid_request_error" if status < 500 else "server_error", None, f"HTTP {status}")
    )
    return RequestRejected(status, message, kind, code=code)


#: DeepSeek's error types per status (its error-codes page names the statuses; a recorded 400 body repeats the
#: type as the code: ``{"type": "invalid_request_error", "code": "invalid_request_error"}``).
_DEEPSEEK_STATUS: Final[dict[int, tuple[str, str]]] = {
    400: ("invalid_request_error", "Invalid request body format."),
    401: ("authentication_error", "Authentication Fails, Your api key is invalid."),
    402: ("invalid_request_error", "Insufficient Balance"),
    422: ("invalid_request_error", "Invalid Parameters"),
    429: ("rate_limit_error", "Rate Limit Reached"),
    500: ("server_error", "Server Error"),
    503: ("server_error", "Server Overloaded"),
}


class ReasoningChat(OpenAIChat):
    """DeepSeek's Chat Completions (``POST /chat/completions``): ``thinking``, ``reasoning_content`` on assistant
    messages (required back on tool-call turns while thinking), cache hit/miss usage. Caches like OpenAI."""

    name: ClassVar[Api] = "deepseek"
    path = REASONING_PATH

    def parse(self, payload: Any, resume: Resume | None = None) -> Prompt:
        return parse_openai(payload, reasoning=True, resume=resume)

    def _message(
        self, said: str | None, refused: bool, calls: list[dict[str, Any]], reasoning: str | None
    ) -> dict[str, Any]:
        """DeepSeek's message: ``content``, ``reasoning_content`` while thinking, ``tool_calls`` when there are
        some; no ``refusal`` or ``annotations``."""
        message: dict[str, Any] = {"content": said, "role": "assistant"}
        if reasoning is not None:
            message["reasoning_content"] = reasoning or None
        if calls:
            message["tool_calls"] = calls
        return message

    def error_body(self, exc: RequestRejected, request_id: str | None) -> dict[str, Any]:
        body = openai_error(exc)
        if body["error"]["code"] is None:  # DeepSeek repeats the type as the code
            body["error"]["code"] = exc.kind
        return body

    def status_error(self, status: int) -> RequestRejected:
        kind, message = _DEEPSEEK_STATUS.get(status, ("invalid_request_error" if status < 500 else "server_error", ""))
        return RequestRejected(status, message or f"HTTP {status}", kind)

    def _completion_id(self, answer: Answer) -> str:
        h = answer.ids  # DeepSeek's ids are UUIDs
        return f"{h[24:32]}-{h[32:36]}-4{h[37:40]}-8{h[41:44]}-{h[44:56]}"

    def _service(self, prompt: Prompt) -> dict[str, Any]:
        return {"system_fingerprint": fingerprint(prompt.model)}

    def _usage(self, prompt: Prompt, answer: Answer, usage: CacheUsage, reasoning_tokens: int) -> dict[str, Any]:
        """Cache hits and misses (``prompt_tokens`` = hit + miss; ``prompt_tokens_details.cached_tokens`` repeats
        the hits) and, while thinking, ``completion_tokens_details.reasoning_tokens``."""
        total = prompt.tokens
        out: dict[str, Any] = {
            "completion_tokens": answer.output_tokens,
            "prompt_cache_hit_tokens": usage.read,
            "prompt_cache_miss_tokens": total - usage.read,
            "prompt_tokens": total,
            "prompt_tokens_details": {"cached_tokens": usage.read},
            "total_tokens": total + answer.output_tokens,
        }
        if prompt.thinking:
            out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return out
