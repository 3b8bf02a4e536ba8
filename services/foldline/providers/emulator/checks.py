"""The checks both parsers make on a request body, and :class:`RequestRejected`, how they refuse one.

A rejection never leaves the emulator as an exception: :meth:`~.emulator.Emulator.handle` turns it into the
HTTP error answer of the API it was sent to, with the status and error type the real API would use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from ...core.images import image_dimensions, sniff_media_type
from .script import ImagePart

__all__ = [
    "RequestRejected",
    "array",
    "decode_base64",
    "decode_image",
    "exact_keys",
    "known_parameters",
    "json_object",
    "message_list",
    "number_within",
    "objects",
    "positive_int",
    "request_body",
    "string",
]


class RequestRejected(Exception):
    """The request is invalid for the API it was sent to; becomes an HTTP error answer.

    ``kind`` is the error type; ``param`` and ``code`` fill the fields of the same name in OpenAI-style error
    bodies (the parameter at fault, a machine-readable code), which Anthropic's bodies do not have."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code


def json_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestRejected(400, f"{where}: expected an object")
    return value


def array(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestRejected(400, f"{where}: expected an array")
    return value


def string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RequestRejected(400, f"{where}: expected a string")
    return value


def exact_keys(d: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Reject any key outside ``allowed`` in the Messages API's words (it refuses every unknown key)."""
    extra = sorted(set(d) - allowed)
    if extra:
        raise RequestRejected(400, f"{where}.{extra[0]}: Extra inputs are not permitted")


def known_parameters(d: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Reject any key outside ``allowed`` in the Responses API's words (``Unknown parameter: 'input[2].x'.``)."""
    extra = sorted(set(d) - allowed)
    if extra:
        param = f"{where}.{extra[0]}" if where else extra[0]
        raise RequestRejected(400, f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def decode_base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise RequestRejected(400, f"{where}: invalid base64") from None


def decode_image(data: bytes, media_type: str, where: str) -> ImagePart:
    """An image's part: its bytes must be the declared type, with readable dimensions."""
    if sniff_media_type(data) != media_type:
        raise RequestRejected(400, f"{where}: image data is not a valid {media_type}")
    try:
        width, height = image_dimensions(data, media_type)
    except ValueError as exc:
        raise RequestRejected(400, f"{where}: {exc}") from None
    return ImagePart(media_type, "sha256:" + hashlib.sha256(data).hexdigest(), width, height)


def request_body(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    """The top-level object of a request: only ``allowed`` keys (``stream`` is read by the emulator)."""
    req = json_object(body, "body")
    exact_keys(req, allowed, "body")
    return req


def message_list(req: Mapping[str, Any]) -> list[Any]:
    messages = array(req.get("messages"), "messages")
    if not messages:
        raise RequestRejected(400, "messages: at least one message is required")
    return messages


def objects(value: Any, where: str, *, brackets: bool = False, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each item of an array, checked to be an object, with its path (``where.0`` or ``where[0]``; the first
    item numbered ``start``: the array continues one whose first ``start`` items were checked before)."""
    for i, item in enumerate(array(value, where), start=start):
        at = f"{where}[{i}]" if brackets else f"{where}.{i}"
        yield at, json_object(item, at)


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def number_within(value: Any, high: float) -> bool:
    return isinstance(value, int | float) and 0 <= value <= high
