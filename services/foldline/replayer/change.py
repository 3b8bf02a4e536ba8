"""What a replay changes in the recorded agent: system prompt, model, tools, call-config fields, pressure policy.

A field left unset keeps the recording's value *at every step*: the system prompt, tool specs and call config
of each replayed request are the ones its recorded request carried, so an unchanged replay reproduces a session
whose header changed along the way. A field that is set replaces it from the first replayed request on.

:meth:`Change.from_inputs` builds a change from what ``foldline replay`` is given — a system-prompt file, a
model, a ``MODULE:OBJECT`` tools reference, a JSON or TOML config file — and raises
:class:`~foldline.errors.InvalidChange` naming the input and the fix for anything it cannot use.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..core import codec
from ..core.header import CallConfig
from ..errors import InvalidChange
from ..loop.pressure import PressurePolicy
from ..loop.tools import Toolset

__all__ = ["CONFIG_FIELDS", "Change", "SystemSource", "ToolsSource", "load_tools", "read_config_file"]

SystemSource = str | Callable[[], str]
#: A toolset, or a function that builds one (called once for every run of the agent).
ToolsSource = Toolset | Callable[[], Toolset]

#: Call-config fields a change may set, by their logged names (docs/FORMAT.md §3.4) → CallConfig attribute.
CONFIG_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "provider": "provider",
        "model": "model",
        "temperature": "temperature",
        "maxTokens": "max_tokens",
        "stop": "stop",
        "reasoningEffort": "reasoning_effort",
        "cacheTtl": "cache_ttl",
        "promptCacheKey": "prompt_cache_key",
        "thinkingBudget": "thinking_budget",
        "stream": "stream",
    }
)


@dataclass(frozen=True)
class Change:
    """A change to the recorded agent. Every field unset (the default) replays the recorded agent itself.

    ``system``: the system prompt, or a function rendering it at each step (a hook). ``model``: the model.
    ``tools``: the agent's toolset (its specs replace the recorded ones; its functions run only past the
    divergence, with ``live``). ``config``: call-config fields by their logged names (``maxTokens``,
    ``temperature``, …; ``None`` removes a field). ``pressure``: the agent's own trim/compaction policy
    instead of the recording's trims and compactions.
    """

    system: SystemSource | None = None
    model: str | None = None
    tools: ToolsSource | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    pressure: PressurePolicy | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.config) - set(CONFIG_FIELDS))
        if unknown:
            raise InvalidChange(
                f"unknown call-config field(s) {', '.join(unknown)}; the fields are {', '.join(CONFIG_FIELDS)} "
                "(their logged names, docs/FORMAT.md §3.4)"
            )
        if self.model is not None and (not self.model.strip() or not self.model.isprintable()):
            raise InvalidChange(f"model {self.model!r} is not a model name: it must be printable and not blank")
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        self.apply(CallConfig("provider", "model"))  # every value checked now, not at the first step

    @property
    def empty(self) -> bool:
        """Whether this change changes nothing (a replay of the recorded agent)."""
        return (
            self.system is None
            and self.model is None
            and self.tools is None
            and not self.config
            and self.pressure is None
        )

    @classmethod
    def from_inputs(
        cls,
        *,
        system_file: Path | None = None,
        model: str | None = None,
        tools: str | None = None,
        config_file: Path | None = None,
    ) -> Change:
        """The change ``foldline replay`` is given: each input read and checked here."""
        system = read_system_file(system_file) if system_file is not None else None
        loaded = load_tools(tools) if tools is not None else None
        config = read_config_file(config_file) if config_file is not None else {}
        return cls(system=system, model=model, tools=loaded, config=config)

    def apply(self, config: CallConfig) -> CallConfig:
        """``config`` (a recorded step's) with this change's config fields and model."""
        changes: dict[str, Any] = {}
        for key, value in self.config.items():
            attr = CONFIG_FIELDS[key]
            changes[attr] = _config_value(key, value)
        if self.model is not None:
            changes["model"] = self.model
        if not changes:
            return config
        try:
            return config.with_overrides(**changes)
        except ValueError as exc:
            raise InvalidChange(f"the changed call config is invalid: {exc}") from None

    def describe(self) -> str:
        """One line: what is changed, or that the recorded agent is replayed as it was."""
        if self.empty:
            return "none (the recorded agent, unchanged)"
        parts: list[str] = []
        for key, value in self.to_json().items():
            if key == "system" and "bytes" in value:
                parts.append(f"system prompt ({value['bytes']} bytes, {value['digest'][:19]}…)")
            elif key == "config":
                parts.append("config " + ", ".join(f"{k}={v!r}" for k, v in value.items()))
            else:
                parts.append(f"{key} {value if isinstance(value, str) else codec.canonical_json(value).decode()}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """What is changed (values for the scalars; the system prompt by length and digest)."""
        out: dict[str, Any] = {}
        if isinstance(self.system, str):
            data = self.system.encode("utf-8")
            out["system"] = {"bytes": len(data), "digest": codec.digest_bytes(data)}
        elif self.system is not None:
            out["system"] = {"hook": _name(self.system)}
        if self.model is not None:
            out["model"] = self.model
        if self.tools is not None:
            out["tools"] = _name(self.tools)
        if self.config:
            out["config"] = dict(self.config)
        if self.pressure is not None:
            out["pressure"] = {"budgetTokens": self.pressure.budget_tokens}
        return out


def _name(obj: object) -> str:
    if isinstance(obj, Toolset):
        return "a Toolset of " + ", ".join(s.name for s in obj.specs())
    return getattr(obj, "__qualname__", type(obj).__name__)


def _config_value(key: str, value: Any) -> Any:
    """A config-file value as the CallConfig attribute holds it (``None`` unsets; ``stream`` defaults false)."""
    if value is None:
        if key in ("provider", "model"):
            raise InvalidChange(f"config field {key} cannot be removed: every call config names one")
        return False if key == "stream" else None
    if key in ("provider", "model", "reasoningEffort", "cacheTtl", "promptCacheKey"):
        if not isinstance(value, str):
            raise InvalidChange(f"config field {key} must be a string, got {value!r}")
        return value
    if key in ("maxTokens", "thinkingBudget"):
        if type(value) is not int:
            raise InvalidChange(f"config field {key} must be an integer, got {value!r}")
        return value
    if key == "temperature":
        if type(value) not in (int, float) or not math.isfinite(value):
            raise InvalidChange(f"config field temperature must be a number, got {value!r}")
        return float(value)
    if key == "stop":
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise InvalidChange(f"config field stop must be a list of strings, got {value!r}")
        return tuple(value) or None
    if type(value) is not bool:
        raise InvalidChange(f"config field stream must be true or false, got {value!r}")
    return value


def read_system_file(path: Path) -> str:
    """A system prompt file's UTF-8 text (an empty file removes the system prompt)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidChange(f"cannot read --system-file {path}: {exc.strerror or exc}; pass a readable file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidChange(
            f"--system-file {path} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); pass a text file"
        ) from None
    if "\x00" in text:
        raise InvalidChange(f"--system-file {path} holds NUL characters: it looks like a binary file")
    return text


