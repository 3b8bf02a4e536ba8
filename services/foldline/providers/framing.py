"""Wire bodies as frame + message chunks, and the per-session incremental body cache.

A framed serializer writes a body as ``head`` (everything up to and including ``"messages":[`` — ``"input":[``
for the Responses API), the canonical bytes of each wire message joined by commas, then ``tail`` (from ``]`` to
the end). Keys are sorted, so for every serializer each top-level key before the list holds scalars or fixed
objects and the first ``"messages":[]`` (``"input":[]``) in the frame's bytes is the top-level one.

A *boundary* between two consecutive messages is a place where serializing the two halves separately
and concatenating their chunks gives the same bytes as serializing the whole list (no wire message
spans it). :class:`IncrementalBody` keeps, per session, the bytes and the SHA-256 state of the head plus
the chunks of every message before the last boundary it has seen. The next request whose messages
extend the same list encodes and hashes only the messages after that boundary, so the cost of a step
does not grow with the session. The cached bytes are immutable blocks of at least :data:`BLOCK_BYTES`
plus one open buffer shorter than that: :meth:`IncrementalBody.parts` hands a body over as those blocks
and one last part (the open buffer, the new messages and the tail), so assembling it copies less than a
block plus the new bytes, not the whole body. Images in the cached prefix are read and verified through the store
again on every call, exactly as a full serialization would, so a corrupted object still fails the
request before anything is sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, cast, runtime_checkable

from ..core.codec import DIGEST_PREFIX, digest_bytes
from ..core.content import ImageBlock, ImageRef, ToolResultBlock
from ..core.header import EpochHeader
from ..core.projection import Message, MessageSequence
from ..core.request import GenerateOptions
from ..ports.attachments import AttachmentStore
from .base import Body, BodyParts, Serializer
from .encoding import image_base64

__all__ = ["BLOCK_BYTES", "FramedSerializer", "IncrementalBody", "split_frame"]

#: The cached prefix is frozen into blocks of at least this many bytes. A body in parts shares them, so its
#: one fresh part holds fewer bytes than this plus the new messages. Kept small beside HTTP/2's frames
#: (16 KiB by default): httpcore cuts the frames of each part it sends by slicing, and each cut copies the
#: rest of that part, which costs the square of a part's length, not of the body's.
BLOCK_BYTES = 32 * 1024


def split_frame(frame: bytes, key: str = "messages") -> tuple[bytes, bytes]:
    """``canonical_json`` of a body whose list ``key`` is ``[]`` → (head through ``[``, tail from ``]``)."""
    marker = b'"' + key.encode() + b'":[]'
    at = frame.find(marker)
    if at < 0:
        raise ValueError(f"a framed body must hold a top-level {key} list")
    cut = at + len(marker) - 1
    return frame[:cut], frame[cut:]


@runtime_checkable
class FramedSerializer(Serializer, Protocol):
    def frame(self, request: GenerateOptions) -> tuple[bytes, bytes, tuple[bytes, ...]]:
        """(head, tail, leading chunks that precede the messages — e.g. a system message)."""
        ...

    def wire_bytes(self, messages: Sequence[Message], start: int, attachments: AttachmentStore | None) -> bytes:
        """Canonical bytes of the wire messages of ``messages`` (which begins at index ``start``), joined by
        commas; empty when they have no wire message."""
        ...

    def boundary(self, prev: Message, nxt: Message) -> bool:
        """True if no wire message spans the gap between ``prev`` and ``nxt``."""
        ...


_FRAMED: dict[type, bool] = {}


def _framed(serializer: Serializer) -> FramedSerializer | None:
    """``serializer`` if it is a :class:`FramedSerializer`. An ``isinstance`` check of a runtime protocol
    walks its members (~0.1 ms, a tenth of opening a session): it is made once per serializer class."""
    cls = type(serializer)
    framed = _FRAMED.get(cls)
    if framed is None:
        framed = _FRAMED[cls] = isinstance(serializer, FramedSerializer)
    return cast(FramedSerializer, serializer) if framed else None


def _images(message: Message) -> list[ImageRef]:
    out: list[ImageRef] = []
    for block in message.content:
        if isinstance(block, ImageBlock):
            out.append(block.image)
        elif isinstance(block, ToolResultBlock):
            out.extend(p.image for p in block.content if isinstance(p, ImageBlock))
    return out


class IncrementalBody:
    """One session's body cache for one serializer. Not thread-safe; one loop instance owns it."""

    __slots__ = (
        "_block_bytes",
        "_blocks",
        "_count",
        "_framed",
        "_has_chunks",
        "_hasher",
        "_header",
        "_images",
        "_items",
        "_open",
        "_serializer",
        "_size",
        "_tail",
        "_verify_cached",
    )

    def __init__(
        self, serializer: Serializer, *, verify_cached_images: bool = True, block_bytes: int = BLOCK_BYTES
    ) -> None:
        """``verify_cached_images=False`` skips re-reading the images of the cached prefix (the invariant
        companion's second serialization of a step whose images the loop's serialization just verified);
        ``block_bytes`` is the least size of a frozen block of the prefix."""
        self._serializer = serializer
        self._block_bytes = block_bytes
        self._framed = _framed(serializer)
        self._verify_cached = verify_cached_images
        self._reset()

    def _reset(self) -> None:
        self._header: EpochHeader | None = None
        self._items: object = None  # the message list the cache extends (identity)
        self._count = 0  # messages before the cached boundary
        # head + chunks of those messages, no trailing comma: the blocks, then the open buffer
        self._blocks: list[bytes] = []
        self._open = bytearray()
        self._size = 0
        self._has_chunks = False  # whether any chunk follows the head
        self._hasher = hashlib.sha256()
        self._tail = b""
        self._images: list[ImageRef] = []

    def serialize(self, request: GenerateOptions, attachments: AttachmentStore | None) -> tuple[bytes, str]:
        """The exact body bytes (equal to ``serializer.serialize``) and their ``sha256:`` digest."""
        suffix = self._advance(request, attachments)
        if isinstance(suffix, bytes):
            return suffix, digest_bytes(suffix)
        sep, joined = suffix
        body = b"".join((*self._blocks, self._open, sep, joined, self._tail))
        return body, self._digest(sep, joined)

    def parts(self, request: GenerateOptions, attachments: AttachmentStore | None) -> tuple[Body, str]:
        """The body :meth:`serialize` would return, as :class:`~foldline.providers.base.BodyParts` — the cached
        blocks, shared, then one part with the rest — and its digest. A body serialized whole (a serializer
        that is not framed, messages that are not a snapshot of one list) comes back as its one ``bytes``."""
        suffix = self._advance(request, attachments)
        if isinstance(suffix, bytes):
            return suffix, digest_bytes(suffix)
        sep, joined = suffix
        last = b"".join((self._open, sep, joined, self._tail))
        return BodyParts((*self._blocks, last)), self._digest(sep, joined)

    def digest(self, request: GenerateOptions, attachments: AttachmentStore | None) -> tuple[str, int]:
        """The digest :meth:`serialize` would return and the body's length, without assembling its bytes."""
        suffix = self._advance(request, attachments)
        if isinstance(suffix, bytes):
            return digest_bytes(suffix), len(suffix)
        sep, joined = suffix
        return self._digest(sep, joined), self._size + len(sep) + len(joined) + len(self._tail)

    def _digest(self, sep: bytes, joined: bytes) -> str:
        hasher = self._hasher.copy()
        hasher.update(sep)
        hasher.update(joined)
        hasher.update(self._tail)
        return DIGEST_PREFIX + hasher.hexdigest()

    def _advance(self, request: GenerateOptions, attachments: AttachmentStore | None) -> bytes | tuple[bytes, bytes]:
        """Extend the cached prefix to the request's last boundary; the bytes after it as (separator, chunks).

        A serializer that is not framed, or messages that are not a snapshot of one message list, are
        serialized whole: the full body is returned instead.
        """
        serializer = self._framed
        messages = request.messages
        if serializer is None or not isinstance(messages, MessageSequence):
            return self._serializer.serialize(request, attachments)
        header = request.header
        items = messages.backing_list()
        if header != self._header or items is not self._items or len(messages) < self._count:
            self._start(serializer, request, items)
        if self._verify_cached:
            for ref in self._images:  # re-read and re-verify, as a full serialization would
                image_base64(ref, attachments, serializer.name)
        n = len(messages)
        cut = self._count
        for j in range(n - 1, self._count, -1):
            if serializer.boundary(messages[j - 1], messages[j]):
                cut = j
                break
        if cut > self._count:
            stable = [messages[i] for i in range(self._count, cut)]
            self._extend(serializer.wire_bytes(stable, self._count, attachments))
            for m in stable:
                self._images.extend(_images(m))
            self._count = cut
        rest = serializer.wire_bytes([messages[i] for i in range(cut, n)], cut, attachments)
        return (b"," if rest and self._has_chunks else b""), rest

    def _start(self, serializer: FramedSerializer, request: GenerateOptions, items: object) -> None:
        self._reset()
        head, tail, lead = serializer.frame(request)
        self._header = request.header
        self._items = items
        self._tail = tail
        self._push(b"", head)
        self._hasher.update(head)
        for chunk in lead:
            self._extend(chunk)

    def _extend(self, joined: bytes) -> None:
        """Append comma-joined chunks (none when empty) to the cached prefix."""
        if not joined:
            return
        sep = b"," if self._has_chunks else b""
        if sep:
            self._hasher.update(sep)
        self._hasher.update(joined)
        self._push(sep, joined)
        self._has_chunks = True

    def _push(self, sep: bytes, data: bytes) -> None:
        """Append ``sep`` and ``data`` to the cached prefix: to the open buffer, or, when that would reach
        ``block_bytes``, as a new block made of the open buffer and them (the buffer starts empty)."""
        self._size += len(sep) + len(data)
        if len(self._open) + len(sep) + len(data) < self._block_bytes:
            self._open += sep
            self._open += data
        else:
            self._blocks.append(b"".join((self._open, sep, data)))
            self._open = bytearray()
