"""How two requests differ, pure: field by field, the first differing message and byte, and the prefix they share.

``foldline replay`` compares the request a changed agent builds with the recorded one; these functions say
where they part:

* :func:`json_changes` — every leaf where two JSON values differ, by path (``config.model``, ``system``,
  ``tools[1].description``, ``messages[4].content[0].text``), in document order;
* :func:`header_changes` — the same over two request headers in their logged form (docs/FORMAT.md §3.4);
* :func:`first_message_change` — the first message that differs and its first differing field;
* :func:`first_byte_difference` — the offset of the first differing byte of two wire bodies, with context;
* :func:`shared_prompt_prefix` — the part of two requests a provider's prompt cache can serve for both: in
  the order a provider reads a prompt (tools, then the system prompt, then the messages), whole elements,
  up to the first that differs. A different model, provider or cache key shares nothing (a cache belongs to
  one model); different thinking settings share the tools and the system prompt but no message
  (Anthropic's rule). Bytes are the canonical JSON of each element (the system prompt's UTF-8 text); tokens
  are the estimate of :mod:`.compaction` (4 bytes a token; a message's framing and images as it counts them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import codec
from .compaction import BYTES_PER_TOKEN, message_tokens
from .frozen import OrderedObject, thaw_json
from .header import EpochHeader
from .projection import Message
from .request import GenerateOptions
from .wire import block_to_json, header_to_json, tool_spec_to_json

__all__ = [
    "ByteDifference",
    "FieldChange",
    "PromptPrefix",
    "first_byte_difference",
    "first_message_change",
    "header_changes",
    "json_changes",
    "message_to_json",
    "shared_prompt_prefix",
]

#: Config fields a prompt cache is keyed by: a request that differs in one shares no cached prefix.
CACHE_KEY_FIELDS = ("provider", "model", "promptCacheKey")
#: Config fields whose change leaves the tools and system prompt cached but not the messages (thinking).
MESSAGE_CACHE_FIELDS = ("reasoningEffort", "thinkingBudget")
#: A string longer than this is shown around its first difference rather than whole.
EXCERPT_CHARS = 160


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One leaf that differs: its path and its value on each side (JSON values; ``None``: absent there)."""

    path: str
    old: Any
    new: Any

    @property
    def at(self) -> int | None:
        """For two strings: the index of their first differing character (else None)."""
        if not isinstance(self.old, str) or not isinstance(self.new, str):
            return None
        return _first_index(self.old, self.new)

    def excerpts(self, chars: int = EXCERPT_CHARS) -> tuple[Any, Any]:
        """Both values, long strings cut to ``chars`` characters around the first difference (``…`` marks a cut)."""
        at = self.at
        if at is None or max(len(self.old), len(self.new)) <= chars:
            return self.old, self.new
        start = max(0, at - chars // 2)
        return _cut(self.old, start, chars), _cut(self.new, start, chars)

    def to_json(self) -> dict[str, Any]:
        old, new = self.excerpts()
        out: dict[str, Any] = {"path": self.path, "old": thaw_json(old), "new": thaw_json(new)}  # objects in order
        if self.at is not None:
            out["at"] = self.at
        return out

    def describe(self) -> str:
        """One line: the path and both values (long strings around their first difference)."""
        old, new = self.excerpts(80)
        where = f" (from character {self.at})" if self.at is not None and self.at > 0 else ""
        return f"{self.path}{where}: {_show(old)} → {_show(new)}"


@dataclass(frozen=True, slots=True)
class ByteDifference:
    """The first byte at which two bodies differ, and the bytes around it on each side."""

    offset: int
    old_length: int
    new_length: int
    context_start: int  # offset of the first byte of both contexts
    old_context: bytes
    new_context: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "oldLength": self.old_length,
            "newLength": self.new_length,
            "contextStart": self.context_start,
            "old": self.old_context.decode("utf-8", "replace"),
            "new": self.new_context.decode("utf-8", "replace"),
        }


@dataclass(frozen=True, slots=True)
class PromptPrefix:
    """What two requests share in prompt order: bytes and estimated tokens of the shared prefix and of the
    whole (second) request, and the first element that differs (``None`` when one request extends the other)."""

    shared_bytes: int
    total_bytes: int
    shared_tokens: int
    total_tokens: int
    stops_at: str | None

    @property
    def share(self) -> float:
        """The shared part of the request's estimated tokens (1.0 for an empty request)."""
        return self.shared_tokens / self.total_tokens if self.total_tokens else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "sharedBytes": self.shared_bytes,
            "totalBytes": self.total_bytes,
            "sharedTokens": self.shared_tokens,
            "totalTokens": self.total_tokens,
            "share": round(self.share, 6),
            "stopsAt": self.stops_at,
        }


def json_changes(old: Any, new: Any, path: str = "") -> list[FieldChange]:
    """Every leaf where ``old`` and ``new`` differ, in document order (object keys sorted, arrays by index).

    A key or an array element present on one side only is one change of the whole value (``None`` on the
    other side). Values of different JSON types (``1`` and ``1.0``, ``1`` and ``true``) differ. An ordered
    object (a tool's input schema, docs/FORMAT.md §1.9) whose shared keys come in another order is a change of
    that whole object, listed after the changes inside it.
    """
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[FieldChange] = []
        for key in sorted(old.keys() | new.keys()):
            sub = f"{path}.{key}" if path else key
            if key not in old or key not in new:
                out.append(FieldChange(sub, old.get(key), new.get(key)))
            else:
                out += json_changes(old[key], new[key], sub)
        ordered = isinstance(old, OrderedObject) or isinstance(new, OrderedObject)
        if ordered and [k for k in old if k in new] != [k for k in new if k in old]:
            out.append(FieldChange(path, old, new))
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = []
        for i in range(max(len(old), len(new))):
            sub = f"{path}[{i}]"
            if i >= len(old) or i >= len(new):
                out.append(FieldChange(sub, old[i] if i < len(old) else None, new[i] if i < len(new) else None))
            else:
                out += json_changes(old[i], new[i], sub)
        return out
    if type(old) is not type(new) or old != new:
        return [FieldChange(path, old, new)]
    return []


