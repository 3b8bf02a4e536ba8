"""The emulator's opaque reasoning state: a keyed MAC over the content, so a continuation can be checked.

* a thinking **signature** is ``base64(HMAC-SHA256(key, "thinking\\0" + text))``: an altered text or signature
  fails the check, as the Messages API refuses a modified thinking block;
* **redacted thinking** data is ``base64(nonce ‖ HMAC(key, "redacted\\0" + nonce))`` (16-byte nonce);
* **encrypted reasoning** (the Responses API's ``encrypted_content``) is
  ``base64(canonical {"id", "text"}) + "." + base64(HMAC(key, "reasoning\\0" + that JSON))``: it opens to the
  reasoning text and the id of the item it was issued for.

The key is the emulator's ``signing_key``; nothing is random (nonces derive from the prompt digest).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

from ...core.codec import canonical_json, loads

__all__ = ["open_reasoning", "redacted_data", "seal_reasoning", "sign_thinking", "valid_redacted", "valid_signature"]


def _mac(key: bytes, domain: bytes, data: bytes) -> bytes:
    return hmac.new(key, domain + b"\0" + data, hashlib.sha256).digest()


def sign_thinking(key: bytes, text: str) -> str:
    return base64.b64encode(_mac(key, b"thinking", text.encode("utf-8"))).decode("ascii")


def valid_signature(key: bytes, text: str, signature: str) -> bool:
    return hmac.compare_digest(sign_thinking(key, text), signature)


def redacted_data(key: bytes, nonce: bytes) -> str:
    return base64.b64encode(nonce + _mac(key, b"redacted", nonce)).decode("ascii")


def valid_redacted(key: bytes, data: str) -> bool:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) == 48 and hmac.compare_digest(raw[16:], _mac(key, b"redacted", raw[:16]))


def seal_reasoning(key: bytes, item_id: str, text: str) -> str:
    payload = canonical_json({"id": item_id, "text": text})
    mac = _mac(key, b"reasoning", payload)
    return base64.b64encode(payload).decode("ascii") + "." + base64.b64encode(mac).decode("ascii")


def open_reasoning(key: bytes, item_id: str, sealed: str) -> str | None:
    """The reasoning text sealed for ``item_id``, or None when the content was altered or issued for another item."""
    head, dot, tail = sealed.partition(".")
    try:
        payload = base64.b64decode(head, validate=True)
        mac = base64.b64decode(tail, validate=True)
        value: Any = loads(payload)
    except (binascii.Error, ValueError):
        return None
    if not dot or not hmac.compare_digest(mac, _mac(key, b"reasoning", payload)):
        return None
    if not isinstance(value, dict) or value.get("id") != item_id or not isinstance(value.get("text"), str):
        return None
    return str(value["text"])
