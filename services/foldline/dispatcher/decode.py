"""Decoding a fold's message bytes, with a cache of what was decoded (the dispatcher's hot path).

:func:`~foldline.core.fold.decode_message` reads each block with the decoders generated from the block
definitions (``core/records.py``), and names the problem when one is not well formed; a dispatcher serving a
session step after step decodes only the messages appended since its last step (:class:`MessageCache`).
"""

from __future__ import annotations

from collections import OrderedDict

from ..core.fold import decode_message
from ..core.projection import Message

__all__ = ["MessageCache", "decode_fold_messages"]


def decode_fold_messages(raw: tuple[bytes, ...]) -> tuple[Message, ...]:
    """Decode a fold's message bytes: ``tuple(decode_message(m) for m in raw)``."""
    return tuple([decode_message(m) for m in raw])


class MessageCache:
    """Decoded fold messages by their exact bytes (an LRU of at most ``capacity`` messages).

    Decoding is a pure function of the bytes, so equal bytes always decode to an equal message: a hit is
    the same answer :func:`decode_fold_messages` would give. A dispatcher serving a session step after
    step then decodes only the messages appended since its last step. A call never evicts a message it
    decodes or finds itself: a fold read whole that holds more messages than the cache keeps its first
    ``capacity`` cached from one read to the next, instead of each read pushing out what the next needs first.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Message] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def decode(self, raw: tuple[bytes, ...]) -> tuple[Message, ...]:
        entries = self._entries
        out: list[Message] = []
        missing: list[int] = []
        for i, m in enumerate(raw):
            hit = entries.get(m)
            if hit is None:
                missing.append(i)
                out.append(_PLACEHOLDER)
            else:
                entries.move_to_end(m)
                out.append(hit)
        if missing:
            decoded = decode_fold_messages(tuple(raw[i] for i in missing))
            used = set(raw) if len(entries) + len(missing) > self.capacity else None
            for i, message in zip(missing, decoded, strict=True):
                out[i] = message
                if used is not None and len(entries) >= self.capacity:
                    if next(iter(entries)) in used:
                        continue  # only this call's own messages are left to evict: keep them
                    entries.popitem(last=False)
                entries[raw[i]] = message
        self.hits += len(raw) - len(missing)
        self.misses += len(missing)
        return tuple(out)


_PLACEHOLDER = Message("user", ())
