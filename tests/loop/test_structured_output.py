"""Structured output end to end: an output type in the logged config, each wire's native field, the emulator's
JSON answer validated and returned typed, a wrong answer sent back (logged) or raised, and every request verified."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import orjson
import pydantic
import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig, RequestHeader, TurnEnd
from foldline.core.events import UserMessage
from foldline.core.frozen import OrderedObject
from foldline.errors import ConfigError, OutputInvalid, ProviderError
from foldline.loop import OUTPUT_RETRY_SOURCE, Agent, AgentOptions, OutputType, Toolset
from foldline.providers.anthropic import ANTHROPIC_MESSAGES_V4, AnthropicProvider
from foldline.providers.emulated import EMULATOR_BASE_URL, emulated_provider
from foldline.providers.emulator import Conversation, Emulator, Reply, TextPart, ToolLoopScript
from foldline.providers.emulator.transport import EmulatorTransport
from foldline.replay.verify import verify_events
from tests.factories import CapturingProvider

WIRES: dict[str, tuple[Any, str]] = {
    "anthropic": ("anthropic", "claude-emulated"),
    "openai": ("openai", "gpt-emulated"),
    "openai-responses": ("openai-responses", "gpt-emulated"),
    "deepseek": ("deepseek", "deepseek-chat"),
}


class Wind(pydantic.BaseModel):
    speed: float
    bearing: int


class Weather(pydantic.BaseModel):
    city: str
    temperature: int
    conditions: Literal["sunny", "rain", "snow"]
    wind: Wind


def _agent(
    wire: str, log: MemoryEventLog, script: Any = None, output: OutputType[Any] | None = None, sid: str = "s"
) -> tuple[Agent, CapturingProvider]:
    _provider_name, model = WIRES[wire]
    emulator = Emulator(script or ToolLoopScript(tool_steps=1))
    provider = CapturingProvider(emulated_provider(wire, emulator=emulator))  # type: ignore[arg-type]
    tools = Toolset()

    @tools.tool
    def lookup(city: str) -> str:
        """Look up the latest reading of a city."""
        return f"{city}: 12 degrees, rain"

    config = CallConfig(provider.name, model, max_tokens=512)
    return Agent(
        sid, log, provider, AgentOptions(config, system="You report weather.", tools=tools, output=output)
    ), provider


def _verified(log: MemoryEventLog, sid: str = "s") -> None:
    report = verify_events(sid, log.read(sid))
    assert report.ok, report


@pytest.mark.parametrize("wire", sorted(WIRES))
def test_an_output_type_is_logged_sent_natively_answered_and_returned_typed(wire: str) -> None:
    log = MemoryEventLog()
    agent, provider = _agent(wire, log, output=OutputType(Weather))
    result = asyncio.run(agent.run_turn("Weather in Lyon?"))
    assert result.reason == "completed"
    assert isinstance(result.output, Weather)
    assert Weather.model_validate_json(result.text) == result.output
    # the header config carries the schema, in declaration order
    header = next(e.data for e in log.read("s") if isinstance(e.data, RequestHeader)).header
    schema = header.config.output_schema
    assert isinstance(schema, OrderedObject)
    assert header.config.output_name == "Weather"
    properties = schema["properties"]
    assert isinstance(properties, OrderedObject)
    assert list(properties) == ["city", "temperature", "conditions", "wind"]
    # every request carried the native field (the tool step too)
    assert len(provider.bodies) == 2
    for raw in provider.bodies:
        body = orjson.loads(raw)
        match wire:
            case "anthropic":
                assert body["output_config"]["format"]["type"] == "json_schema"
            case "openai":
                assert body["response_format"]["json_schema"]["name"] == "Weather"
            case "openai-responses":
                assert body["text"]["format"]["strict"] is True
            case _:
                assert body["response_format"] == {"type": "json_object"}
    _verified(log)


def test_a_turn_asks_for_its_own_output_type_and_the_next_turn_drops_it_as_a_logged_change() -> None:
    log = MemoryEventLog()
    agent, _ = _agent("anthropic", log)
    first = asyncio.run(agent.run_turn("Hi"))
    assert first.output is None
    second = asyncio.run(agent.run_turn("Weather in Oslo?", output=OutputType(Weather)))
    assert isinstance(second.output, Weather)
    third = asyncio.run(agent.run_turn("Thanks"))
    assert third.output is None
    headers = [e.data for e in log.read("s") if isinstance(e.data, RequestHeader)]
    assert [h.reason for h in headers] == ["initial", "change", "change"]
    assert [h.header.config.output_name for h in headers] == [None, "Weather", None]
    _verified(log)


class _WrongFirst:
    """Answers a wrong shape until the model is told what was wrong, then lets the emulator answer the schema."""

    def __init__(self, always_wrong: bool = False) -> None:
        self.always_wrong = always_wrong

    def reply(self, conversation: Conversation) -> Reply:
        told = any(
            isinstance(p, TextPart) and "does not match the output schema" in p.text
            for t in conversation.turns
            if t.role == "user"
            for p in t.parts
        )
        if told and not self.always_wrong:
            return Reply("Here it is.")  # not JSON: the emulator answers a value of the schema
        return Reply('{"city": "Lyon", "temperature": "warm"}')


def test_a_wrong_answer_is_sent_back_as_a_logged_user_message_and_the_retry_validates() -> None:
    log = MemoryEventLog()
    agent, provider = _agent("openai", log, _WrongFirst(), OutputType(Weather, retries=2))
    result = asyncio.run(agent.run_turn("Weather in Lyon?"))
    assert isinstance(result.output, Weather)
    assert len(result.steps) == 2
    assert len(provider.bodies) == 2
    retries = [
        e.data for e in log.read("s") if isinstance(e.data, UserMessage) and e.data.source == OUTPUT_RETRY_SOURCE
    ]
    assert len(retries) == 1
    text = retries[0].content[0].text  # type: ignore[union-attr]
    assert "temperature" in text
    assert "conditions" in text
    assert "Weather" in text
    _verified(log)


@pytest.mark.parametrize("retries", [0, 2])
def test_a_wrong_answer_past_the_retries_raises_a_typed_error_and_the_log_stays_valid(retries: int) -> None:
    log = MemoryEventLog()
    agent, provider = _agent("anthropic", log, _WrongFirst(always_wrong=True), OutputType(Weather, retries=retries))
    with pytest.raises(OutputInvalid) as caught:
        asyncio.run(agent.run_turn("Weather?"))
    assert caught.value.attempts == retries + 1
    assert "temperature" in caught.value.errors
    assert len(provider.bodies) == retries + 1
    assert isinstance(log.read("s")[-1].data, TurnEnd)
    _verified(log)
    agent.options.output = None  # the next turn works and verifies
    assert asyncio.run(agent.run_turn("Never mind.")).reason == "completed"
    _verified(log)


def test_a_json_schema_output_type_returns_plain_json() -> None:
    schema = {
        "type": "object",
        "title": "Pick",
        "properties": {"choice": {"enum": ["a", "b"]}, "score": {"type": "integer", "minimum": 3}},
        "required": ["choice", "score"],
        "additionalProperties": False,
    }
    log = MemoryEventLog()
    agent, _ = _agent("openai-responses", log, output=OutputType(schema))
    result = asyncio.run(agent.run_turn("Pick one."))
    assert set(result.output) == {"choice", "score"}
    assert result.output["score"] >= 3
    header = next(e.data for e in log.read("s") if isinstance(e.data, RequestHeader)).header
    assert header.config.output_name == "Pick"
    _verified(log)


def test_output_types_that_cannot_be_sent_are_refused_with_a_config_error() -> None:
    with pytest.raises(ConfigError, match="JSON object"):
        OutputType(list[int])
    with pytest.raises(ConfigError, match="name"):
        OutputType(Weather, name="no spaces allowed")
    with pytest.raises(ConfigError, match="retries"):
        OutputType(Weather, retries=-1)
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        OutputType({"type": "object", "properties": 3})
    with pytest.raises(ValueError, match="outputName"):
        CallConfig("openai", "gpt", output_schema={"type": "object"})


def test_a_version_before_structured_output_refuses_an_output_schema() -> None:
    log = MemoryEventLog()
    provider = AnthropicProvider(
        EmulatorTransport(Emulator()), None, EMULATOR_BASE_URL, serializer=ANTHROPIC_MESSAGES_V4
    )
    agent = Agent("s", log, provider, AgentOptions(CallConfig("anthropic", "claude-emulated", max_tokens=256)))
    with pytest.raises(ProviderError, match="predates structured output"):
        asyncio.run(agent.run_turn("Weather?", output=OutputType(Weather)))
    assert asyncio.run(agent.run_turn("Hello")).reason == "completed"
    _verified(log)
