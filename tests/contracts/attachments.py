"""The AttachmentStore contract: every adapter (memory, filesystem, s3) runs exactly this suite."""

from __future__ import annotations

import abc
import io
import struct
import threading
import zlib
from collections.abc import Iterator

import pytest

from foldline.core.codec import digest_bytes
from foldline.errors import AttachmentCorrupt, AttachmentError, AttachmentNotFound
from foldline.ports.attachments import AttachmentMeta, AttachmentStore


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A real, minimal PNG of the given size (grey pixels shaded by ``seed``)."""
    raw = b"".join(b"\x00" + bytes([(seed + x + y) % 256 for x in range(width)]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


class AttachmentStoreContract(abc.ABC):
    @abc.abstractmethod
    def make_store(self) -> AttachmentStore:
        """A store for this test (empty, or isolated by a unique prefix)."""

    @abc.abstractmethod
    def corrupt(self, store: AttachmentStore, attachment_id: str, data: bytes) -> None:
        """Overwrite the stored object's bytes behind the store's back."""

    @pytest.fixture
    def store(self) -> Iterator[AttachmentStore]:
        s = self.make_store()
        try:
            yield s
        finally:
            s.close()

    def test_put_get_round_trip(self, store: AttachmentStore) -> None:
        data = png(7, 5)
        meta = store.put(data, "image/png")
        assert meta == AttachmentMeta(digest_bytes(data), "image/png", len(data), 7, 5)
        assert store.exists(meta.attachment_id)
        assert store.get(meta.attachment_id) == data
        assert store.get(meta.attachment_id, meta.image_ref()) == data
        assert store.meta(meta.attachment_id) == meta

    def test_identical_content_is_stored_once(self, store: AttachmentStore) -> None:
        data = b"the same bytes"
        a = store.put(data, "text/plain")
        b = store.put(data, "text/plain")
        assert a == b
        assert store.get(a.attachment_id) == data

    def test_concurrent_identical_puts_agree(self, store: AttachmentStore) -> None:
        data = png(16, 16, seed=3)
        results: list[AttachmentMeta] = []
        errors: list[BaseException] = []

        def put() -> None:
            try:
                results.append(store.put(data, "image/png"))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=put) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(set(results)) == 1
        assert store.get(results[0].attachment_id) == data

    def test_delete_removes_one_object_and_nothing_else(self, store: AttachmentStore) -> None:
        gone = store.put(png(3, 2, seed=1), "image/png")
        kept = store.put(b"another object", "text/plain")
        assert store.delete(gone.attachment_id) is True
        assert not store.exists(gone.attachment_id)
        with pytest.raises(AttachmentNotFound):
            store.get(gone.attachment_id)
        assert store.delete(gone.attachment_id) is False  # gone already: nothing to do
        assert store.get(kept.attachment_id) == b"another object"
        assert store.put(png(3, 2, seed=1), "image/png") == gone  # the same bytes can be stored again

    def test_missing_object_is_not_found(self, store: AttachmentStore) -> None:
        missing = digest_bytes(b"never stored")
        assert not store.exists(missing)
        with pytest.raises(AttachmentNotFound):
            store.get(missing)
        with pytest.raises(AttachmentNotFound):
            store.get("sha256:not-hex")

    def test_corrupt_bytes_are_detected(self, store: AttachmentStore) -> None:
        data = png(4, 4)
        meta = store.put(data, "image/png")
        self.corrupt(store, meta.attachment_id, data[:-3] + b"xyz")
        with pytest.raises(AttachmentCorrupt):
            store.get(meta.attachment_id, meta.image_ref())

    def test_metadata_mismatch_is_corrupt(self, store: AttachmentStore) -> None:
        data = png(4, 3)
        meta = store.put(data, "image/png")
        wrong = AttachmentMeta(meta.attachment_id, "image/png", meta.bytes, 3, 4)
        with pytest.raises(AttachmentCorrupt) as info:
            store.get(meta.attachment_id, wrong)
        assert "4x3" in str(info.value)

    def test_image_dimensions_are_checked_on_put(self, store: AttachmentStore) -> None:
        with pytest.raises(AttachmentError):
            store.put(png(4, 4), "image/png", width=5, height=4)
        with pytest.raises(AttachmentError):
            store.put(b"not a png", "image/png")

    def test_stream_round_trip(self, store: AttachmentStore) -> None:
        data = bytes(range(256)) * 4096  # 1 MiB
        meta = store.put_stream(io.BytesIO(data), "application/octet-stream")
        assert meta.attachment_id == digest_bytes(data)
        out = io.BytesIO()
        assert store.get_to(meta.attachment_id, out) == len(data)
        assert out.getvalue() == data
