"""The PartitionMarks port: a projector's note, per partition of the topic it folds, of what the fold store holds.

A mark says the fold store holds the folds of everything the consumer group consumed in that partition
(``done``), or that a re-read of the partition from its start is under way (a token of the re-reader's own).
The marks live with the folds — in the same store, under the same key prefix — so a store that lost its data
(Redis flushed, or restarted without persistence) lost them too: that is how projectors notice, and re-read
the partitions whose mark is gone (docs/PROJECTOR.md).

Contract (``tests/contracts/partition_marks.py`` runs it against every adapter):

* ``marks(topic, partitions)`` answers the mark of each of ``partitions`` that has one (unmarked partitions
  left out; another topic's marks are not this topic's);
* ``set_mark(topic, partition, mark)`` sets it; with ``expect``, only while the mark is ``expect``,
  atomically (a re-read marks its partition ``done`` only if no other re-read took it over meanwhile), and
  answers whether it did.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

__all__ = ["PartitionMarks"]


class PartitionMarks(abc.ABC):
    @abc.abstractmethod
    def marks(self, topic: str, partitions: Sequence[int]) -> dict[int, str]:
        """The mark of each of ``partitions`` of ``topic`` (unmarked partitions left out)."""

    @abc.abstractmethod
    def set_mark(self, topic: str, partition: int, mark: str, *, expect: str | None = None) -> bool:
        """Set a partition's mark; with ``expect``, only while the mark is ``expect``. True if it was set."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""
