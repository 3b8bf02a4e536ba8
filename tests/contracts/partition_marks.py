"""The PartitionMarks contract: every adapter (memory, redis) runs exactly this suite.

Subclass :class:`PartitionMarksContract` in a ``Test*`` class and implement ``make_marks``.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator

import pytest

from foldline.ports.partition_marks import PartitionMarks


class PartitionMarksContract(abc.ABC):
    @abc.abstractmethod
    def make_marks(self) -> PartitionMarks:
        """Marks for this test (empty, or isolated by a unique prefix)."""

    @pytest.fixture
    def marks(self) -> Iterator[PartitionMarks]:
        made = self.make_marks()
        try:
            yield made
        finally:
            made.close()

    @pytest.fixture
    def topic(self, request: pytest.FixtureRequest) -> str:
        return f"topic-{request.node.name}-{id(request)}"

    def test_marks_are_set_and_read_per_partition(self, marks: PartitionMarks, topic: str) -> None:
        assert marks.marks(topic, [0, 1, 2]) == {}
        assert marks.set_mark(topic, 1, "rereading:a")
        assert marks.marks(topic, [0, 1, 2]) == {1: "rereading:a"}
        assert marks.set_mark(topic, 2, "done")
        assert marks.set_mark(topic, 2, "done")  # setting it again is fine
        assert marks.marks(topic, [0, 1, 2]) == {1: "rereading:a", 2: "done"}
        assert marks.marks(topic, [2]) == {2: "done"}
        assert marks.marks(topic, []) == {}

    def test_another_topics_marks_are_its_own(self, marks: PartitionMarks, topic: str) -> None:
        assert marks.set_mark(topic, 0, "done")
        assert marks.marks(f"{topic}-other", [0]) == {}
        assert marks.set_mark(f"{topic}-other", 0, "rereading:x")
        assert marks.marks(topic, [0]) == {0: "done"}

    def test_a_mark_is_set_on_expectation_only_while_it_holds(self, marks: PartitionMarks, topic: str) -> None:
        assert marks.set_mark(topic, 1, "rereading:a")
        assert not marks.set_mark(topic, 1, "done", expect="rereading:b")  # another re-read took it over
        assert not marks.set_mark(topic, 0, "done", expect="rereading:a")  # no mark at all is not the expected one
        assert marks.marks(topic, [0, 1]) == {1: "rereading:a"}
        assert marks.set_mark(topic, 1, "done", expect="rereading:a")
        assert marks.marks(topic, [0, 1]) == {1: "done"}
        assert not marks.set_mark(topic, 1, "done", expect="rereading:a")  # it is no longer that

    def test_of_many_setters_expecting_the_same_mark_exactly_one_wins(self, marks: PartitionMarks, topic: str) -> None:
        def race(expected: str, takers: int) -> list[str]:
            won: list[str] = []
            barrier = threading.Barrier(takers)

            def claim(name: str) -> None:
                barrier.wait()
                if marks.set_mark(topic, 3, name, expect=expected):
                    won.append(name)

            threads = [threading.Thread(target=claim, args=(f"taker-{i}",)) for i in range(takers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return won

        for round_ in range(5):
            assert marks.set_mark(topic, 3, f"rereading:{round_}")
            won = race(f"rereading:{round_}", 6)
            assert len(won) == 1, won
            assert marks.marks(topic, [3]) == {3: won[0]}
