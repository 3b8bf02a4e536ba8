"""The fold-store and partition-marks contracts against the in-process adapters."""

from __future__ import annotations

from foldline.adapters.memory_folds import MemoryFoldStore, MemoryPartitionMarks
from foldline.ports.fold_store import FoldStore
from foldline.ports.partition_marks import PartitionMarks
from tests.contracts.fold_store import FoldStoreContract
from tests.contracts.partition_marks import PartitionMarksContract


class TestMemoryFoldStore(FoldStoreContract):
    def make_store(self) -> FoldStore:
        return MemoryFoldStore()


class TestMemoryPartitionMarks(PartitionMarksContract):
    def make_marks(self) -> PartitionMarks:
        return MemoryPartitionMarks()
