"""Wire serializers: SDK validity, exact-bytes equivalences, mapping rules, append-extension, attachments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import GenerateOptions, TextBlock, ToolCallBlock, ToolResultBlock
from foldline.core.codec import canonical_json
from foldline.core.projection import Message
from foldline.errors import AttachmentCorrupt, AttachmentNotFound, ProviderError
from foldline.ports.attachments import AttachmentStore
from foldline.providers import SERIALIZERS, AnthropicMessagesSerializer, OpenAIChatSerializer
from foldline.providers.base import Serializer
from foldline.providers.json_body import JsonBodySerializer

from .golden_cases import REFUSED, cases
from .helpers import (
    ANTHROPIC_EXTRA_BODY,
    PNG_3X2,
    NotAValidRequest,
    anthropic_request_type,
    image_block,
    openai_request_type,
    reasoning_chat_validate,
    request,
    responses_request_type,
    strict_validate,
    user,
)

ANTHROPIC = AnthropicMessagesSerializer
OPENAI = OpenAIChatSerializer


def sdk_validate(serializer: Serializer, body: bytes) -> None:
    """Against the SDK's request type — its streaming variant when the body asks for a stream."""
    stream = json.loads(body).get("stream") is True
    if serializer.name == "anthropic-messages":
        strict_validate(anthropic_request_type(stream), body, ANTHROPIC_EXTRA_BODY)
    elif serializer.name == "openai-responses":
        strict_validate(responses_request_type(stream), body)
    elif serializer.name == "reasoning-chat":
        reasoning_chat_validate(body)
    else:
        assert serializer.name == "openai-chat"
        strict_validate(openai_request_type(stream), body)


SERIALIZER_KEYS = sorted(SERIALIZERS)
ids = [f"{n}-v{v}" for n, v in SERIALIZER_KEYS]


# ---------------------------------------------------------------------------- SDK validity


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
@pytest.mark.parametrize("case", sorted(cases(MemoryAttachmentStore())))
def test_every_body_validates_against_the_official_sdk_request_type(key: tuple[str, int], case: str) -> None:
    store = MemoryAttachmentStore()
    serializer = SERIALIZERS[key]
    if case in REFUSED.get(key, ()):
        return  # test_golden proves the refusal
    sdk_validate(serializer, serializer.serialize(cases(store)[case], store))


def _mutate(body: bytes, change: Any) -> bytes:
    data = json.loads(body)
    change(data)
    return json.dumps(data).encode()


BROKEN_ANTHROPIC = {
    "bad role": lambda d: d["messages"][0].update(role="robot"),
    "bad block type": lambda d: d["messages"][0]["content"][0].update(type="txt"),
    "unknown top-level key": lambda d: d.update(tool_config={}),
    "unknown block key": lambda d: d["messages"][0]["content"][0].update(colour="red"),
    "missing max_tokens": lambda d: d.pop("max_tokens"),
    "tool_use without input": lambda d: d["messages"][1]["content"][1].pop("input"),
    "bad cache_control": lambda d: d.update(cache_control={"type": "permanent"}),
    "temperature as text": lambda d: d.update(temperature="hot"),
}
BROKEN_OPENAI = {
    "bad role": lambda d: d["messages"][1].update(role="robot"),
    "unknown top-level key": lambda d: d.update(max_output_tokens=5),
    "tool message without id": lambda d: d["messages"][3].pop("tool_call_id"),
    "tool call without function": lambda d: d["messages"][2]["tool_calls"][0].pop("function"),
    "bad tool type": lambda d: d["tools"][0].update(type="functional"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_ANTHROPIC))
def test_strict_validation_rejects_broken_anthropic_bodies(name: str) -> None:
    store = MemoryAttachmentStore()
    good = ANTHROPIC().serialize(cases(store)["tools_and_config"], store)
    strict_validate(anthropic_request_type(), good, ANTHROPIC_EXTRA_BODY)
    with pytest.raises(NotAValidRequest):
        strict_validate(anthropic_request_type(), _mutate(good, BROKEN_ANTHROPIC[name]), ANTHROPIC_EXTRA_BODY)


