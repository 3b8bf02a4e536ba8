"""An in-process attachment store: the reference behaviour of the port, used by fast tests.

Objects live in a dict keyed by their ``sha256:<hex>`` id, beside the metadata read from their bytes.
Every read re-hashes the bytes and checks the metadata through the port's ``verify``, exactly like the
filesystem and S3 stores, so nothing can pass here that a durable store would refuse.
"""

from __future__ import annotations

import threading

from ..core.content import ATTACHMENT_ID_RE, ImageRef
from ..errors import AttachmentError, AttachmentNotFound
from ..ports.attachments import AttachmentMeta, AttachmentStore, describe, verify

__all__ = ["MemoryAttachmentStore"]


class MemoryAttachmentStore(AttachmentStore):
    """The AttachmentStore port over a dict. ``reads`` counts the objects read (``get`` and ``get_to``)."""

    def __init__(self) -> None:
        self._objects: dict[str, tuple[bytes, AttachmentMeta]] = {}
        self._lock = threading.Lock()
        self.reads = 0

    def put(
        self, data: bytes, media_type: str, *, width: int | None = None, height: int | None = None
    ) -> AttachmentMeta:
        meta = describe(data, media_type, width, height)
        with self._lock:
            stored = self._objects.setdefault(meta.attachment_id, (bytes(data), meta))[1]
        if stored.media_type != meta.media_type:
            raise AttachmentError(
                meta.attachment_id,
                f"already stored as {stored.media_type}; the same bytes cannot also be {meta.media_type}",
            )
        return stored

    def _entry(self, attachment_id: str) -> tuple[bytes, AttachmentMeta]:
        if not ATTACHMENT_ID_RE.match(attachment_id):
            raise AttachmentNotFound(attachment_id, "not a valid attachment id ('sha256:' + 64 lowercase hex)")
        with self._lock:
            entry = self._objects.get(attachment_id)
        if entry is None:
            raise AttachmentNotFound(attachment_id, "no such object in the in-memory store")
        return entry

    def get(self, attachment_id: str, expected: AttachmentMeta | ImageRef | None = None) -> bytes:
        data, stored = self._entry(attachment_id)
        with self._lock:
            self.reads += 1
        return verify(attachment_id, data, stored, expected)

    def meta(self, attachment_id: str) -> AttachmentMeta:
        return self._entry(attachment_id)[1]

    def exists(self, attachment_id: str) -> bool:
        with self._lock:
            return attachment_id in self._objects

    def delete(self, attachment_id: str) -> bool:
        with self._lock:
            return self._objects.pop(attachment_id, None) is not None

    def replace_bytes(self, attachment_id: str, data: bytes) -> None:
        """Overwrite a stored object's bytes, keeping its metadata — what a corrupted disk or bucket does.

        For tests of the read-side checks: the next ``get`` must notice the bytes no longer hash to the id.
        """
        _, stored = self._entry(attachment_id)
        with self._lock:
            self._objects[attachment_id] = (bytes(data), stored)
