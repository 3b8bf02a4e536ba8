"""Requests that extend one seen before are parsed from where they differ, as a provider's prefix cache would.

A conversation's requests grow: each one's message list is the previous one's plus the new messages, byte
for byte (foldline's serializers write canonical JSON with no marker inside the message list). Parsing and
checking every message of every request would make each answer cost the whole conversation, so
:class:`SeenPrompts` keeps the last parse of each conversation — the body, where each of its messages ends,
and what the parser made of them (:class:`~.prompt.Resume`) — and parses a new body only from where it
leaves the kept one.

Exactness: a kept body is *canonical* (it equals ``canonical_json`` of what it parsed to), so the top-level
message list starts where the keys before ``messages`` end and each message ends after its canonical bytes.
A new body that holds the kept body's bytes up to the end of message ``j``, followed by a comma, is in
exactly the parser state the kept body was in there; removing those messages' bytes (keeping the head)
leaves a JSON document whose message list is the rest of the new body's. That document is parsed, and used
only if it is canonical too — then the new body is canonical, has no key twice, and the resumed parse is the
parse of the whole body — and only if everything of the request but its messages (its *frame*: model, tools,
system, settings) is the kept one's, so every message of the prefix was checked under the same settings.
Anything else (another body, a body that is not canonical, one that only repeats a prefix, another frame)
is parsed whole, as before. The tests hold both paths to the same answers and the same refusals.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ...core.codec import canonical_json, loads
from .prompt import Mark, Prompt, Resume
from .tokens import Block
from .wire_api import WireApi

__all__ = ["Decoded", "SeenPrompts"]

_LIST = b'"messages":['
_WINDOW = 64  # bytes of the first message that (with the head) find a conversation's kept parse


@dataclass(slots=True)
class _Seen:
    """One conversation's last parse: its canonical body, where each message ends, and the parse."""

    api: str
    body: bytes
    start: int  # the offset of the first message's first byte
    ends: list[int]  # the offset after each message's last byte
    last_messages: int  # messages of the body (== len(ends))
    frame: bytes  # the body without its messages: what else parsing a message may depend on
    turns: list[Any]
    blocks: list[Block]
    system: list[str]
    marks: list[Mark]
    breakpoints: list[int]
    tokens: list[int]
    chain: Any  # prompt.Chain

    def resume(self, upto: int) -> Resume:
        """The parse of this body's first ``upto + 1`` messages."""
        mark = self.marks[upto]
        begin = self.start if upto == 0 else self.ends[upto - 1] + 1
        return Resume(
            upto + 1,
            self.turns[: mark.turns],
            self.blocks[: mark.blocks],
            self.system[: mark.system],
            self.marks[: upto + 1],
            loads(self.body[begin : self.ends[upto]]),
            [i for i in self.breakpoints if i < mark.blocks],
            self.tokens[: mark.blocks],
            self.chain,
        )


def _key(api: str, body: bytes) -> tuple[str, bytes] | None:
    """Which conversation a body belongs to: its head (the keys before the message list) and the start of its
    first message (up to :data:`_WINDOW` bytes, less when that message is shorter)."""
    at = body.find(_LIST)
    if at < 0:
        return None
    start = at + len(_LIST)
    window = body[start : start + _WINDOW]
    depth, string, escaped = 0, False, False
    for i, c in enumerate(window):  # where the first message ends, when that is inside the window
        if string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                string = False
        elif c == 0x22:
            string = True
        elif c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
            if depth <= 0:
                window = window[: i + 1]
                break
    return api, body[:start] + window


@dataclass(frozen=True, slots=True)
class Decoded:
    """A body decoded for its parser: ``payload`` (its message list only the messages after ``resume``'s
    prefix when ``resume`` is set) and what :meth:`SeenPrompts.keep` needs."""

    payload: Any
    resume: Resume | None
    key: tuple[str, bytes] | None
    body: bytes
    seen: _Seen | None
    upto: int


