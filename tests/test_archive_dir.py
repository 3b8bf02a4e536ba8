"""The directory archive store (the embedded backend's backup) runs the archive store contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from foldline.adapters.dir_archive import DirectoryArchiveStore
from foldline.ports.archive import ArchiveStore
from tests.contracts.archive_store import ArchiveStoreContract


class TestDirectoryArchiveStore(ArchiveStoreContract):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path / "archive"

    def make_store(self) -> ArchiveStore:
        return DirectoryArchiveStore(self.root)

    def tamper(self, store: ArchiveStore, key: str, data: bytes) -> None:
        (self.root / key).write_bytes(data)


def test_keys_that_leave_the_root_are_refused(tmp_path: Path) -> None:
    store = DirectoryArchiveStore(tmp_path)
    for key in ("../x", "a/../../x", ".hidden", "a//b", ""):
        with pytest.raises(ValueError, match="not an archive key"):
            store.create(key, b"x")