@pytest.mark.parametrize("name", sorted(BROKEN_OPENAI))
def test_strict_validation_rejects_broken_openai_bodies(name: str) -> None:
    store = MemoryAttachmentStore()
    good = OPENAI().serialize(cases(store)["tools_and_config"], store)
    strict_validate(openai_request_type(), good)
    with pytest.raises(NotAValidRequest):
        strict_validate(openai_request_type(), _mutate(good, BROKEN_OPENAI[name]))


BROKEN_STRUCTURED: dict[tuple[str, int], dict[str, Any]] = {
    ("anthropic-messages", 5): {
        "format type": lambda d: d["output_config"]["format"].update(type="json"),
        "format without schema": lambda d: d["output_config"]["format"].pop("schema"),
        "the old beta field": lambda d: d.update(output_format=d["output_config"].pop("format")),
    },
    ("openai-chat", 4): {
        "json_schema without name": lambda d: d["response_format"]["json_schema"].pop("name"),
        "format type": lambda d: d["response_format"].update(type="schema"),
        "strict as text": lambda d: d["response_format"]["json_schema"].update(strict="yes"),
    },
    ("openai-responses", 4): {
        "format without name": lambda d: d["text"]["format"].pop("name"),
        "the Chat field": lambda d: d.update(response_format=d.pop("text")),
    },
    ("reasoning-chat", 4): {
        "format type": lambda d: d["response_format"].update(type="yaml"),
    },
}


@pytest.mark.parametrize(("key", "name"), [(k, n) for k, broken in BROKEN_STRUCTURED.items() for n in broken], ids=str)
def test_strict_validation_rejects_broken_structured_output_fields(key: tuple[str, int], name: str) -> None:
    """The SDK types hold the native structured-output fields: each body validates, a broken one does not."""
    store = MemoryAttachmentStore()
    serializer = SERIALIZERS[key]
    good = serializer.serialize(cases(store)["structured_output"], store)
    sdk_validate(serializer, good)
    with pytest.raises(NotAValidRequest):
        sdk_validate(serializer, _mutate(good, BROKEN_STRUCTURED[key][name]))


# ---------------------------------------------------------------------------- loop-like conversations

text_st = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
call_st = st.tuples(
    st.dictionaries(st.text(max_size=6), st.integers(-5, 10**6) | text_st | st.booleans(), max_size=3),
    st.booleans(),  # is_error
    st.booleans(),  # the result carries an image
)
step_st = st.tuples(st.lists(text_st, max_size=2), st.text(max_size=16), st.lists(call_st, max_size=3))
session_st = st.lists(step_st, min_size=1, max_size=8)


def loop_requests(steps: list[Any], store: AttachmentStore, **config: Any) -> list[GenerateOptions]:
    """The requests a loop sends: new user messages, request, assistant answer, its tool results."""
    messages: list[Message] = []
    out = []
    calls = 0
    answered_with_tools = False
    for users, text, tool_calls in steps:
        entered = users if users or answered_with_tools else ["continue"]
        messages.extend(user(u) for u in entered)
        out.append(request(tuple(messages), **config))
        blocks: list[TextBlock | ToolCallBlock] = [TextBlock(text)] if text else []
        results = []
        for args, is_error, with_image in tool_calls:
            call_id = f"call_{calls}"
            calls += 1
            blocks.append(ToolCallBlock(call_id, "read_file", json.dumps(args, indent=calls % 2 or None)))
            parts: tuple[Any, ...] = (TextBlock(f"result {call_id}"),) + ((image_block(store),) if with_image else ())
            results.append(Message("tool", (ToolResultBlock(call_id, parts, is_error),)))
        messages.append(Message("assistant", tuple(blocks) or (TextBlock("ok"),)))
        messages.extend(results)
        answered_with_tools = bool(tool_calls)
    return out


