"""The request header: everything model-visible that is not history, and its fold."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

from .frozen import OrderedObject, freeze_ordered
from .records import Content, Nat, OrderedJson, Pos, Record

__all__ = [
    "CACHE_TTLS",
    "OUTPUT_NAME_PATTERN",
    "REASONING_EFFORTS",
    "CallConfig",
    "EpochHeader",
    "HeaderReason",
    "ToolSpec",
    "make_header",
    "header_equals",
]

HeaderReason = Literal["initial", "resume", "change"]
HEADER_REASONS: frozenset[str] = frozenset({"initial", "resume", "change"})
#: Logged reasoning-effort words. ``off`` (dsh's word) asks for no reasoning; each serializer maps a word to its
#: provider's vocabulary or refuses it with a ProviderError (docs/FORMAT.md §9).
REASONING_EFFORTS: frozenset[str] = frozenset({"off", "minimal", "low", "medium", "high", "xhigh", "max"})
#: Logged prompt-cache lifetimes: Anthropic's ``5m`` | ``1h`` and OpenAI's extended ``24h`` retention.
CACHE_TTLS: Mapping[str, float] = MappingProxyType({"5m": 300.0, "1h": 3600.0, "24h": 86400.0})
MIN_THINKING_BUDGET = 1024
#: What an output schema's name may be (the OpenAI APIs' rule for a response format's name).
OUTPUT_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


#: ``rule`` of the values a canonical header never holds (an empty system prompt, tool list or stop list).
_CANONICAL = {"rule": "header-canonical"}


class CallConfig(Record, frozen=True):
    """The call configuration of a conversation: provider, model, sampling scalars, whether answers stream and the
    shape the final answer must have.

    ``output_schema`` (with ``output_name``) asks for structured output: the answer's text is one JSON value that
    matches this JSON Schema, sent with each provider's native feature by the serializer versions that have one
    (docs/FORMAT.md §9.10; earlier versions refuse it). Like a tool's input schema it keeps its author's key order
    (an ordered JSON object, §1.9) and is model-visible content (sealed when encryption is on).
    """

    provider: str
    model: str
    temperature: float | None = None
    max_tokens: Pos | None = None
    stop: Annotated[tuple[str, ...], msgspec.Meta(min_length=1, extra=_CANONICAL)] | None = None
    reasoning_effort: str | None = None
    cache_ttl: str | None = None
    prompt_cache_key: str | None = None
    thinking_budget: Nat | None = None
    # answer as server-sent events; logged, so the request's digest covers it
    stream: Annotated[bool, msgspec.Meta(extra={**_CANONICAL, "true_only": True, "avro": {"nullable": True}})] = False
    # the JSON Schema the answer must match, and its name (both or neither): structured output
    output_schema: (
        Annotated[
            OrderedJson,
            msgspec.Meta(
                description="The answer's JSON schema object, in its author's key order.", extra={"content": True}
            ),
        ]
        | None
    ) = None
    output_name: str | None = None

    def __post_init__(self) -> None:
        if not self.provider or not self.model:
            raise ValueError("config.provider and config.model must be non-empty")
        if (self.output_schema is None) != (self.output_name is None):
            raise ValueError("config.outputSchema and config.outputName go together: give both or neither")
        if self.output_name is not None and not OUTPUT_NAME_PATTERN.fullmatch(self.output_name):
            raise ValueError(f"config.outputName must be 1 to 64 letters, digits, '_' or '-', got {self.output_name!r}")
        if self.output_schema is not None and not isinstance(self.output_schema, OrderedObject):
            try:
                schema = freeze_ordered(self.output_schema)
            except TypeError as exc:
                raise TypeError(f"config.outputSchema must be a JSON object ({exc})") from None
            msgspec.structs.force_setattr(self, "output_schema", schema)
        if self.temperature is not None and not (0.0 <= self.temperature <= 2.0):
            raise ValueError(f"config.temperature must be within [0, 2], got {self.temperature!r}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"config.maxTokens must be positive, got {self.max_tokens}")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"config.reasoningEffort must be one of {sorted(REASONING_EFFORTS)}, got {self.reasoning_effort!r}"
            )
        if self.cache_ttl is not None and self.cache_ttl not in CACHE_TTLS:
            raise ValueError(f"config.cacheTtl must be one of {sorted(CACHE_TTLS)}, got {self.cache_ttl!r}")
        if self.prompt_cache_key is not None and not self.prompt_cache_key:
            raise ValueError("config.promptCacheKey must be non-empty (omit it when unset)")
        if self.thinking_budget is not None and self.thinking_budget < MIN_THINKING_BUDGET:
            raise ValueError(f"config.thinkingBudget must be >= {MIN_THINKING_BUDGET}, got {self.thinking_budget}")
        if self.stop is not None and not self.stop:
            msgspec.structs.force_setattr(self, "stop", None)

    def with_overrides(self, **changes: Any) -> CallConfig:
        return msgspec.structs.replace(self, **changes)


class ToolSpec(Record, frozen=True):
    """A tool the model may call: name, description and JSON-schema for its arguments.

    ``input_schema`` keeps the key order its author gave, at every depth (an ordered JSON object,
    docs/FORMAT.md §1.9): pass the mapping as generated — ``pydantic.TypeAdapter(T).json_schema()`` or
    ``Model.model_json_schema()`` lists the properties in declaration order — and the model reads them in that
    order from every serializer version that keeps it (§9). Two specs whose schemas differ only in key order are
    different tools to a model, so they are different values (a header change).
    """

    name: str
    description: Content
    input_schema: Annotated[
        OrderedJson,
        msgspec.Meta(description="The JSON schema object as canonical JSON text.", extra={"content": True}),
    ] = msgspec.field(default_factory=OrderedObject)  # frozen, in its order, on construction

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tool name must be non-empty")
        if not isinstance(self.input_schema, OrderedObject):
            try:
                schema = freeze_ordered(self.input_schema)
            except TypeError as exc:
                raise TypeError(f"tool {self.name!r}: input_schema must be a JSON object ({exc})") from None
            msgspec.structs.force_setattr(self, "input_schema", schema)


class EpochHeader(Record, frozen=True):
    """Call config, rendered system prompt and tool schemas; empty values are held as absent."""

    config: CallConfig
    system: Annotated[str, msgspec.Meta(min_length=1, extra={**_CANONICAL, "content": True})] | None = None
    tools: Annotated[tuple[ToolSpec, ...], msgspec.Meta(min_length=1, extra=_CANONICAL)] | None = None

    def __post_init__(self) -> None:
        if self.system == "":
            msgspec.structs.force_setattr(self, "system", None)
        if self.tools is not None and len(self.tools) == 0:
            msgspec.structs.force_setattr(self, "tools", None)
        if self.tools is not None:
            names = [t.name for t in self.tools]
            if len(set(names)) != len(names):
                raise ValueError(f"tool names must be unique, got {names}")


def make_header(config: CallConfig, system: str | None = None, tools: Iterable[ToolSpec] | None = None) -> EpochHeader:
    """Build a canonical header (empty system / no tools become absent)."""
    return EpochHeader(config=config, system=system or None, tools=tuple(tools) if tools else None)


def header_equals(a: EpochHeader | None, b: EpochHeader | None) -> bool:
    """Value equality of two headers after canonicalization."""
    return a == b
