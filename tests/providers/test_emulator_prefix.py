"""The emulator parses a request that extends one it has seen from where they differ — with the answers and
refusals a whole parse gives (:mod:`foldline.providers.emulator.prefix`).

Real loops write the bodies (the adapters' serializers, tools, thinking); each body is then answered by two
emulators in lockstep — one that resumes kept parses, one that parses every body whole — and every answer,
status and header must be byte-identical, for the bodies as written and for bodies changed the ways that
must not resume (a message changed inside the prefix, another frame, bodies that are not canonical, a key
twice) or must refuse (a new message that breaks a rule).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from foldline.adapters.memory_log import MemoryEventLog
from foldline.core import CallConfig
from foldline.core.codec import canonical_json, loads
from foldline.demo import demo_toolset
from foldline.loop import Agent, AgentOptions
from foldline.providers.emulated import WireFormat, emulated_provider
from foldline.providers.emulator import Emulator
from foldline.providers.emulator.emulator import EmulatorResponse
from foldline.providers.emulator.prefix import Decoded, SeenPrompts
from foldline.providers.emulator.wire_api import WireApi

Request = tuple[str, str, dict[str, str], bytes]


class Recording(Emulator):
    """Answers as usual and keeps every request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_requests: list[Request] = []

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> EmulatorResponse:
        self.seen_requests.append((method, path, dict(headers), body))
        return super().handle(method, path, headers, body)


CONFIGS: dict[WireFormat, CallConfig] = {
    "anthropic": CallConfig("anthropic", "claude-emulated", max_tokens=512),
    "openai": CallConfig("openai", "gpt-emulated", max_tokens=512),
    "deepseek": CallConfig("deepseek", "deepseek-reasoner", max_tokens=512),
}


def _written(wire: WireFormat, turns: int = 14) -> list[Request]:
    """The requests a loop with tools sends over ``turns`` turns."""
    recording = Recording()

    async def go() -> None:
        provider = emulated_provider(wire, emulator=recording)
        options = AgentOptions(config=CONFIGS[wire], system="Answer from the notes.", tools=demo_toolset())
        agent = Agent("s", MemoryEventLog(), provider, options)
        try:
            for t in range(turns):
                await agent.run_turn(f"question number {t}: what do the notes say about topic {t % 5}?")
        finally:
            await provider.aclose()

    asyncio.run(go())
    return recording.seen_requests


def _clock() -> float:
    return 1_800_000_000.0  # both emulators' answers carry the same creation time


def _resuming() -> Emulator:
    return Emulator(clock=_clock)


def _whole() -> Emulator:
    emulator = Emulator(clock=_clock)
    emulator.prompts = SeenPrompts(max_bytes=0)  # keeps nothing: every body parsed whole
    return emulator


def _answers(requests: list[Request]) -> tuple[list[EmulatorResponse], list[EmulatorResponse], Emulator]:
    resuming, whole = _resuming(), _whole()
    ours = [resuming.handle(m, p, h, b) for m, p, h, b in requests]
    theirs = [whole.handle(m, p, h, b) for m, p, h, b in requests]
    return ours, theirs, resuming


@pytest.mark.parametrize("wire", ["anthropic", "openai", "deepseek"])
def test_a_growing_conversation_is_answered_as_a_whole_parse_answers_it(wire: WireFormat) -> None:
    requests = _written(wire)
    ours, theirs, resuming = _answers(requests)
    assert [(a.status, a.body, a.headers) for a in ours] == [(a.status, a.body, a.headers) for a in theirs]
    assert all(a.status == 200 for a in ours)
    # every request after the first extends the one before it: parsed from where they differ
    assert resuming.prompts.resumed == len(requests) - 1
    assert resuming.prompts.whole == 1