def messages_close(body: bytes, key: str = "messages") -> int:
    """Offset of the ``]`` that closes the body's message list (``input`` for the Responses API)."""
    marker = f'"{key}":'.encode()
    start = body.index(marker) + len(marker)
    return start + len(canonical_json(json.loads(body)[key])) - 1


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=session_st)
def test_append_extension_bodies_share_the_previous_body_up_to_its_message_list_close(
    key: tuple[str, int], steps: list[Any]
) -> None:
    serializer = SERIALIZERS[key]
    store = MemoryAttachmentStore()
    previous: bytes | None = None
    for req in loop_requests(steps, store, max_tokens=512):
        body = serializer.serialize(req, store)
        sdk_validate(serializer, body)
        if previous is not None:
            close = messages_close(previous, "input" if serializer.name == "openai-responses" else "messages")
            assert body[:close] == previous[:close]
            assert body[close : close + 1] == b","  # the later list goes on where the earlier one closed
        previous = body


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
@settings(max_examples=40, deadline=None)
@given(steps=session_st)
def test_serialize_is_canonical_json_of_the_plain_body_and_independent_of_instances(
    key: tuple[str, int], steps: list[Any]
) -> None:
    cls = type(SERIALIZERS[key])
    assert issubclass(cls, JsonBodySerializer)
    store = MemoryAttachmentStore()
    stop = () if key[0] == "openai-responses" else ("END",)  # the Responses API has no stop sequences
    for req in loop_requests(steps, store, temperature=0.5, stop=stop, max_tokens=256):
        body = SERIALIZERS[key].serialize(req, store)
        assert body == cls().serialize(req, store) == canonical_json(cls().body(req, store))


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
def test_images_are_read_and_verified_at_every_serialization(key: tuple[str, int]) -> None:
    store = MemoryAttachmentStore()
    req = loop_requests([(["a"], "x", [({"p": 1}, False, True)]), (["b"], "y", [])], store, max_tokens=64)[1]
    for n in range(1, 4):
        SERIALIZERS[key].serialize(req, store)
        assert store.reads == n


def test_a_user_message_merged_after_an_unanswered_user_message_is_the_documented_exception() -> None:
    """Anthropic merges same-role neighbours; the shared prefix then ends inside the last wire message."""
    first = request([user("a")])
    second = request([user("a"), user("b")])
    a, b = ANTHROPIC().serialize(first, None), ANTHROPIC().serialize(second, None)
    close = messages_close(a)
    assert b[:close] != a[:close]
    content_close = a.rindex(b'],"role":"user"}')
    assert b[:content_close] == a[:content_close]
    # OpenAI does not merge, so the property holds there.
    o1, o2 = OPENAI().serialize(first, None), OPENAI().serialize(second, None)
    assert o2[: messages_close(o1)] == o1[: messages_close(o1)]


# ---------------------------------------------------------------------------- Anthropic mapping


