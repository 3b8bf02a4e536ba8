"""A dispatcher's error crosses Redis as JSON and arrives as the same typed error, with every field the
loop acts on (retry hints, received bytes, the attachment named); anything else is a DispatchFailed."""

from __future__ import annotations

import pytest

from foldline.errors import (
    AnswerTooLarge,
    AttachmentCorrupt,
    AttachmentNotFound,
    AttachmentReadFailed,
    ContextOverflow,
    DispatchFailed,
    DispatchLost,
    FencedError,
    FoldlineError,
    FoldTimeout,
    InvariantViolation,
    ProviderStatusError,
    ProviderStreamError,
    ProviderTransportError,
)
from foldline.ports.step_dispatch import error_from_json, error_to_json

SID, BOUNDARY = "s-1", 7
ATTACHMENT = "sha256:" + "ab" * 32

ERRORS: list[FoldlineError] = [
    AttachmentNotFound(ATTACHMENT, "no such object in bucket b"),
    AttachmentCorrupt(ATTACHMENT, "digest mismatch"),
    AttachmentReadFailed(ATTACHMENT, "S3 at http://s3 did not answer"),
    ProviderStatusError(
        "anthropic",
        429,
        "rate limited",
        error_type="rate_limit_error",
        request_id="req_1",
        retry_after=1.5,
        should_retry=True,
        final=False,
    ),
    ContextOverflow("openai", 400, "too long", error_type="context_length_exceeded", final=True),
    ProviderTransportError("connection reset", received_bytes=12, error_type="reset"),
    ProviderStreamError(
        "stream ended early", error_type="truncated", received_bytes=99, retryable=True, request_id="r"
    ),
    AnswerTooLarge("answer over 64 MiB", received_bytes=67_108_865),
    FoldTimeout("the fold of 's-1' did not reach seq 6 within 60s: check the projectors"),
    DispatchLost(SID, BOUNDARY, "DispatchLost", "the dispatcher stopped"),
    FencedError(SID, 3, 4),
]

FIELDS = (
    "attachment_id",
    "provider",
    "status",
    "excerpt",
    "error_type",
    "request_id",
    "retry_after",
    "should_retry",
    "final",
    "received_bytes",
    "retryable",
    "session_id",
    "epoch",
    "current_epoch",
)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_round_trips_with_its_type_message_and_fields(error: FoldlineError) -> None:
    back = error_from_json(error_to_json(error), SID, BOUNDARY)
    assert type(back) is type(error)
    assert str(back) == str(error)
    for name in FIELDS:
        if hasattr(error, name):
            assert getattr(back, name) == getattr(error, name), name


def test_a_kind_without_fields_arrives_as_a_dispatch_failed_naming_it() -> None:
    error = InvariantViolation("the fold differs from the log at seq 3", "- a\n+ b")
    back = error_from_json(error_to_json(error), SID, BOUNDARY)
    assert isinstance(back, DispatchFailed)
    assert not isinstance(back, DispatchLost)
    assert back.kind == "InvariantViolation"
    assert "the fold differs from the log at seq 3" in str(back)


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "ProviderStatusError", "message": "x"},  # its fields are missing
        {"kind": "ProviderTransportError", "receivedBytes": "many", "errorType": "reset"},
        {"kind": "AnswerTooLarge"},
        {"kind": "FencedError", "epoch": 3},  # the newer epoch is missing
    ],
)
def test_a_malformed_error_reply_is_a_typed_format_failure(value: dict[str, object]) -> None:
    back = error_from_json(value, SID, BOUNDARY)
    assert isinstance(back, DispatchFailed)
    assert back.kind == "FormatError"
    assert "malformed error reply" in str(back)
