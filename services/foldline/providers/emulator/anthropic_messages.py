"""Anthropic Messages as the emulator serves it (``POST /v1/messages``): the request parser and the answer.

The parser checks a body the way the API does — unknown keys at every level (the API answers "Extra inputs are
not permitted"), value ranges, which content block kinds each role may carry, ``tool_result`` blocks answering
every ``tool_use`` block of the previous message, at most ``max_breakpoints`` ``cache_control`` markers,
thinking signatures (:mod:`.sealing`), with thinking on a final assistant turn that starts with a thinking
block, and the sampling and thinking settings the model takes (:mod:`foldline.providers.model_rules`) — and
builds the :class:`~.prompt.Prompt` with each marker's TTL on its block. A new content block kind is one entry
in :data:`_MESSAGE_BLOCKS`.

The answer has the live API's shape: ``usage`` with the cache write split by TTL (``cache_creation``),
``service_tier`` and ``inference_geo``; ``tool_use`` blocks name their ``caller``; error bodies carry the
``request_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, assert_never

from ..model_rules import anthropic_model
from . import checks
from .answer import Answer, AnswerPart
from .cache import AnthropicCachePolicy, CacheUsage, PrefixCache
from .checks import RequestRejected
from .prompt import Prompt, Resume
from .script import ImagePart, Part, ReasoningPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from .sealing import sign_thinking, valid_redacted, valid_signature
from .structured import anthropic_format
from .wire_api import WireApi

__all__ = ["PATH", "AnthropicMessages", "parse_anthropic"]

PATH: Final = "/v1/messages"

_TOP: Final = frozenset(
    {
        "model", "max_tokens", "messages", "system", "tools", "temperature", "stop_sequences", "cache_control",
        "metadata", "tool_choice", "top_p", "top_k", "stream", "thinking", "output_config", "service_tier",
    }
)  # fmt: skip


def _ttl(value: Any, where: str, policy: AnthropicCachePolicy) -> float | None:
    """The TTL a ``cache_control`` marker asks for, or None without one."""
    if value is None:
        return None
    cc = checks.json_object(value, where)
    checks.exact_keys(cc, frozenset({"type", "ttl"}), where)
    if cc.get("type") != "ephemeral":
        raise RequestRejected(400, f"{where}.type: Input should be 'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise RequestRejected(400, f"{where}.ttl: Input should be '5m' or '1h'")
    return policy.long_ttl_seconds if ttl == "1h" else policy.ttl_seconds


# ---------------------------------------------------------------------------- content blocks


@dataclass(slots=True)
class _Pairing:
    """The ``tool_use`` ids of the previous message (what a ``tool_result`` may answer) and of this one."""

    previous: set[str] = field(default_factory=set)
    current: set[str] = field(default_factory=set)
    key: bytes = b""  # the emulator's signing key, to check thinking signatures
    answered: set[str] = field(default_factory=set)  # the previous message's ids this one's tool_results answer

    def check_answered(self, previous_index: int) -> None:
        """Every ``tool_use`` of the previous message needs a ``tool_result`` in this one, as the API requires."""
        missing = sorted(self.previous - self.answered)
        if missing:
            raise RequestRejected(
                400,
                f"messages.{previous_index}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
                "block in the next message.",
            )


def _text(block: dict[str, Any], where: str) -> TextPart:
    checks.exact_keys(block, frozenset({"type", "text", "cache_control", "citations"}), where)
    text = checks.string(block.get("text"), f"{where}.text")
    if not text:
        raise RequestRejected(400, f"{where}: text content blocks must be non-empty")
    return TextPart(text)


def _image(block: dict[str, Any], where: str) -> ImagePart:
    checks.exact_keys(block, frozenset({"type", "source", "cache_control"}), where)
    source = checks.json_object(block.get("source"), f"{where}.source")
    if source.get("type") != "base64":
        raise RequestRejected(400, f"{where}.source: the emulator only takes base64 image sources")
    media_type = checks.string(source.get("media_type"), f"{where}.source.media_type")
    data = checks.decode_base64(checks.string(source.get("data"), f"{where}.source.data"), f"{where}.source.data")
    return checks.decode_image(data, media_type, where)


def _result_content(block: dict[str, Any], where: str) -> TextPart | ImagePart:
    """A block inside a ``tool_result``: text or image (their ``cache_control`` is not a breakpoint)."""
    kind = block.get("type")
    if kind == "text":
        return _text(block, where)
    if kind == "image":
        return _image(block, where)
    raise RequestRejected(400, f"{where}.type: unexpected content block type {kind!r}")


def _tool_use(block: dict[str, Any], where: str, pairing: _Pairing) -> ToolCallPart:
    checks.exact_keys(block, frozenset({"type", "id", "name", "input", "cache_control", "caller"}), where)
    if "caller" in block:  # what the answer said (the SDK's ``to_param()`` sends it back)
        caller = checks.json_object(block["caller"], f"{where}.caller")
        checks.string(caller.get("type"), f"{where}.caller.type")
    call = ToolCallPart(
        checks.string(block.get("id"), f"{where}.id"),
        checks.string(block.get("name"), f"{where}.name"),
        block.get("input"),
    )
    checks.json_object(call.arguments, f"{where}.input")
    pairing.current.add(call.id)
    return call


def _tool_result(block: dict[str, Any], where: str, pairing: _Pairing) -> ToolResultPart:
    checks.exact_keys(block, frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}), where)
    call_id = checks.string(block.get("tool_use_id"), f"{where}.tool_use_id")
    if call_id not in pairing.previous:
        raise RequestRejected(
            400, f"{where}: unexpected tool_use_id {call_id!r}: it must answer a tool_use of the previous message"
        )
    pairing.answered.add(call_id)
    content = block.get("content", [])
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else []
    inner = tuple(_result_content(item, at) for at, item in checks.objects(content, f"{where}.content"))
    return ToolResultPart(call_id, inner, bool(block.get("is_error", False)))


def _thinking(block: dict[str, Any], where: str, pairing: _Pairing) -> ReasoningPart:
    checks.exact_keys(block, frozenset({"type", "thinking", "signature"}), where)
    text = checks.string(block.get("thinking"), f"{where}.thinking")
    signature = checks.string(block.get("signature"), f"{where}.signature")
    if not valid_signature(pairing.key, text, signature):
        raise RequestRejected(400, f"{where}: Invalid `signature` in `thinking` block")
    return ReasoningPart(text)


def _redacted_thinking(block: dict[str, Any], where: str, pairing: _Pairing) -> ReasoningPart:
    checks.exact_keys(block, frozenset({"type", "data"}), where)
    if not valid_redacted(pairing.key, checks.string(block.get("data"), f"{where}.data")):
        raise RequestRejected(400, f"{where}: Invalid `data` in `redacted_thinking` block")
    return ReasoningPart("")


_BlockParser = Callable[[dict[str, Any], str, _Pairing], Part]

#: Content block kinds of a message: the one role that may carry each (None: both) and its parser.
_MESSAGE_BLOCKS: Final[dict[str, tuple[Literal["user", "assistant"] | None, _BlockParser]]] = {
    "text": (None, lambda block, where, _: _text(block, where)),
    "image": ("user", lambda block, where, _: _image(block, where)),
    "tool_use": ("assistant", _tool_use),
    "tool_result": ("user", _tool_result),
    "thinking": ("assistant", _thinking),
    "redacted_thinking": ("assistant", _redacted_thinking),
}
_THINKING_KINDS: Final = frozenset({"thinking", "redacted_thinking"})
_EFFORTS: Final = frozenset({"low", "medium", "high", "xhigh", "max"})


# ---------------------------------------------------------------------------- the request


def _add_tools(prompt: Prompt, tools: Any, policy: AnthropicCachePolicy) -> None:
    for where, tool in checks.objects(tools, "tools"):
        checks.exact_keys(tool, frozenset({"name", "description", "input_schema", "cache_control", "type"}), where)
        schema = checks.json_object(tool.get("input_schema"), f"{where}.input_schema")
        if schema.get("type") != "object":
            raise RequestRejected(400, f"{where}.input_schema.type: Input should be 'object'")
        td = ToolDef(checks.string(tool.get("name"), f"{where}.name"), str(tool.get("description", "")), schema)
        if any(t.name == td.name for t in prompt.tools):
            raise RequestRejected(400, f"{where}.name: tool names must be unique")
        prompt.add_tool(td, _ttl(tool.get("cache_control"), f"{where}.cache_control", policy))


def _add_system(prompt: Prompt, system: Any, policy: AnthropicCachePolicy) -> None:
    if isinstance(system, str):
        if system:
            prompt.add_system_block(system, marked=True)
        return
    if system is None:
        return
    for i, (where, blk) in enumerate(checks.objects(system, "system")):
        checks.exact_keys(blk, frozenset({"type", "text", "cache_control"}), where)
        if blk.get("type") != "text":
            raise RequestRejected(400, f"{where}.type: Input should be 'text'")
        text = checks.string(blk.get("text"), f"{where}.text")
        prompt.add_system_block(
            text, marked=i == 0, ttl=_ttl(blk.get("cache_control"), f"{where}.cache_control", policy)
        )


def _final_turn_starts_with_thinking(messages: list[Any], first: int = 0) -> None:
    """With thinking on, the assistant message before the last tool results must start with a thinking block
    (``messages`` are the request's from index ``first`` on)."""
    if len(messages) < 2 or not isinstance(messages[-1], dict) or messages[-1].get("role") != "user":
        return
    content = messages[-1].get("content")
    if not isinstance(content, list) or not any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    ):
        return
    at = len(messages) - 2
    opening = (messages[at].get("content") or [{}])[0] if isinstance(messages[at], dict) else {}
    kind = opening.get("type") if isinstance(opening, dict) else None
    if kind not in _THINKING_KINDS:
        raise RequestRejected(
            400,
            f"messages.{first + at}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{kind}`. "
            "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
            "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
            "previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking",
        )