def test_anthropic_merges_tool_results_and_a_following_user_message_and_places_three_breakpoints() -> None:
    req = request(
        [
            user("go"),
            Message("assistant", (ToolCallBlock("c1", "read_file", '{"path":"a"}'), ToolCallBlock("c2", "now", "{}"))),
            Message("tool", (ToolResultBlock("c1", (TextBlock("A"),)),)),
            Message("tool", (ToolResultBlock("c2", (TextBlock(""),), is_error=True),)),
            user("and?"),
        ],
        max_tokens=None,
    )
    body = json.loads(ANTHROPIC().serialize(req, None))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][2]["content"] == [
        {"content": [{"text": "A", "type": "text"}], "tool_use_id": "c1", "type": "tool_result"},
        {"is_error": True, "tool_use_id": "c2", "type": "tool_result"},
        {"text": "and?", "type": "text"},
    ]
    assert body["messages"][1]["content"][1] == {"id": "c2", "input": {}, "name": "now", "type": "tool_use"}
    assert body["max_tokens"] == 1024  # the documented default
    marked = [t["name"] for t in body["tools"] if "cache_control" in t]
    assert marked == ["now"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["cache_control"] == {"type": "ephemeral"}
    assert b"cache_control" not in canonical_json(body["messages"])
    assert "reasoning_effort" not in body
    assert "output_config" not in body


@pytest.mark.parametrize(
    ("arguments", "match"),
    [("not json", "not valid JSON"), ("", "not valid JSON"), ("[1, 2]", "JSON list"), ('"x"', "JSON str")],
)
def test_anthropic_rejects_tool_arguments_that_are_not_a_json_object(arguments: str, match: str) -> None:
    req = request([user("go"), Message("assistant", (ToolCallBlock("c1", "read_file", arguments),))])
    with pytest.raises(ProviderError, match=match):
        ANTHROPIC().serialize(req, None)
    assert OPENAI().serialize(req, None)  # OpenAI sends the raw string as the model produced it


def test_anthropic_rejects_temperature_above_one_and_misplaced_blocks() -> None:
    with pytest.raises(ProviderError, match="temperature"):
        ANTHROPIC().serialize(request([user("hi")], temperature=1.5), None)
    assert json.loads(OPENAI().serialize(request([user("hi")], temperature=1.5), None))["temperature"] == 1.5
    misplaced = [
        Message("user", (ToolCallBlock("c", "now", "{}"),)),
        Message("assistant", (ToolResultBlock("c", ()),)),
    ]
    for message in misplaced:
        for serializer in (ANTHROPIC(), OPENAI()):
            with pytest.raises(ProviderError, match="cannot carry"):
                serializer.serialize(request([user("x"), message]), None)


def test_anthropic_drops_empty_text_and_empty_messages() -> None:
    req = request([user("a"), Message("assistant", (TextBlock(""),)), user("b")])
    body = json.loads(ANTHROPIC().serialize(req, None))
    assert body["messages"] == [
        {"content": [{"text": "a", "type": "text"}, {"text": "b", "type": "text"}], "role": "user"}
    ]


# ---------------------------------------------------------------------------- OpenAI mapping


def test_openai_keeps_raw_arguments_and_sends_tool_result_images_after_the_whole_run() -> None:
    store = MemoryAttachmentStore()
    image = image_block(store)
    raw = '{ "path" :  "a" }'
    req = request(
        [
            user("go"),
            Message("assistant", (ToolCallBlock("c1", "read_file", raw), ToolCallBlock("c2", "read_file", "{}"))),
            Message("tool", (ToolResultBlock("c1", (TextBlock("one"), image, TextBlock("two"))),)),
            Message("tool", (ToolResultBlock("c2", (image,)),)),
            user("next"),
        ],
        provider="openai",
        max_tokens=99,
        reasoning_effort="high",
    )
    body = json.loads(OPENAI().serialize(req, store))
    assert body["max_completion_tokens"] == 99
    assert body["reasoning_effort"] == "high"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user", "user"]
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == raw
    assert "content" not in body["messages"][2]
    assert body["messages"][3]["content"] == [{"text": "one", "type": "text"}, {"text": "two", "type": "text"}]
    assert body["messages"][4]["content"] == ""
    images = body["messages"][5]["content"]
    assert [p["type"] for p in images] == ["text", "image_url", "text", "image_url"]
    assert images[0]["text"] == "Images returned by tool call c1:"
    assert images[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


# ---------------------------------------------------------------------------- attachments


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
def test_images_resolve_through_the_filesystem_store_and_an_image_without_a_store_is_an_error(
    key: tuple[str, int], tmp_path: Path
) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    req = cases(store)["images_and_errors"]
    serializer = SERIALIZERS[key]
    body = serializer.serialize(req, store)
    sdk_validate(serializer, body)
    memory = MemoryAttachmentStore()
    assert serializer.serialize(cases(memory)["images_and_errors"], memory) == body  # store-independent bytes
    with pytest.raises(ProviderError, match="no attachment store"):
        serializer.serialize(req, None)


@pytest.mark.parametrize("key", SERIALIZER_KEYS, ids=ids)
def test_a_corrupt_or_missing_image_fails_serialization_even_after_a_clean_one(
    key: tuple[str, int], tmp_path: Path
) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    req = cases(store)["images_and_errors"]
    serializer = SERIALIZERS[key]
    serializer.serialize(req, store)  # a clean pass first: nothing about images may be cached
    (ref,) = {b.image for m in req.messages for b in m.content if hasattr(b, "image")}
    hexd = ref.attachment_id.removeprefix("sha256:")
    (tmp_path / "objects" / hexd[:2] / hexd).write_bytes(PNG_3X2[:-1] + b"\x00")
    with pytest.raises(AttachmentCorrupt):
        serializer.serialize(req, store)
    with pytest.raises(AttachmentNotFound):
        serializer.serialize(req, MemoryAttachmentStore())
