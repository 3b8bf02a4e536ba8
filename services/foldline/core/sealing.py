"""Sealed content: which fields are model-visible content, and how an event's content is sealed and opened.

A field is content when its definition says so (``extra={"content": True}``: the :data:`~.records.Content`
type, a tool's ``inputSchema``, the system prompt; docs/ARCHITECTURE.md, "Defining a record"). Nothing else
lists them: :func:`content_fields` reads the marks, and the walk below follows them through every nested
record, so a new content field is sealed the moment it is marked.

Sealing an event replaces the value of each content field present in its data by a *token*: the text of an
authenticated encryption of the value's UTF-8 bytes (a JSON object: of its canonical JSON) under the
session's data key, bound to the event's identity — key id, seq, type and the field's path — as associated
data (:func:`associated_data`). A JSON-object field holds ``{"sealed": token}``; a list of strings holds one
token per string. Every other field, the envelope and the structure (which blocks, their order, ids, usage,
digests, image references) stay as they are, so an erased session still shows what happened, and the log
rules still hold of it. The envelope's ``sealed`` marker (:class:`~.events.Seal`) names the key and the
version of this format (docs/FORMAT.md, "Sealed content", specifies it byte for byte).

The core stays pure: the cipher, its randomness (the nonces) and the keys are the caller's
(``adapters/sealing.py``), passed in as two functions — ``encrypt(plaintext, associated data) -> token`` and
``decrypt(token, associated data) -> plaintext | None`` (``None``: it does not authenticate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec

from ..errors import ContentCorrupt, ContentErased, FormatError
from . import codec
from .events import EVENT_TYPES, Envelope, Seal, UnknownEvent
from .frozen import FrozenDict, freeze_json, freeze_ordered
from .inbox import InboxDecision, InboxEntry
from .records import ArrT, JsonT, RecT, StrT, TagT, record_spec

__all__ = [
    "ERASED",
    "SEAL_VERSION",
    "SEALED_KEY",
    "Decrypt",
    "Encrypt",
    "associated_data",
    "content_fields",
    "content_paths",
    "erased_view",
    "has_content",
    "entry_associated_data",
    "open_entry",
    "open_event",
    "refuse_sealed",
    "seal_entry",
    "seal_event",
]

#: The version of the sealing format a :class:`~.events.Seal` names (docs/FORMAT.md, "Sealed content").
SEAL_VERSION = 1
#: The one key of a sealed JSON-object field: ``{"sealed": token}``.
SEALED_KEY = "sealed"
#: What a command shows in place of content that was erased.
ERASED = "[erased]"
_AAD_TAG = "foldline-sealed"
_INBOX_AAD_TAG = "foldline-sealed-inbox"

Encrypt = Callable[[bytes, bytes], str]
Decrypt = Callable[[str, bytes], bytes | None]


# ------------------------------------------------------------------------------------------ the marks


@dataclass(frozen=True, slots=True)
class _Step:
    attr: str
    json: str
    kind: str  # "str" | "strs" | "json" | "ojson" (ordered): a content field; "rec" | "recs": records that hold content


@cache
def _plan(cls: type) -> tuple[_Step, ...]:
    """The fields of ``cls`` that are content or lead to content, in definition order."""
    steps: list[_Step] = []
    for f in record_spec(cls).fields:
        node = f.node
        if f.content:
            if isinstance(node, StrT):
                steps.append(_Step(f.name, f.json, "str"))
            elif isinstance(node, ArrT) and isinstance(node.item, StrT):
                steps.append(_Step(f.name, f.json, "strs"))
            elif isinstance(node, JsonT):  # an ordered object is sealed and opened in its document order (§1.9)
                steps.append(_Step(f.name, f.json, "ojson" if node.ordered else "json"))
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: only strings, lists of strings and JSON objects are content")
            continue
        item = node.item if isinstance(node, ArrT) else node
        members = (item.cls,) if isinstance(item, RecT) else item.members if isinstance(item, TagT) else ()
        if any(has_content(m) for m in members):
            steps.append(_Step(f.name, f.json, "recs" if isinstance(node, ArrT) else "rec"))
    return tuple(steps)


@cache
def has_content(cls: type) -> bool:
    """Whether a record of ``cls`` can hold content (a content field of its own or of a record it holds)."""
    return bool(_plan(cls))


def content_fields(*roots: type) -> list[str]:
    """One line per content field of ``roots`` and every record they hold (``Record.jsonName``), in definition
    order: what ``schemas/sealed.v<SEAL_VERSION>.txt`` lists."""
    out: list[str] = []
    seen: set[type] = set()
    todo = list(roots)
    while todo:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        for f in record_spec(cls).fields:
            if f.content:
                out.append(f"{record_spec(cls).name}.{f.json}")
                continue
            item = f.node.item if isinstance(f.node, ArrT) else f.node
            todo.extend((item.cls,) if isinstance(item, RecT) else item.members if isinstance(item, TagT) else ())
    return out


# ------------------------------------------------------------------------------------------ the walk

_Visit = Callable[[str, Any, str], Any]


def _walk(record: Any, path: str, visit: _Visit) -> Any:
    """``record`` with each content value ``v`` at path ``p`` replaced by ``visit(kind, v, p)`` (``kind``:
    ``"str"`` or ``"json"``); the record itself when it holds none."""
    cls: type = type(record)
    plan = _plan(cls)
    if not plan:
        return record
    changes: dict[str, Any] = {}
    for step in plan:
        value = getattr(record, step.attr)
        if value is None:
            continue
        where = f"{path}.{step.json}" if path else step.json
        if step.kind in {"str", "json", "ojson"}:
            changes[step.attr] = visit(step.kind, value, where)
        elif step.kind == "strs":
            changes[step.attr] = tuple([visit("str", x, f"{where}[{i}]") for i, x in enumerate(value)])
        elif step.kind == "rec":
            new = _walk(value, where, visit)
            if new is not value:
                changes[step.attr] = new
        else:
            items = [_walk(x, f"{where}[{i}]", visit) for i, x in enumerate(value)]
            if any(a is not b for a, b in zip(items, value, strict=True)):
                changes[step.attr] = tuple(items)
    return msgspec.structs.replace(record, **changes) if changes else record


def associated_data(session_id: str, kid: str, seq: int, etype: str, path: str) -> bytes:
    """What a sealed value is bound to: the canonical JSON of
    ``["foldline-sealed", 1, session id, key id, seq, type, path]``.

    ``path`` is the field's place in the event's ``data`` in logged names: ``content[0].text``,
    ``header.tools[1].inputSchema``, ``content[2].summary[0]``. A token moved to another field, event or
    session no longer opens."""
    return codec.canonical_json([_AAD_TAG, SEAL_VERSION, session_id, kid, seq, etype, path])


def _aad_of(session_id: str, kid: str, seq: int, etype: str) -> Callable[[str], bytes]:
    """:func:`associated_data` of one event's fields: its canonical JSON up to the path, written once."""
    head = codec.canonical_json([_AAD_TAG, SEAL_VERSION, session_id, kid, seq, etype])[:-1] + b","
    return lambda path: head + codec.canonical_json(path) + b"]"


