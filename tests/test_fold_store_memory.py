"""The fold-store contract against the in-process store."""

from __future__ import annotations

from foldline.adapters.memory_folds import MemoryFoldStore
from foldline.ports.fold_store import FoldStore
from tests.contracts.fold_store import FoldStoreContract


class TestMemoryFoldStore(FoldStoreContract):
    def make_store(self) -> FoldStore:
        return MemoryFoldStore()