ThinkingMode = Literal["enabled", "adaptive", "disabled"]


def _thinking_config(req: dict[str, Any], model: str, max_tokens: int) -> ThinkingMode | None:
    """The request's ``thinking.type`` (None: no setting), checked against what the model takes."""
    config = req.get("thinking")
    rules = anthropic_model(model)
    if (effort := req.get("output_config")) is not None:
        oc = checks.json_object(effort, "output_config")
        checks.exact_keys(oc, frozenset({"effort", "format"}), "output_config")
        if oc.get("effort") is not None and oc.get("effort") not in _EFFORTS:
            raise RequestRejected(
                400, "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
            )
    if config is None or config == {}:  # an empty object is taken as no setting
        return None
    tc = checks.json_object(config, "thinking")
    kind = tc.get("type")
    if kind == "enabled":
        checks.exact_keys(tc, frozenset({"type", "budget_tokens", "display"}), "thinking.enabled")
        if not rules.manual_thinking:
            raise RequestRejected(
                400,
                "thinking.type.enabled is not supported for this model. Use thinking.type.adaptive and "
                "output_config.effort to control thinking behavior.",
            )
        budget: Any = tc.get("budget_tokens")
        if not checks.positive_int(budget) or budget < 1024:
            raise RequestRejected(400, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if budget >= max_tokens:
            raise RequestRejected(400, "`max_tokens` must be greater than `thinking.budget_tokens`")
        return "enabled"
    if kind in ("adaptive", "disabled"):
        checks.exact_keys(tc, frozenset({"type", "display"}), f"thinking.{kind}")
        if kind == "disabled" and not rules.thinking_off:
            raise RequestRejected(400, "thinking.type.disabled is not supported for this model; omit `thinking`.")
        return "adaptive" if kind == "adaptive" else "disabled"
    raise RequestRejected(400, "thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'")


def _sampling(req: dict[str, Any], model: str, thinking: bool) -> None:
    """``temperature`` (0..1), ``top_p`` and ``top_k`` as the model takes them (:mod:`..model_rules`)."""
    rules = anthropic_model(model)
    temperature = req.get("temperature")
    if temperature is not None and not checks.number_within(temperature, 1):
        raise RequestRejected(400, "temperature: Input should be less than or equal to 1")
    given = [k for k in ("temperature", "top_p", "top_k") if req.get(k) is not None]
    if given and rules.sampling == "none":
        raise RequestRejected(400, f"`{given[0]}` is deprecated for this model.")
    if rules.sampling == "default-only" and given and any(req[k] != _SAMPLING_DEFAULTS[k] for k in given):
        raise RequestRejected(400, f"`{given[0]}` is deprecated for this model; only its default is accepted.")
    if rules.claude4 and "temperature" in given and "top_p" in given:
        raise RequestRejected(
            400, "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
        )
    if thinking and temperature is not None and temperature != 1:
        raise RequestRejected(
            400,
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking",
        )


_SAMPLING_DEFAULTS: Final[dict[str, Any]] = {"temperature": 1, "top_p": 1, "top_k": None}


def _add_messages(
    prompt: Prompt, messages: list[Any], policy: AnthropicCachePolicy, key: bytes, resume: Resume | None
) -> None:
    first = 0 if resume is None else resume.messages
    pairing = _Pairing(key=key) if resume is None else _Pairing(previous=set(resume.state), key=key)
    if resume is not None:
        prompt.resume(resume)
    for index, (where, msg) in enumerate(checks.objects(messages, "messages", start=first), start=first):
        checks.exact_keys(msg, frozenset({"role", "content"}), where)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise RequestRejected(400, f"{where}.role: Input should be 'user' or 'assistant'")
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts: list[Part] = []
        ttls: list[float | None] = []
        for at, blk in checks.objects(content, f"{where}.content"):
            kind = blk.get("type")
            if not isinstance(kind, str) or kind not in _MESSAGE_BLOCKS:
                raise RequestRejected(400, f"{at}.type: unexpected content block type {kind!r}")
            only, parse_block = _MESSAGE_BLOCKS[kind]
            if only is not None and role != only:
                raise RequestRejected(400, f"{at}: {kind} blocks are only allowed in {only} messages")
            parts.append(parse_block(blk, at, pairing))
            ttls.append(_ttl(blk.get("cache_control"), f"{at}.cache_control", policy))
        if index:
            pairing.check_answered(index - 1)
        prompt.add_turn(role, parts, ttls)
        prompt.mark(frozenset(pairing.current))
        pairing = _Pairing(previous=pairing.current, key=key)


def parse_anthropic(body: Any, policy: AnthropicCachePolicy, key: bytes = b"", resume: Resume | None = None) -> Prompt:
    """A Messages body; ``resume``: its messages continue a prefix parsed before (``body`` holds the rest)."""
    req = checks.request_body(body, _TOP)
    model = checks.string(req.get("model"), "model")
    max_tokens: Any = req.get("max_tokens")
    if not checks.positive_int(max_tokens):
        raise RequestRejected(400, "max_tokens: Field required (a positive integer)")
    prompt = Prompt("anthropic", model, max_tokens=max_tokens)
    stop = req.get("stop_sequences", [])
    prompt.stop = tuple(checks.string(s, "stop_sequences[]") for s in checks.array(stop, "stop_sequences"))
    mode = _thinking_config(req, model, max_tokens)
    if mode is None:
        prompt.thinking = "thinking" in model or anthropic_model(model).thinks_by_default
    else:
        prompt.thinking = mode != "disabled"
    _sampling(req, model, prompt.thinking)
    _add_tools(prompt, req.get("tools", []), policy)
    _add_system(prompt, req.get("system"), policy)
    _add_messages(prompt, checks.message_list(req), policy, key, resume)
    prompt.output = anthropic_format(req)
    if prompt.thinking:
        if resume is None:
            _final_turn_starts_with_thinking(req["messages"])
        else:
            _final_turn_starts_with_thinking([resume.last, *req["messages"]], resume.messages - 1)
    if (auto := _ttl(req.get("cache_control"), "cache_control", policy)) is not None:
        prompt.mark_last_block(auto)
    if (found := len(prompt.breakpoints())) > policy.max_breakpoints:
        raise RequestRejected(
            400, f"A maximum of {policy.max_breakpoints} blocks with cache_control may be provided. Found {found}."
        )
    return prompt


# ---------------------------------------------------------------------------- the answer


def _answer_block(answer: Answer, index: int, part: AnswerPart, key: bytes) -> dict[str, Any]:
    match part:
        case ReasoningPart(text=text):
            return {"signature": sign_thinking(key, text), "thinking": text, "type": "thinking"}
        case TextPart(text=text):
            return {"text": text, "type": "text"}
        case ToolCallPart(name=name, arguments=arguments):
            call_id = answer.call_id("toolu_emu_", index)
            return {"caller": {"type": "direct"}, "id": call_id, "input": arguments, "name": name, "type": "tool_use"}
        case _:
            assert_never(part)


class AnthropicMessages(WireApi[AnthropicCachePolicy]):
    """The Messages API: ``x-api-key``, a required ``anthropic-version``, explicit cache breakpoints."""

    name = "anthropic"
    path = PATH

    def __init__(self, policy: AnthropicCachePolicy, key: bytes = b"") -> None:
        super().__init__(policy)
        self.key = key

    def credential(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("x-api-key")

    def check_headers(self, headers: Mapping[str, str]) -> None:
        if "anthropic-version" not in headers:
            raise RequestRejected(400, "anthropic-version: header is required")

    resumable = True

    def parse(self, payload: Any, resume: Resume | None = None) -> Prompt:
        return parse_anthropic(payload, self.policy, self.key, resume)

    def account(self, cache: PrefixCache, prompt: Prompt) -> CacheUsage:
        return cache.account_breakpoints(
            self.name,
            prompt.model,
            prompt.blocks,
            prompt.digests()[0],
            self.policy,
            breakpoints=prompt.breakpoints(),
            tokens_through=prompt.tokens_through,
        )

    def render(self, prompt: Prompt, answer: Answer, usage: CacheUsage, clock: Callable[[], float]) -> dict[str, Any]:
        return {
            "content": [_answer_block(answer, k, part, self.key) for k, part in enumerate(answer.content)],
            "id": answer.message_id("msg_emu_"),
            "model": prompt.model,
            "role": "assistant",
            "stop_reason": answer.stop_reason,
            "stop_sequence": answer.stop_sequence,
            "type": "message",
            "usage": {
                "cache_creation": {
                    "ephemeral_1h_input_tokens": usage.write_1h,
                    "ephemeral_5m_input_tokens": usage.write - usage.write_1h,
                },
                "cache_creation_input_tokens": usage.write,
                "cache_read_input_tokens": usage.read,
                "inference_geo": "not_available",
                "input_tokens": prompt.tokens - usage.read - usage.write,
                "output_tokens": answer.output_tokens,
                "service_tier": "standard",
            },
        }

    def error_body(self, exc: RequestRejected, request_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"error": {"message": exc.message, "type": exc.kind}, "type": "error"}
        if request_id is not None:
            body["request_id"] = request_id
        return body

    def status_error(self, status: int) -> RequestRejected:
        kind = _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return RequestRejected(status, _STATUS_MESSAGES.get(kind, kind.replace("_", " ").capitalize()), kind)


#: The error type of each status (Anthropic's errors page; any other 4xx is ``invalid_request_error``).
_STATUS_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUS_MESSAGES: Final = {
    "authentication_error": "invalid x-api-key",
    "rate_limit_error": "This request would exceed the rate limit for your organization. Please try again later.",
    "api_error": "Internal server error",
    "overloaded_error": "Overloaded",
    "timeout_error": "Request timed out",
}