def seal_event(env: Envelope, session_id: str, kid: str, encrypt: Encrypt) -> Envelope:
    """``env`` with every content value sealed under the data key ``kid`` (``encrypt`` holds the key); ``env``
    itself when its data holds no content (nothing to seal, no marker)."""
    if env.sealed is not None:
        raise ValueError(f"event seq {env.seq} is sealed already")
    data = env.data
    if type(data) is UnknownEvent:
        return env
    aad_of = _aad_of(session_id, kid, env.seq, env.type)
    sealed = 0

    def visit(kind: str, value: Any, path: str) -> Any:
        nonlocal sealed
        sealed += 1
        aad = aad_of(path)
        if kind == "str":
            return encrypt(value.encode("utf-8"), aad)
        # canonical JSON: sorted, or an ordered object's own document-order text
        return FrozenDict({SEALED_KEY: encrypt(codec.canonical_json(value), aad)})

    new = _walk(data, "", visit)
    if not sealed:
        return env
    return Envelope(env.seq, env.time, new, env.ignorable, Seal(kid, SEAL_VERSION))


def open_event(env: Envelope, session_id: str, decrypt: Decrypt) -> Envelope:
    """``env`` with its content opened (``decrypt`` holds the key ``env.sealed`` names); ``env`` when it is not
    sealed. :class:`~foldline.errors.ContentCorrupt` for a value that does not authenticate."""
    seal = env.sealed
    if seal is None:
        return env
    if seal.v != SEAL_VERSION:
        raise FormatError(
            "sealed", f"sealed with format version {seal.v}; this foldline opens version {SEAL_VERSION}", seq=env.seq
        )
    seq, etype = env.seq, env.type
    aad_of = _aad_of(session_id, seal.kid, seq, etype)

    def visit(kind: str, value: Any, path: str) -> Any:
        token = value
        if kind in {"json", "ojson"}:
            token = value.get(SEALED_KEY) if len(value) == 1 else None
            if not isinstance(token, str):
                raise FormatError(
                    "sealed", f"{etype} field {path} must be {{{SEALED_KEY!r}: token}} when sealed", seq=seq
                )
        plain = decrypt(token, aad_of(path))
        if plain is None:
            raise ContentCorrupt(f"{etype} field {path}", seq)
        try:
            if kind == "str":
                return plain.decode("utf-8")
            return freeze_ordered(codec.loads(plain)) if kind == "ojson" else freeze_json(codec.loads(plain))
        except ValueError as exc:
            raise ContentCorrupt(f"{etype} field {path} (not {'UTF-8' if kind == 'str' else 'JSON'})", seq) from exc

    return Envelope(env.seq, env.time, _walk(env.data, "", visit), env.ignorable)


# ------------------------------------------------------------------------------------------ inbox entries

#: The fields of an inbox decision that are content: the approver's words and the arguments a call runs with.
_DECISION_CONTENT = ("reason", "arguments")


