"""What an inbox entry is: a message for a later step, or an approval decision — defined once, like the events.

The inbox of a session is a store beside its log (docs/LOOP.md, "The durable inbox"): any process may put an
entry there; only the session's writer moves entries into the log — a message as a ``user/message`` after an
``inbox/claim`` naming the entry, a decision as an ``approval/decision`` naming it. Each entry is stored as the
canonical JSON of :class:`InboxEntry` (docs/FORMAT.md §6):

    {"id":"…","item":{"content":[…],"kind":"message","source":"inject"},"time":1767225600000}
    {"id":"…","item":{"callId":"…","kind":"decision","verdict":"allow",…},"time":1767225600000}

With encryption on, the content of the item is sealed under the session's data key like an event's
(``core/sealing.py``, :func:`~.sealing.seal_entry`) and the entry carries ``"sealed":{"kid":…,"v":1}``.
"""

from __future__ import annotations

from typing import Any

from ..errors import FormatError
from . import codec
from .content import ContentBlock
from .events import ApprovalVerdict, Seal
from .records import Id, Nat, Record, read_json, to_json

__all__ = ["InboxDecision", "InboxEntry", "InboxItemRecord", "InboxMessage", "decode_entry", "encode_entry"]


class InboxMessage(Record, tag_field="kind", tag="message", frozen=True):
    """A message for a later request: ``source`` says who entered it (``inject``, ``tool-context``, …)."""

    content: tuple[ContentBlock, ...]
    source: str = "inject"


class InboxDecision(Record, tag_field="kind", tag="decision", frozen=True):
    """A decision on the approval request of ``call_id``: the fields of the ``approval/decision`` it becomes."""

    call_id: Id
    verdict: ApprovalVerdict
    reason: str | None = None
    arguments: str | None = None  # raw JSON text (an object) the call runs with instead of the model's
    decided_by: str | None = None


InboxItemRecord = InboxMessage | InboxDecision


class InboxEntry(Record, frozen=True):
    """One entry of a session's inbox: its id (unique within the session), when it was put (epoch ms), and what.

    ``sealed`` says the item's content (a message's content fields, a decision's ``reason`` and ``arguments``)
    is stored as tokens under the session's data key (:func:`~.sealing.seal_entry`, docs/FORMAT.md §6)."""

    id: Id
    time: Nat
    item: InboxItemRecord
    sealed: Seal | None = None


def encode_entry(entry: InboxEntry) -> bytes:
    """The canonical JSON bytes an inbox store keeps for ``entry``."""
    return codec.canonical_json(to_json(entry))


def decode_entry(raw: bytes | str, where: str = "inbox entry") -> InboxEntry:
    """An entry from its stored bytes; :class:`~foldline.errors.FormatError` naming the field that is wrong."""
    try:
        value: Any = codec.loads(raw)
    except ValueError as exc:
        raise FormatError("format", f"{where} is not JSON: {exc}") from exc
    entry: InboxEntry = read_json(InboxEntry, value, where)
    return entry
