"""The attachment-store contract against the in-process store."""

from __future__ import annotations

from foldline.adapters.memory_attachments import MemoryAttachmentStore
from foldline.ports.attachments import AttachmentStore
from tests.contracts.attachments import AttachmentStoreContract


class TestMemoryAttachmentStore(AttachmentStoreContract):
    def make_store(self) -> AttachmentStore:
        return MemoryAttachmentStore()

    def corrupt(self, store: AttachmentStore, attachment_id: str, data: bytes) -> None:
        assert isinstance(store, MemoryAttachmentStore)
        store.replace_bytes(attachment_id, data)
