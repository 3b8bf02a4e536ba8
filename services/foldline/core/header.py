"""The request header: everything model-visible that is not history, and its fold."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from .frozen import FrozenDict, freeze_json

__all__ = [
    "CACHE_TTLS",
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


@dataclass(frozen=True, slots=True)
class CallConfig:
    """The call configuration of a conversation: provider, model, sampling scalars and whether answers stream."""

    provider: str
    model: str
    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    reasoning_effort: str | None = None
    cache_ttl: str | None = None
    prompt_cache_key: str | None = None
    thinking_budget: int | None = None
    stream: bool = False  # answer as server-sent events; logged, so the request's digest covers it

    def __post_init__(self) -> None:
        if not self.provider or not self.model:
            raise ValueError("config.provider and config.model must be non-empty")
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
            object.__setattr__(self, "stop", None)

    def with_overrides(self, **changes: Any) -> CallConfig:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: name, description and JSON-schema for its arguments."""

    name: str
    description: str
    input_schema: Mapping[str, Any] = field(default_factory=FrozenDict)  # frozen on construction

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("tool name must be non-empty")
        if not isinstance(self.input_schema, FrozenDict):
            object.__setattr__(self, "input_schema", _freeze_mapping(self.input_schema))


def _freeze_mapping(value: Mapping[str, Any]) -> FrozenDict:
    frozen = freeze_json(value)
    if not isinstance(frozen, FrozenDict):
        raise TypeError("a tool input_schema must be a JSON object")
    return frozen


@dataclass(frozen=True, slots=True)
class EpochHeader:
    """Call config, rendered system prompt and tool schemas; empty values are held as absent."""

    config: CallConfig
    system: str | None = None
    tools: tuple[ToolSpec, ...] | None = None

    def __post_init__(self) -> None:
        if self.system == "":
            object.__setattr__(self, "system", None)
        if self.tools is not None and len(self.tools) == 0:
            object.__setattr__(self, "tools", None)
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
