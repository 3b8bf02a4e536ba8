"""Filesystem attachment store: ``objects/<2 hex>/<64 hex>`` plus a ``.meta.json`` beside each object.

Writes go to a temporary file in the same directory, are fsynced and renamed into place, metadata
first and the object last — the object's presence is the commit point, so a crash leaves either a
complete object or none. Identical content maps to one path and is stored once.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..core import codec
from ..core.content import ATTACHMENT_ID_RE, ImageRef
from ..errors import AttachmentCorrupt, AttachmentError, AttachmentNotFound, AttachmentReadFailed
from ..ports.attachments import AttachmentMeta, AttachmentStore, ByteSource, describe, verify

__all__ = ["FilesystemAttachmentStore", "meta_from_json", "meta_to_json"]


def meta_to_json(m: AttachmentMeta) -> bytes:
    out: dict[str, object] = {"attachmentId": m.attachment_id, "mediaType": m.media_type, "bytes": m.bytes}
    if m.width is not None:
        out["width"] = m.width
        out["height"] = m.height
    return codec.canonical_json(out)


def meta_from_json(attachment_id: str, raw: bytes) -> AttachmentMeta:
    try:
        d = codec.loads(raw)
        meta = AttachmentMeta(
            str(d["attachmentId"]), str(d["mediaType"]), int(d["bytes"]), d.get("width"), d.get("height")
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise AttachmentCorrupt(attachment_id, f"stored metadata is unreadable: {exc}") from exc
    if meta.attachment_id != attachment_id:
        raise AttachmentCorrupt(attachment_id, f"stored metadata names {meta.attachment_id}")
    return meta


class FilesystemAttachmentStore(AttachmentStore):
    """``read_only=True`` creates nothing (a missing root holds no objects) and refuses ``put``."""

    def __init__(self, root: str | Path, *, read_only: bool = False) -> None:
        self.root = Path(root)
        self.read_only = read_only
        if read_only:
            return
        try:
            (self.root / "objects").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AttachmentReadFailed(
                "(store)", f"cannot create the attachment directory {self.root / 'objects'}: {exc.strerror or exc}"
            ) from exc

    def _paths(self, attachment_id: str) -> tuple[Path, Path]:
        if not ATTACHMENT_ID_RE.match(attachment_id):
            raise AttachmentNotFound(attachment_id, "not a valid attachment id ('sha256:' + 64 lowercase hex)")
        hexd = attachment_id.removeprefix(codec.DIGEST_PREFIX)
        d = self.root / "objects" / hexd[:2]
        return d / hexd, d / (hexd + ".meta.json")

    def put(
        self, data: bytes, media_type: str, *, width: int | None = None, height: int | None = None
    ) -> AttachmentMeta:
        meta = describe(data, media_type, width, height)
        obj, meta_path = self._paths(meta.attachment_id)
        if self.read_only:
            raise AttachmentReadFailed(meta.attachment_id, f"the store {self.root} was opened read-only")
        if obj.exists():
            existing = self.meta(meta.attachment_id)
            if existing.media_type != meta.media_type:
                raise AttachmentError(
                    meta.attachment_id,
                    f"already stored as {existing.media_type}; the same bytes cannot also be {meta.media_type}",
                )
            return existing
        try:
            obj.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(meta_path, meta_to_json(meta))
            _atomic_write(obj, data)
        except OSError as exc:
            raise AttachmentReadFailed(meta.attachment_id, f"write failed: {exc}") from exc
        return meta

    def meta(self, attachment_id: str) -> AttachmentMeta:
        obj, meta_path = self._paths(attachment_id)
        try:
            if not obj.exists():
                raise AttachmentNotFound(attachment_id, f"no object in {self.root}")
            raw = meta_path.read_bytes()
        except FileNotFoundError as exc:
            raise AttachmentCorrupt(attachment_id, "object has no metadata file") from exc
        except OSError as exc:
            raise AttachmentReadFailed(attachment_id, f"cannot read metadata: {exc}") from exc
        return meta_from_json(attachment_id, raw)

    def get(self, attachment_id: str, expected: AttachmentMeta | ImageRef | None = None) -> bytes:
        obj, _ = self._paths(attachment_id)
        stored = self.meta(attachment_id)
        try:
            data = obj.read_bytes()
        except FileNotFoundError as exc:
            raise AttachmentNotFound(attachment_id, f"no object in {self.root}") from exc
        except OSError as exc:
            raise AttachmentReadFailed(attachment_id, f"cannot read object: {exc}") from exc
        return verify(attachment_id, data, stored, expected)

    def exists(self, attachment_id: str) -> bool:
        try:
            return self._paths(attachment_id)[0].exists()
        except AttachmentNotFound:
            return False

    def delete(self, attachment_id: str) -> bool:
        obj, meta_path = self._paths(attachment_id)
        if self.read_only:
            raise AttachmentReadFailed(attachment_id, f"the store {self.root} was opened read-only")
        try:
            existed = obj.exists()
            obj.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
        except OSError as exc:
            raise AttachmentReadFailed(attachment_id, f"cannot remove the object: {exc.strerror or exc}") from exc
        return existed

    def put_stream(self, stream: ByteSource, media_type: str) -> AttachmentMeta:
        return self.put(stream.read(), media_type)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
