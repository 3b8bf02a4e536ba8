"""Which call-config settings a model accepts: refused at configuration, and answered 400 by the emulator alike."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig
from foldline.errors import UnsupportedSetting
from foldline.loop import Agent, AgentOptions
from foldline.providers.anthropic import AnthropicProvider
from foldline.providers.emulator import Emulator, EmulatorTransport, ToolLoopScript
from foldline.providers.model_rules import AnthropicModel, anthropic_model, check_call_config
from foldline.providers.registry import ANTHROPIC_MESSAGES_V1, ANTHROPIC_MESSAGES_V3, OPENAI_CHAT_V2

from .helpers import request, user


@pytest.mark.parametrize(
    ("model", "rules"),
    [
        ("claude-haiku-4-5", AnthropicModel(claude4=True)),
        ("claude-haiku-4-5-20251001", AnthropicModel(claude4=True)),
        ("claude-sonnet-4-6", AnthropicModel(claude4=True)),
        ("claude-opus-4-6", AnthropicModel(claude4=True)),
        ("claude-opus-4-20250514", AnthropicModel(claude4=True)),
        ("claude-opus-4-7", AnthropicModel("none", manual_thinking=False, claude4=True)),
        ("claude-opus-4-8", AnthropicModel("none", manual_thinking=False, claude4=True)),
        (
            "claude-sonnet-5",
            AnthropicModel("default-only", manual_thinking=False, claude4=True, thinks_by_default=True),
        ),
        (
            "claude-fable-5",
            AnthropicModel("none", manual_thinking=False, thinking_off=False, claude4=True, thinks_by_default=True),
        ),
        (
            "claude-mythos-preview",
            AnthropicModel("none", manual_thinking=False, thinking_off=False, claude4=True, thinks_by_default=True),
        ),
        ("claude-3-7-sonnet-20250219", AnthropicModel()),
        ("model-x", AnthropicModel()),
    ],
)
def test_the_documented_rules_of_each_model(model: str, rules: AnthropicModel) -> None:
    assert anthropic_model(model) == rules


#: (model, config overrides, serializer, the setting refused or None)
CASES: list[tuple[str, dict[str, Any], Any, str | None]] = [
    ("claude-haiku-4-5", {"temperature": 0.3}, ANTHROPIC_MESSAGES_V3, None),
    ("claude-opus-4-8", {"temperature": 0.3}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-opus-4-7", {"temperature": 1.0}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-sonnet-5", {"temperature": 0.3}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-sonnet-5", {"temperature": 1.0}, ANTHROPIC_MESSAGES_V3, None),
    ("claude-sonnet-4-5", {"temperature": 0.3, "reasoning_effort": "high"}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-sonnet-4-5", {"temperature": 0.3, "thinking_budget": 1024}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-sonnet-4-5", {"temperature": 0.3, "reasoning_effort": "off"}, ANTHROPIC_MESSAGES_V3, None),
    ("claude-sonnet-4-5", {"temperature": 0.3, "reasoning_effort": "high"}, ANTHROPIC_MESSAGES_V1, None),
    ("model-x", {"temperature": 0.3, "reasoning_effort": "high"}, ANTHROPIC_MESSAGES_V3, "temperature"),
    ("claude-opus-4-7", {"thinking_budget": 1024}, ANTHROPIC_MESSAGES_V3, "thinkingBudget"),
    ("claude-opus-4-6", {"thinking_budget": 1024}, ANTHROPIC_MESSAGES_V3, None),
    ("claude-fable-5", {"reasoning_effort": "off"}, ANTHROPIC_MESSAGES_V3, "reasoningEffort"),
    ("claude-opus-4-8", {"reasoning_effort": "off"}, ANTHROPIC_MESSAGES_V3, None),
    ("gpt-5", {"temperature": 0.3, "reasoning_effort": "high"}, OPENAI_CHAT_V2, None),
]


@pytest.mark.parametrize(("model", "overrides", "serializer", "refused"), CASES)
def test_the_check_refuses_what_the_emulated_api_answers_400_to(
    model: str, overrides: dict[str, Any], serializer: Any, refused: str | None
) -> None:
    config = CallConfig("anthropic", model, max_tokens=4096, **overrides)
    if refused is None:
        check_call_config(serializer, config)
    else:
        with pytest.raises(UnsupportedSetting) as caught:
            check_call_config(serializer, config)
        assert (caught.value.model, caught.value.setting) == (model, refused)
        assert model in str(caught.value)
    if serializer.name != "anthropic-messages":
        return
    # the emulator, following the providers' documentation too, answers exactly these bodies 400
    body = serializer.serialize(request([user("hi")], model=model, max_tokens=4096, **overrides), None)
    headers = {"anthropic-version": "2023-06-01"}
    answer = Emulator().handle("POST", "/v1/messages", headers, body)
    assert answer.status == (200 if refused is None else 400), answer.body
    if refused is not None:
        assert json.loads(answer.body)["error"]["type"] == "invalid_request_error"


def test_an_agent_is_not_built_for_a_setting_its_model_refuses_and_nothing_is_written() -> None:
    log = MemoryEventLog()
    provider = AnthropicProvider(EmulatorTransport(Emulator()), None, "http://emulator.invalid")
    options = AgentOptions(config=CallConfig("anthropic", "claude-opus-4-8", max_tokens=256, temperature=0.2))
    with pytest.raises(UnsupportedSetting, match="takes no temperature"):
        Agent("s", log, provider, options)
    assert log.read("s") == []


def test_a_request_hook_cannot_choose_a_refused_setting_and_nothing_is_sent() -> None:
    emulator = Emulator(ToolLoopScript(tool_steps=0))
    provider = AnthropicProvider(EmulatorTransport(emulator), None, "http://emulator.invalid")
    agent = Agent("s", MemoryEventLog(), provider, AgentOptions(config=CallConfig("anthropic", "claude-opus-4-8")))
    agent.on_request(lambda config: config.with_overrides(temperature=0.5))
    with pytest.raises(UnsupportedSetting):
        asyncio.run(agent.run_turn("hi"))
    assert emulator.received == 0