def read_config_file(path: Path) -> dict[str, Any]:
    """Call-config fields from a JSON (``.json``) or TOML (any other name) file: one object of logged names."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidChange(f"cannot read --config-file {path}: {exc.strerror or exc}; pass a readable file") from None
    try:
        value: Any = codec.loads(raw) if path.suffix.lower() == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise InvalidChange(f"--config-file {path} is not valid {kind}: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidChange(
            f"--config-file {path} must hold one object of call-config fields, not {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(CONFIG_FIELDS))
    if unknown:
        raise InvalidChange(
            f"--config-file {path} names unknown call-config field(s) {', '.join(unknown)}; the fields are "
            f"{', '.join(CONFIG_FIELDS)}"
        )
    return dict(value)


@contextlib.contextmanager
def _working_directory_importable() -> Iterator[None]:
    """The current directory on ``sys.path`` while a tools module imports (as ``python -m`` has it)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def load_tools(reference: str) -> ToolsSource:
    """The toolset ``MODULE:OBJECT`` names: a :class:`Toolset`, or a function that returns one."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidChange(f"--tools {reference!r} must be MODULE:OBJECT (e.g. myagent.tools:toolset)")
    try:
        with _working_directory_importable():
            module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: whatever it raises while importing is the report
        raise InvalidChange(
            f"--tools {reference}: module {module_name!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidChange(f"--tools {reference}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, Toolset) or (callable(obj) and not isinstance(obj, type)):
        return obj
    raise InvalidChange(f"--tools {reference} is a {type(obj).__name__}, not a Toolset or a function that returns one")


def build_tools(source: ToolsSource) -> Toolset:
    """The toolset of one run: ``source`` itself, or what its function builds now."""
    if isinstance(source, Toolset):
        return source
    try:
        built = source()
    except Exception as exc:  # the user's factory
        raise InvalidChange(f"the tools function {_name(source)} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(built, Toolset):
        raise InvalidChange(f"the tools function {_name(source)} returned a {type(built).__name__}, not a Toolset")
    return built
