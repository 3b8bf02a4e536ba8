"""Which call-config settings a model accepts, from its provider's documentation — refused at configuration.

A setting the chosen model refuses would make every request of the session a 400 after it was logged, so the
loop checks the call config when an agent is built and again whenever a hook changes it
(:func:`check_call_config`, raising :class:`~foldline.errors.UnsupportedSetting`). The emulator answers the
same requests with the same 400s (:mod:`foldline.providers.emulator.anthropic_messages`), so both sides follow
this one table.

**Anthropic Messages** (Anthropic's models overview, its migration guide and its extended-thinking guide;
``AnthropicModel`` below):

* Claude Opus 4.7 and 4.8, Claude Fable 5, Claude Mythos 5 and Mythos Preview refuse ``temperature``,
  ``top_p`` and ``top_k`` in any request (400 "`temperature` is deprecated for this model."), and manual
  thinking (``thinking: {"type": "enabled", "budget_tokens": N}``): thinking is adaptive only. Fable and
  Mythos also refuse ``thinking: {"type": "disabled"}`` (their thinking is always on).
* Claude Sonnet 5 refuses a non-default ``temperature`` (anything but 1) and manual thinking.
* Every model: while thinking is on (enabled or adaptive), ``temperature`` may only be 1.
* Claude 4 models take ``temperature`` or ``top_p``, not both (foldline's call config has no ``top_p``).
* A Claude model id newer than the ones above (any family at version 5 or later, Opus 4.9 and up) is held to
  the strictest rule; an id that is not a Claude model id (a gateway's alias, the emulator's ``model-x``) gets
  only the rule that holds for every model.

How foldline's config reaches the wire (docs/FORMAT.md §9.1): ``temperature`` is sent whenever it is set;
``thinkingBudget`` sends manual thinking, ``reasoningEffort`` ``off`` sends thinking disabled and any other
effort adaptive thinking — by serializer v2 and later; v1 sends neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from ..core.header import CallConfig
from ..errors import UnsupportedSetting
from .base import Serializer

__all__ = ["AnthropicModel", "anthropic_model", "check_call_config"]

_CLAUDE: Final = re.compile(r"^claude-(?P<family>opus|sonnet|haiku|fable|mythos)-(?P<major>\d+)(?:-(?P<minor>\d))?\b")
_PREVIEW: Final = frozenset({"claude-mythos-preview"})

Sampling = Literal["any", "default-only", "none"]


@dataclass(frozen=True, slots=True)
class AnthropicModel:
    """What a Messages API model accepts: ``sampling`` — any value, only the default (1), or none at all;
    ``manual_thinking`` — ``thinking.type: enabled`` with a budget; ``thinking_off`` — ``thinking.type:
    disabled``; ``claude4`` — a Claude 4 or later model (``temperature`` and ``top_p`` not both). And what it
    does without a ``thinking`` field: ``thinks_by_default`` (Sonnet 5 thinks adaptively, Fable always)."""

    sampling: Sampling = "any"
    manual_thinking: bool = True
    thinking_off: bool = True
    claude4: bool = False
    thinks_by_default: bool = False


def anthropic_model(model: str) -> AnthropicModel:
    """The rules of a Messages API model id (aliases and dated snapshots alike), per the module docstring."""
    if model in _PREVIEW:
        return AnthropicModel("none", manual_thinking=False, thinking_off=False, claude4=True, thinks_by_default=True)
    m = _CLAUDE.match(model)
    if m is None:
        return AnthropicModel()
    family, version = m.group("family"), (int(m.group("major")), int(m.group("minor") or 0))
    if family in ("fable", "mythos"):
        return AnthropicModel("none", manual_thinking=False, thinking_off=False, claude4=True, thinks_by_default=True)
    if family == "opus" and version >= (4, 7):
        return AnthropicModel("none", manual_thinking=False, claude4=True)
    if version >= (5, 0):
        return AnthropicModel("default-only", manual_thinking=False, claude4=True, thinks_by_default=True)
    return AnthropicModel(claude4=version >= (4, 0))


def _thinking(serializer: Serializer, config: CallConfig) -> Literal["enabled", "adaptive", "disabled"] | None:
    """The ``thinking.type`` the serializer writes for ``config`` (None: no ``thinking`` field)."""
    if serializer.name != "anthropic-messages" or serializer.version < 2:
        return None
    if config.thinking_budget is not None:
        return "enabled"
    if config.reasoning_effort == "off":
        return "disabled"
    return "adaptive" if config.reasoning_effort is not None else None


def check_call_config(serializer: Serializer, config: CallConfig) -> None:
    """Refuse a setting the model will answer 400 to, before anything is logged or sent."""
    if serializer.name != "anthropic-messages":
        return
    rules = anthropic_model(config.model)
    model = config.model
    temperature = config.temperature
    thinking = _thinking(serializer, config)
    if temperature is not None and rules.sampling == "none":
        raise UnsupportedSetting(
            model,
            "temperature",
            f"anthropic: {model} takes no temperature (the Messages API answers 400 'temperature is deprecated for "
            "this model'); leave config.temperature unset and steer the model with the prompt or reasoningEffort",
        )
    if temperature is not None and temperature != 1.0 and rules.sampling == "default-only":
        raise UnsupportedSetting(
            model,
            "temperature",
            f"anthropic: {model} takes only the default temperature (1); leave config.temperature unset or set it to 1",
        )
    if temperature is not None and temperature != 1.0 and thinking in ("enabled", "adaptive"):
        raise UnsupportedSetting(
            model,
            "temperature",
            f"anthropic: {model} with thinking on (config."
            f"{'thinkingBudget' if thinking == 'enabled' else 'reasoningEffort'}) takes temperature 1 only, not "
            f"{temperature:g}; unset config.temperature, or turn thinking off (reasoningEffort 'off')",
        )
    if thinking == "enabled" and not rules.manual_thinking:
        raise UnsupportedSetting(
            model,
            "thinkingBudget",
            f"anthropic: {model} thinks adaptively only (a thinking budget is answered 400); unset "
            "config.thinkingBudget and set config.reasoningEffort instead",
        )
    if thinking == "disabled" and not rules.thinking_off:
        raise UnsupportedSetting(
            model,
            "reasoningEffort",
            f"anthropic: {model} always thinks (thinking disabled is answered 400); use another reasoningEffort",
        )
