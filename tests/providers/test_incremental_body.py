"""IncrementalBody: the cached, per-session body equals a full serialization, byte for byte, always.

Sessions are driven the way the loop drives them: one message list that only grows while a surface
generation lives, a new list after a replace, header changes at random points, empty messages, tool runs
and images. After every step the cached bytes and digest must equal ``serializer.serialize`` and its
digest, for both serializers, whole and in parts (with blocks small enough that the prefix is cut into
many). A long session's bodies in parts share their blocks. A corrupted image in the cached prefix must
still fail the request.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.core import CallConfig, GenerateOptions, ImageBlock, TextBlock, ToolCallBlock, ToolResultBlock
from foldline.core.codec import digest_bytes
from foldline.core.header import EpochHeader
from foldline.core.projection import Message, MessageSequence
from foldline.errors import AttachmentError
from foldline.providers.anthropic import AnthropicMessagesSerializer
from foldline.providers.base import BodyParts, Serializer
from foldline.providers.framing import IncrementalBody
from foldline.providers.openai import OpenAIChatSerializer

from .helpers import TOOLS, image_block

SERIALIZERS: list[Serializer] = [AnthropicMessagesSerializer(), OpenAIChatSerializer()]


def _message(kind: int, i: int, image: ImageBlock) -> Message:
    match kind:
        case 0:
            return Message("user", (TextBlock(f"question {i}"),))
        case 1:
            return Message("user", (TextBlock(""),))  # dropped on the Anthropic wire
        case 2:
            return Message("user", (TextBlock(f"look {i}"), image))
        case 3:
            return Message("assistant", (TextBlock(f"answer {i}"),))
        case 4:
            return Message("assistant", (TextBlock("calling"), ToolCallBlock(f"c{i}", "now", "{}")))
        case 5:
            return Message("tool", (ToolResultBlock(f"c{i}", (TextBlock(f"result {i}"),)),))
        case 6:
            return Message("tool", (ToolResultBlock(f"c{i}", (TextBlock("shot"), image)),))
        case _:
            return Message("assistant", (TextBlock(""),))


def _header(variant: int) -> EpochHeader:
    config = CallConfig("anthropic", f"model-{variant % 2}", max_tokens=256 + variant)
    return EpochHeader(config, None if variant % 3 == 0 else f"system {variant}", TOOLS if variant % 2 else None)


steps = st.lists(
    st.tuples(
        st.lists(st.integers(0, 7), min_size=0, max_size=4),  # messages appended before this request
        st.sampled_from(["same", "same", "same", "header", "replace"]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_cached_body_equals_full_serialization(plan: list[tuple[list[int], str]]) -> None:
    store = MemoryAttachmentStore()
    image = image_block(store)
    for serializer in SERIALIZERS:
        body_cache = IncrementalBody(serializer)
        digests = IncrementalBody(serializer, verify_cached_images=False)  # what the invariant companion keeps
        parted = IncrementalBody(serializer, block_bytes=64)  # what the dispatcher keeps, in many blocks
        items: list[Message] = []
        variant = 0
        counter = 0
        for kinds, event in plan:
            if event == "header":
                variant += 1
            elif event == "replace" and items:
                items = [Message("user", (TextBlock(f"summary {counter}"),)), *items[len(items) // 2 :]]
            for kind in kinds:
                counter += 1
                items.append(_message(kind, counter, image))
            header = _header(variant)
            request = GenerateOptions(header.config, header.system, header.tools, MessageSequence(items, len(items)))
            body, digest = body_cache.serialize(request, store)
            full = serializer.serialize(request, store)
            assert body == full
            assert digest == digest_bytes(full)
            assert digests.digest(request, store) == (digest, len(full))
            parts, parts_digest = parted.parts(request, store)
            assert isinstance(parts, BodyParts)
            assert (bytes(parts), len(parts), parts_digest) == (full, len(full), digest)
            assert all(len(block) >= 64 for block in parts.parts[:-1])


@pytest.mark.parametrize("serializer", SERIALIZERS, ids=lambda s: s.name)
def test_a_long_sessions_bodies_in_parts_share_their_blocks_and_copy_only_the_rest(serializer: Serializer) -> None:
    header = _header(1)
    items: list[Message] = []
    body_cache = IncrementalBody(serializer, block_bytes=4096)
    previous: tuple[bytes, ...] = ()
    for step in range(200):
        items.append(Message("user", (TextBlock(f"question {step} " * 20),)))
        items.append(Message("assistant", (TextBlock(f"answer {step} " * 40),)))
        request = GenerateOptions(header.config, header.system, header.tools, MessageSequence(items, len(items)))
        body, _ = body_cache.parts(request, None)
        assert isinstance(body, BodyParts)
        *blocks, last = body.parts
        assert len(last) < 4096 + 2000  # the open buffer and the newest messages: all that was copied
        assert all(a is b for a, b in zip(previous, blocks, strict=False))  # the earlier blocks, not copies
        assert len(blocks) >= len(previous)
        previous = tuple(blocks)
    assert len(body) > 100_000
    assert len(previous) > 30


@pytest.mark.parametrize("serializer", SERIALIZERS, ids=lambda s: s.name)
def test_corrupted_image_in_cached_prefix_still_fails(serializer: Serializer) -> None:
    store = MemoryAttachmentStore()
    image = image_block(store)
    ref = image.image
    items = [Message("user", (TextBlock("see"), image)), Message("assistant", (TextBlock("ok"),))]
    header = _header(1)
    body_cache = IncrementalBody(serializer)
    for extra in range(3):
        items.append(Message("user", (TextBlock(f"more {extra}"),)))
        items.append(Message("assistant", (TextBlock(f"fine {extra}"),)))
        request = GenerateOptions(header.config, header.system, header.tools, MessageSequence(items, len(items)))
        body_cache.serialize(request, store)
    store.replace_bytes(ref.attachment_id, b"\x89PNG corrupted")
    items.append(Message("user", (TextBlock("again"),)))
    request = GenerateOptions(header.config, header.system, header.tools, MessageSequence(items, len(items)))
    with pytest.raises(AttachmentError):
        body_cache.serialize(request, store)
