from __future__ import annotations

from pathlib import Path

import pytest

from foldline.adapters.fs_attachments import FilesystemAttachmentStore
from foldline.errors import AttachmentCorrupt
from foldline.ports.attachments import AttachmentStore
from tests.contracts.attachments import AttachmentStoreContract, png


class TestFilesystemAttachmentStore(AttachmentStoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.dir = tmp_path

    def make_store(self) -> AttachmentStore:
        return FilesystemAttachmentStore(self.dir / "attachments")

    def corrupt(self, store: AttachmentStore, attachment_id: str, data: bytes) -> None:
        hexd = attachment_id.removeprefix("sha256:")
        (self.dir / "attachments" / "objects" / hexd[:2] / hexd).write_bytes(data)


def test_layout_is_content_addressed(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    meta = store.put(png(2, 2), "image/png")
    hexd = meta.attachment_id.removeprefix("sha256:")
    assert (tmp_path / "objects" / hexd[:2] / hexd).read_bytes() == png(2, 2)
    assert not list((tmp_path / "objects" / hexd[:2]).glob(".tmp-*"))


def test_unreadable_metadata_is_corrupt(tmp_path: Path) -> None:
    store = FilesystemAttachmentStore(tmp_path)
    meta = store.put(b"abc", "text/plain")
    hexd = meta.attachment_id.removeprefix("sha256:")
    (tmp_path / "objects" / hexd[:2] / (hexd + ".meta.json")).write_bytes(b"{broken")
    with pytest.raises(AttachmentCorrupt):
        store.get(meta.attachment_id)