def header_changes(old: EpochHeader, new: EpochHeader) -> tuple[FieldChange, ...]:
    """The fields of two headers that differ, by their logged names: ``config.*``, ``system``, ``tools[i].*``."""
    return tuple(json_changes(header_to_json(old), header_to_json(new)))


def message_to_json(message: Message) -> dict[str, Any]:
    """A message as the JSON the request view shows (``{"role", "content"}``, blocks in their logged form)."""
    return {"role": message.role, "content": [block_to_json(b) for b in message.content]}


def first_message_change(old: Sequence[Message], new: Sequence[Message]) -> tuple[int, FieldChange] | None:
    """The index of the first message that differs and its first differing field (``messages[i]...``);
    a message on one side only is a change of the whole message. None when the lists are equal."""
    for i in range(min(len(old), len(new))):
        if old[i] != new[i]:
            changes = json_changes(message_to_json(old[i]), message_to_json(new[i]), f"messages[{i}]")
            return i, changes[0]
    if len(old) == len(new):
        return None
    i = min(len(old), len(new))
    return i, FieldChange(
        f"messages[{i}]",
        message_to_json(old[i]) if i < len(old) else None,
        message_to_json(new[i]) if i < len(new) else None,
    )


def first_byte_difference(old: bytes, new: bytes, context: int = 40) -> ByteDifference | None:
    """The first offset at which ``old`` and ``new`` differ (the shorter one's length when one is a prefix of
    the other), with ``context`` bytes either side; None when they are equal."""
    if old == new:
        return None
    a, b = memoryview(old), memoryview(new)
    lo, hi = 0, min(len(old), len(new))
    while lo < hi:  # binary search on equal prefixes: compared at memcmp speed, never byte by byte in Python
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    offset = lo
    start = max(0, offset - context)
    return ByteDifference(
        offset, len(old), len(new), start, old[start : offset + context], new[start : offset + context]
    )


def shared_prompt_prefix(old: GenerateOptions, new: GenerateOptions) -> PromptPrefix:
    """The prefix of ``new`` a prompt cache written for ``old`` serves (see the module docstring)."""
    elements = _elements(new)
    total_bytes = sum(b for _, b, _ in elements)
    total_tokens = sum(t for _, _, t in elements)
    old_config, new_config = header_to_json(old.header)["config"], header_to_json(new.header)["config"]
    keyed = next((f for f in CACHE_KEY_FIELDS if old_config.get(f) != new_config.get(f)), None)
    if keyed is not None:
        return PromptPrefix(0, total_bytes, 0, total_tokens, f"config.{keyed}")
    thinking = next((f for f in MESSAGE_CACHE_FIELDS if old_config.get(f) != new_config.get(f)), None)
    old_elements = _elements(old)
    shared_bytes = shared_tokens = 0
    for i, (name, size, tokens) in enumerate(elements):
        if thinking is not None and name.startswith("messages["):
            return PromptPrefix(shared_bytes, total_bytes, shared_tokens, total_tokens, f"config.{thinking}")
        if i >= len(old_elements) or old_elements[i][0] != name or not _same_element(old, new, name):
            return PromptPrefix(shared_bytes, total_bytes, shared_tokens, total_tokens, name)
        shared_bytes += size
        shared_tokens += tokens
    return PromptPrefix(shared_bytes, total_bytes, shared_tokens, total_tokens, None)


# ---------------------------------------------------------------------------- helpers


def _elements(req: GenerateOptions) -> list[tuple[str, int, int]]:
    """(name, bytes, estimated tokens) of each prompt element in prompt order."""
    out: list[tuple[str, int, int]] = []
    for i, tool in enumerate(req.tools or ()):
        size = len(codec.canonical_json(tool_spec_to_json(tool)))
        out.append((f"tools[{i}]", size, _tokens(size)))
    if req.system is not None:
        size = len(req.system.encode("utf-8"))
        out.append(("system", size, _tokens(size)))
    for i, m in enumerate(req.messages):
        out.append((f"messages[{i}]", len(codec.canonical_json(message_to_json(m))), message_tokens(m)))
    return out


def _same_element(old: GenerateOptions, new: GenerateOptions, name: str) -> bool:
    if name == "system":
        return old.system == new.system
    index = int(name[name.index("[") + 1 : -1])
    if name.startswith("tools["):
        return (old.tools or ())[index] == (new.tools or ())[index]
    return old.messages[index] == new.messages[index]


def _tokens(size: int) -> int:
    return -(-size // BYTES_PER_TOKEN)


def _first_index(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _cut(text: str, start: int, chars: int) -> str:
    piece = text[start : start + chars]
    return ("…" if start > 0 else "") + piece + ("…" if start + chars < len(text) else "")


def _show(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, str):
        return repr(value)
    return codec.canonical_json(value).decode("utf-8")