class SeenPrompts:
    """The last parse of recent conversations (bounded by their bodies' bytes); see the module docstring.

    Thread-safe: :meth:`decode` a body, parse what it returns, :meth:`keep` the prompt.
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, per_key: int = 8) -> None:
        self.max_bytes = max_bytes
        self.per_key = per_key
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, bytes], list[_Seen]] = OrderedDict()
        self._bytes = 0
        self.resumed = 0  # requests parsed from where they left a kept one
        self.whole = 0  # requests parsed whole

    def decode(self, api: WireApi[Any], body: bytes) -> Decoded:
        """The body decoded — only past the kept parse it extends, when there is one (``ValueError``: not
        JSON). Parse it with ``api.parse(decoded.payload, decoded.resume)``, then :meth:`keep` the prompt."""
        key = _key(api.name, body) if api.resumable else None
        found = self._find(key, body) if key is not None else None
        if found is not None:
            seen, upto = found
            reduced = body[: seen.start] + body[seen.ends[upto] + 1 :]
            try:
                payload = loads(reduced)
            except ValueError:
                payload = None
            if isinstance(payload, dict) and canonical_json(payload) == reduced and _frame(payload) == seen.frame:
                self.resumed += 1
                return Decoded(payload, seen.resume(upto), key, body, seen, upto)
        self.whole += 1
        return Decoded(loads(body), None, key, body, None, -1)

    def keep(self, decoded: Decoded, prompt: Prompt) -> None:
        """Keep the parse of a decoded body (a prompt :meth:`decode`'s caller parsed without a refusal)."""
        if decoded.key is not None:
            self._keep(decoded.key, decoded.seen, decoded.upto, decoded.body, decoded.payload, prompt)

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
            self._bytes = 0

    # -------------------------------------------------------------- kept parses

    def _find(self, key: tuple[str, bytes], body: bytes) -> tuple[_Seen, int] | None:
        """The kept parse sharing the most messages with ``body`` (and a comma after them), and the last of those."""
        with self._lock:
            candidates = list(self._seen.get(key, ()))
        best: tuple[_Seen, int] | None = None
        for seen in candidates:
            upto = _shared(seen, body)
            if upto >= 0 and (best is None or upto > best[1]):
                best = (seen, upto)
        return best

    def _keep(
        self, key: tuple[str, bytes], seen: _Seen | None, upto: int, body: bytes, payload: Any, prompt: Prompt
    ) -> None:
        """Keep the parse of ``body`` (a resumed one extends ``seen``'s first ``upto + 1`` messages)."""
        messages = payload.get("messages") if isinstance(payload, dict) else None
        if not isinstance(messages, list) or len(prompt.marks) < 1:
            return
        if seen is None:
            if canonical_json(payload) != body:
                return  # not canonical: its messages cannot be found by their bytes
            head = canonical_json({k: v for k, v in payload.items() if k < "messages"})
            start = len(head) - 1 + (0 if head == b"{}" else 1) + len(_LIST)
            if body[start - len(_LIST) : start] != _LIST:
                return
            ends: list[int] = []
            at = start
        else:
            start = seen.start
            ends = seen.ends[: upto + 1]
            at = ends[-1] + 1
        for message in messages:
            at += len(canonical_json(message))
            ends.append(at)
            at += 1
        if len(ends) != len(prompt.marks):
            return
        blocks, breakpoints = prompt.message_blocks()
        kept = _Seen(
            api=key[0],
            body=body,
            start=start,
            ends=ends,
            last_messages=len(ends),
            frame=_frame(payload),
            turns=prompt.turns,
            blocks=blocks,
            system=prompt.system[prompt.lead_system :],
            marks=prompt.marks,
            breakpoints=breakpoints,
            tokens=prompt._tokens,
            chain=prompt.chain(),
        )
        with self._lock:
            entries = self._seen.pop(key, [])
            if seen is not None and upto == seen.last_messages - 1 and seen in entries:
                entries.remove(seen)  # the new body holds all of it: it serves every request the old one would
                self._bytes -= len(seen.body)
            entries.insert(0, kept)
            self._bytes += len(body)
            while len(entries) > self.per_key:
                self._bytes -= len(entries.pop().body)
            self._seen[key] = entries
            while self._bytes > self.max_bytes and self._seen:
                _, dropped = self._seen.popitem(last=False)
                self._bytes -= sum(len(e.body) for e in dropped)


def _frame(payload: dict[str, Any]) -> bytes:
    """Everything of a request but its messages (a parser checks a message against the request's settings,
    e.g. DeepSeek's thinking): a request resumes a kept parse only where this is the same."""
    return canonical_json({**payload, "messages": []})


def _shared(seen: _Seen, body: bytes) -> int:
    """The last message of ``seen`` that ``body`` holds byte for byte up to its end, followed by a comma
    (more messages follow); -1 for none."""
    ends = seen.ends
    last = len(ends) - 1
    if _holds(body, seen.body, ends[last]):
        return last if body[ends[last] : ends[last] + 1] == b"," else -1
    low, high = 0, last - 1  # the body left the kept one inside its messages: the last message it shares
    found = -1
    while low <= high:
        mid = (low + high) // 2
        if _holds(body, seen.body, ends[mid]):
            found, low = mid, mid + 1
        else:
            high = mid - 1
    if found >= 0 and body[ends[found] : ends[found] + 1] == b",":
        return found
    return -1


def _holds(body: bytes, kept: bytes, end: int) -> bool:
    return len(body) > end and body.startswith(memoryview(kept)[:end])