def test_a_resumed_request_parses_only_its_new_messages() -> None:
    requests = _written("anthropic", turns=20)
    seen = SeenPrompts()
    emulator = Emulator()
    emulator.prompts = seen
    parsed: list[int] = []
    decode = seen.decode

    def counting(api: WireApi[Any], body: bytes) -> Decoded:
        decoded = decode(api, body)
        parsed.append(len(decoded.payload["messages"]))
        return decoded

    seen.decode = counting  # type: ignore[method-assign]
    for m, p, h, b in requests:
        emulator.handle(m, p, h, b)
    total = [len(loads(b)["messages"]) for *_, b in requests]
    assert total[-1] > 40
    assert max(parsed[1:]) <= 2  # an answer and its tool results, or the next question
    assert parsed[0] == total[0]


def _variants(body: bytes) -> dict[str, bytes]:
    payload = loads(body)
    messages = payload["messages"]
    changed_early = {**payload, "messages": [*messages[:2], {**messages[2], "content": "changed"}, *messages[3:]]}
    last = messages[-1]
    broken_last = dict(last)
    if isinstance(last.get("content"), list) and last["content"] and last["content"][0].get("type") == "tool_result":
        broken_last["content"] = [{**last["content"][0], "tool_use_id": "no-such-call"}]
    else:
        broken_last["role"] = "robot"
    other_system = {**payload, "system": "Another system prompt."} if "system" in payload else {**payload, "n": 1}
    return {
        "changed inside the prefix": canonical_json(changed_early),
        "a new message that breaks a rule": canonical_json({**payload, "messages": [*messages[:-1], broken_last]}),
        "another frame": canonical_json(other_system),
        "not canonical": body.replace(b'"messages":[', b'"messages": [', 1),
        "messages twice": body[:-1] + b',"messages":' + canonical_json(messages[:1]) + b"}",
        "only a prefix": canonical_json({**payload, "messages": messages[:3]}),
        "not JSON": body[: len(body) // 2],
    }


@pytest.mark.parametrize("wire", ["anthropic", "openai", "deepseek"])
def test_bodies_that_must_not_resume_or_must_be_refused_get_what_a_whole_parse_gives(wire: WireFormat) -> None:
    requests = _written(wire, turns=6)
    resuming, whole = _resuming(), _whole()
    for m, p, h, b in requests:
        assert resuming.handle(m, p, h, b).body == whole.handle(m, p, h, b).body
    m, p, h, b = requests[-1]
    statuses = {}
    for name, variant in _variants(b).items():
        ours, theirs = resuming.handle(m, p, h, variant), whole.handle(m, p, h, variant)
        assert (ours.status, ours.body) == (theirs.status, theirs.body), name
        statuses[name] = ours.status
        # and the conversation goes on as before after it
        assert resuming.handle(m, p, h, b).body == whole.handle(m, p, h, b).body
    assert statuses["a new message that breaks a rule"] == 400
    assert statuses["not JSON"] == 400


def test_a_prefix_checked_under_other_settings_is_checked_again() -> None:
    """DeepSeek's thinking makes ``reasoning_content`` required on tool-call turns: a conversation written with
    thinking off, then sent with thinking on, is refused at its first such message — as a whole parse refuses
    it — not resumed past its unchecked prefix."""
    requests = _written("deepseek", turns=4)
    resuming, whole = _resuming(), _whole()

    def thinking_off(body: bytes) -> bytes:
        payload = loads(body)
        messages = [{k: v for k, v in msg.items() if k != "reasoning_content"} for msg in payload["messages"]]
        return canonical_json({**payload, "messages": messages, "thinking": {"type": "disabled"}})

    for m, p, h, b in requests[:-1]:
        off = thinking_off(b)
        assert resuming.handle(m, p, h, off).body == whole.handle(m, p, h, off).body
    assert resuming.prompts.resumed > 0
    m, p, h, b = requests[-1]  # extends the last one sent, with thinking on
    on = canonical_json({**loads(thinking_off(b)), "thinking": {"type": "enabled"}})
    ours, theirs = resuming.handle(m, p, h, on), whole.handle(m, p, h, on)
    assert (ours.status, ours.body) == (theirs.status, theirs.body)
    assert ours.status == 400
    assert b"Missing `reasoning_content`" in ours.body
