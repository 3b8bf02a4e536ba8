"""The server-sent events decoder: the standard's line rules, any chunking, and the typed errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foldline.errors import ProviderStreamError
from foldline.providers.sse import ServerSentEvent, SSEDecoder, encode_sse


def decode(chunks: list[bytes]) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    out: list[ServerSentEvent] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out + decoder.close()


def test_the_standards_line_rules() -> None:
    stream = (
        b"\xef\xbb\xbf: a comment\r\n"
        b"event: one\r\ndata: first\r\ndata:second\r\n\r\n"  # CRLF; a data line without the space
        b"data: lone cr\r\r"  # CR line ends
        b"id: 7\nretry: 10\nunknown: x\ndata\n\n"  # ignored fields; a field without a colon
        b"event: no-data\n\n"  # an event without data is not dispatched
        b"data:  two spaces\n\n"
    )
    assert decode([stream]) == [
        ServerSentEvent("one", "first\nsecond"),
        ServerSentEvent(None, "lone cr"),
        ServerSentEvent(None, ""),
        ServerSentEvent(None, " two spaces"),
    ]


events_st = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from(["message_start", "content_block_delta", "ping"])),
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=40),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    events=events_st,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
def test_any_chunking_of_a_stream_gives_the_same_events(
    events: list[tuple[str | None, str]], cuts: list[int], eol: bytes
) -> None:
    stream = b"".join(encode_sse(name, data) for name, data in events).replace(b"\n", eol)
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    expected = [ServerSentEvent(name, data) for name, data in events]
    assert decode(chunks) == expected
    assert decode([bytes([b]) for b in stream]) == expected  # byte by byte: every CRLF split


def test_a_stream_that_stops_inside_an_event_is_a_typed_error() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: message_stop\ndata: {}") == []
    with pytest.raises(ProviderStreamError) as caught:
        decoder.close()
    assert caught.value.error_type == "truncated-stream"


def test_bytes_that_are_not_utf8_are_a_typed_error() -> None:
    with pytest.raises(ProviderStreamError, match="not UTF-8") as caught:
        decode([b"data: \xff\xfe\n\n"])
    assert caught.value.error_type == "malformed-stream"


def test_data_with_a_line_break_cannot_be_encoded_on_one_line() -> None:
    with pytest.raises(ValueError, match="line break"):
        encode_sse(None, "a\nb")