def entry_associated_data(session_id: str, kid: str, entry_id: str, path: str) -> bytes:
    """What a sealed value of an inbox entry is bound to: the canonical JSON of
    ``["foldline-sealed-inbox", 1, session id, key id, entry id, path]`` (``path``: ``item.content[0].text``,
    ``item.reason``, ``item.arguments``). A token moved to another entry, field or session no longer opens, nor
    does one moved into an event (another tag)."""
    return codec.canonical_json([_INBOX_AAD_TAG, SEAL_VERSION, session_id, kid, entry_id, path])


def _entry_walk(entry: InboxEntry, visit: _Visit) -> InboxEntry:
    """``entry`` with each content value of its item replaced by ``visit(kind, value, path)``."""
    item = entry.item
    if isinstance(item, InboxDecision):
        changes = {
            name: visit("str", getattr(item, name), f"item.{name}")
            for name in _DECISION_CONTENT
            if getattr(item, name) is not None
        }
        new_item: Any = msgspec.structs.replace(item, **changes) if changes else item
    else:
        new_item = _walk(item, "item", visit)
    return msgspec.structs.replace(entry, item=new_item) if new_item is not item else entry


def seal_entry(entry: InboxEntry, session_id: str, kid: str, encrypt: Encrypt) -> InboxEntry:
    """``entry`` with the content of its item sealed under the data key ``kid`` and marked ``sealed``;
    ``entry`` itself when its item holds no content (a bare ``allow``)."""
    if entry.sealed is not None:
        raise ValueError(f"inbox entry {entry.id!r} is sealed already")
    sealed = 0

    def visit(kind: str, value: Any, path: str) -> Any:
        nonlocal sealed
        sealed += 1
        aad = entry_associated_data(session_id, kid, entry.id, path)
        if kind == "str":
            return encrypt(value.encode("utf-8"), aad)
        return FrozenDict({SEALED_KEY: encrypt(codec.canonical_json(value), aad)})

    new = _entry_walk(entry, visit)
    if not sealed:
        return entry
    return msgspec.structs.replace(new, sealed=Seal(kid, SEAL_VERSION))


def open_entry(entry: InboxEntry, session_id: str, decrypt: Decrypt) -> InboxEntry:
    """``entry`` with its content opened (``decrypt`` holds the key ``entry.sealed`` names); ``entry`` when it
    is not sealed. :class:`~foldline.errors.ContentCorrupt` for a value that does not authenticate."""
    seal = entry.sealed
    if seal is None:
        return entry
    where = f"inbox entry {entry.id!r}"
    if seal.v != SEAL_VERSION:
        raise FormatError(
            "sealed", f"{where} is sealed with format version {seal.v}; this foldline opens {SEAL_VERSION}"
        )

    def visit(kind: str, value: Any, path: str) -> Any:
        token = value
        if kind in {"json", "ojson"}:
            token = value.get(SEALED_KEY) if len(value) == 1 else None
            if not isinstance(token, str):
                raise FormatError("sealed", f"{where} field {path} must be {{{SEALED_KEY!r}: token}} when sealed")
        plain = decrypt(token, entry_associated_data(session_id, seal.kid, entry.id, path))
        if plain is None:
            raise ContentCorrupt(f"{where} field {path}")
        try:
            if kind == "str":
                return plain.decode("utf-8")
            return freeze_ordered(codec.loads(plain)) if kind == "ojson" else freeze_json(codec.loads(plain))
        except ValueError as exc:
            raise ContentCorrupt(f"{where} field {path} (not {'UTF-8' if kind == 'str' else 'JSON'})") from exc

    return msgspec.structs.replace(_entry_walk(entry, visit), sealed=None)


def content_paths(env: Envelope) -> list[str]:
    """The paths of the content values ``env``'s data holds (sealed or not), in order."""
    found: list[str] = []

    def visit(kind: str, value: Any, path: str) -> Any:
        found.append(path)
        return value

    _walk(env.data, "", visit)
    return found


def erased_view(env: Envelope, shown: str = ERASED) -> Envelope:
    """``env`` as a command shows an event whose key was destroyed: each content value ``shown`` (a JSON object:
    ``{"erased": true}``), everything else as logged. For display only: the result is never logged."""
    if env.sealed is None:
        return env

    def visit(kind: str, value: Any, path: str) -> Any:
        return shown if kind == "str" else FrozenDict({"erased": True})

    return Envelope(env.seq, env.time, _walk(env.data, "", visit), env.ignorable, env.sealed)


def refuse_sealed(env: Envelope, session_id: str | None = None) -> None:
    """:class:`~foldline.errors.ContentErased` when ``env`` still holds sealed content: nothing that builds what
    a model sees (a projection, a header fold, a request) may take it."""
    if env.sealed is not None:
        raise ContentErased(session_id, f"event seq {env.seq} ({env.type}) holds erased content")


#: Every event type whose data can hold content (for documentation and tests).
SEALABLE_TYPES: frozenset[str] = frozenset(t.TYPE for t in EVENT_TYPES if has_content(t))
