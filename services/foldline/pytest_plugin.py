"""The ``foldline_replay`` pytest fixture: replay recorded sessions through a changed agent in a test suite.

foldline registers this module as a pytest plugin (entry point ``pytest11``), so any suite in an environment
with foldline installed can ask for the fixture::

    from pathlib import Path

    def test_the_new_prompt_changes_nothing_before_the_first_answer(foldline_replay):
        report = foldline_replay("recorded/*.jsonl", system=Path("prompts/support.txt").read_text())
        report.assert_identical()            # AssertionError listing every divergence

    def test_the_model_upgrade_costs_little(foldline_replay):
        report = foldline_replay("recorded/*.jsonl", model="claude-next")
        assert report.cost.per_session < 2_000

``foldline_replay(*sources, change=None, attachments=None, check_determinism=True, **change_fields)`` returns a
:class:`~foldline.replayer.ReplayReport`. A source is an export file (``foldline export``), a glob pattern of
them — relative paths are taken from the test file's directory, so recordings can sit beside the tests that
replay them — a :class:`~foldline.replayer.Recording`, or a session id read from the configured log
(``--foldline-data-dir DIR`` or the ``foldline_data_dir`` ini option, else the environment: ``FOLDLINE_DATA_DIR``,
``FOLDLINE_BACKEND``, …). The change is ``change=Change(...)`` or its fields as keywords (``system=``,
``model=``, ``tools=``, ``config=``, ``pressure=``); with neither, the recorded agent itself is replayed.
"""

from __future__ import annotations

import contextlib
import glob
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .config import Stores
    from .replayer import Change, Recording, ReplayReport

__all__ = ["ReplayFixture", "foldline_replay", "pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("foldline", "foldline replay")
    group.addoption(
        "--foldline-data-dir",
        dest="foldline_data_dir",
        default=None,
        help="the data directory foldline_replay reads session ids from (default: the foldline configuration)",
    )
    parser.addini("foldline_data_dir", "the data directory foldline_replay reads session ids from", default="")


class ReplayFixture:
    """What ``foldline_replay`` is: call it with the sessions and the change; it answers a ReplayReport."""

    def __init__(self, base: Path, data_dir: Path | None) -> None:
        self.base = base
        self.data_dir = data_dir
        self._stack = contextlib.ExitStack()
        self._stores: Stores | None = None

    def __call__(
        self,
        *sources: str | Path | Recording,
        change: Change | None = None,
        attachments: Path | str | None = None,
        check_determinism: bool = True,
        **change_fields: Any,
    ) -> ReplayReport:
        from .replayer import Change, Recording, replay_sessions

        if change is not None and change_fields:
            raise TypeError("pass either change=Change(...) or its fields as keywords, not both")
        chosen = change if change is not None else Change(**change_fields)
        if not sources:
            raise TypeError("foldline_replay needs sessions: export files, glob patterns, or session ids")
        bundle = self.base / attachments if attachments is not None else None
        resolved: list[Recording | str | Path] = []
        for source in sources:
            if isinstance(source, Recording | Path):
                resolved.append(source if not isinstance(source, Path) else self.base / source)
                continue
            matches = sorted(glob.glob(str(self.base / source))) if glob.has_magic(source) else []
            if matches:
                resolved += [Path(m) for m in matches]
            elif glob.has_magic(source):
                raise FileNotFoundError(f"no export file matches {source!r} under {self.base}")
            elif (self.base / source).is_file():
                resolved.append(self.base / source)
            else:
                resolved.append(source)
        stores = self.stores() if any(isinstance(r, str) for r in resolved) else None
        return replay_sessions(
            resolved, chosen, stores=stores, attachments_dir=bundle, check_determinism=check_determinism
        )

    def stores(self) -> Stores:
        """The configured stores, opened read-only on first use and closed when the test ends."""
        if self._stores is None:
            from .config import Config, open_stores

            config = Config.from_env()
            if self.data_dir is not None:
                config = config.overridden(data_dir=self.data_dir)
            self._stores = open_stores(config, read_only=True)
            self._stack.callback(self._stores.close)
        return self._stores

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def foldline_replay(request: pytest.FixtureRequest) -> Iterator[ReplayFixture]:
    """Replay recorded sessions through a changed agent (see the module docstring)."""
    option = request.config.getoption("foldline_data_dir") or request.config.getini("foldline_data_dir")
    data_dir = Path(str(option)) if option else None
    fixture = ReplayFixture(Path(request.path).parent, data_dir)
    try:
        yield fixture
    finally:
        fixture.close()
