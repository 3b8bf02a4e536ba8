"""The AttachmentStore port: immutable objects addressed by the sha256 of their bytes."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

from ..core.content import ImageRef

__all__ = ["AttachmentMeta", "AttachmentStore", "ByteSink", "ByteSource", "describe", "verify"]


class ByteSource(Protocol):
    """What ``put_stream`` reads from: ``read(n)`` until it returns ``b""`` (a file opened ``"rb"``...)."""

    def read(self, size: int = ..., /) -> bytes: ...


class ByteSink(Protocol):
    """What ``get_to`` writes to (a file opened ``"wb"``, a socket file, a hasher...)."""

    def write(self, data: bytes, /) -> object: ...


@dataclass(frozen=True, slots=True)
class AttachmentMeta:
    """What the store records beside an object; an image's metadata matches its ImageRef."""

    attachment_id: str
    media_type: str
    bytes: int
    width: int | None = None
    height: int | None = None

    def image_ref(self) -> ImageRef:
        if self.width is None or self.height is None:
            raise ValueError(f"{self.attachment_id} has no image dimensions ({self.media_type})")
        return ImageRef(self.attachment_id, self.media_type, self.bytes, self.width, self.height)

    @staticmethod
    def of(ref: ImageRef) -> AttachmentMeta:
        return AttachmentMeta(ref.attachment_id, ref.media_type, ref.bytes, ref.width, ref.height)


class AttachmentStore(abc.ABC):
    """Content-addressed object store.

    Contract (``tests/contracts/attachments.py`` runs it against every adapter):

    * ``put`` stores bytes under ``sha256:<hex>`` of their content with their metadata; identical content
      is stored once; putting it again returns the same metadata. For images (``image/*``) width and
      height are read from the bytes and must match any that are given.
    * ``get`` re-hashes the bytes and compares the stored metadata with ``expected`` (when given);
      failures are :class:`~foldline.errors.AttachmentNotFound`,
      :class:`~foldline.errors.AttachmentCorrupt` or :class:`~foldline.errors.AttachmentReadFailed`.
    """

    @abc.abstractmethod
    def put(
        self, data: bytes, media_type: str, *, width: int | None = None, height: int | None = None
    ) -> AttachmentMeta:
        """Store ``data``; returns its metadata (id = ``sha256:<hex>``)."""

    @abc.abstractmethod
    def get(self, attachment_id: str, expected: AttachmentMeta | ImageRef | None = None) -> bytes:
        """The verified bytes of an object."""

    @abc.abstractmethod
    def meta(self, attachment_id: str) -> AttachmentMeta:
        """The stored metadata of an object (AttachmentNotFound when absent)."""

    @abc.abstractmethod
    def exists(self, attachment_id: str) -> bool:
        """Whether an object with that id is stored (not verified)."""

    @abc.abstractmethod
    def delete(self, attachment_id: str) -> bool:
        """Remove an object and its metadata; True if it was there. Objects are immutable and shared by digest:
        only an erasure removes one, once no session that is not erased references it (docs/ERASURE.md)."""

    def put_stream(self, stream: ByteSource, media_type: str) -> AttachmentMeta:
        """Store a large object from a stream. Default: read it whole (adapters may stream)."""
        return self.put(stream.read(), media_type)

    def get_to(self, attachment_id: str, out: ByteSink, expected: AttachmentMeta | ImageRef | None = None) -> int:
        """Write a verified object to ``out``; returns the byte count. Default: via ``get``."""
        data = self.get(attachment_id, expected)
        out.write(data)
        return len(data)

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Return if the store answers now (a readiness probe: one quick request, no retries); else raise
        :class:`~foldline.errors.StoreUnavailable` saying why. Default: a store that is always there."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


def describe(data: bytes, media_type: str, width: int | None, height: int | None) -> AttachmentMeta:
    """Metadata for new content: digest, length and (for images) dimensions read from the bytes.

    Content a store must refuse (a malformed media type, bytes that are not the image they claim to be, a
    size that disagrees with the image) raises :class:`~foldline.errors.AttachmentError` for ``(new)``.
    """
    from ..core.codec import digest_bytes
    from ..core.images import image_dimensions
    from ..errors import AttachmentError

    if not media_type or "/" not in media_type:
        raise AttachmentError("(new)", f"cannot store: media type must look like 'type/subtype', got {media_type!r}")
    if media_type.startswith("image/"):
        try:
            w, h = image_dimensions(data, media_type)
        except ValueError as exc:
            raise AttachmentError("(new)", f"cannot store: {exc}") from exc
        if (width is not None and width != w) or (height is not None and height != h):
            raise AttachmentError(
                "(new)", f"cannot store: given size {width}x{height} does not match the image's {w}x{h}"
            )
        width, height = w, h
    return AttachmentMeta(digest_bytes(data), media_type, len(data), width, height)


def verify(
    attachment_id: str, data: bytes, stored: AttachmentMeta, expected: AttachmentMeta | ImageRef | None
) -> bytes:
    """Re-hash ``data`` and compare the stored and expected metadata; AttachmentCorrupt on mismatch."""
    from ..core.codec import digest_bytes
    from ..errors import AttachmentCorrupt

    actual = digest_bytes(data)
    if actual != attachment_id:
        raise AttachmentCorrupt(attachment_id, f"stored bytes hash to {actual}; the object is corrupt")
    if stored.bytes != len(data):
        raise AttachmentCorrupt(attachment_id, f"stored metadata says {stored.bytes} bytes, object has {len(data)}")
    if expected is not None:
        want = AttachmentMeta.of(expected) if isinstance(expected, ImageRef) else expected
        if want != stored:
            raise AttachmentCorrupt(
                attachment_id,
                f"metadata mismatch: the reference records {_fmt(want)}, the store has {_fmt(stored)}",
            )
    return data


def _fmt(m: AttachmentMeta) -> str:
    size = f", {m.width}x{m.height}" if m.width is not None else ""
    return f"{m.media_type}, {m.bytes} bytes{size}"
