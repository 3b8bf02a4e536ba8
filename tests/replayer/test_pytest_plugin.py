"""The `foldline_replay` fixture, as a user's own test suite gets it (the plugin foldline installs)."""

from __future__ import annotations

import runpy
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from foldline.cli.main import app

pytest_plugins = ["pytester"]

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two demo sessions exported the way a team keeps recordings beside its tests."""
    root = tmp_path_factory.mktemp("plugin")
    data = root / "data"
    assert runner.invoke(app, ["demo", "--sessions", "2", "--steps", "6", "--data-dir", str(data)]).exit_code == 0
    for sid in ("demo-000", "demo-001"):
        res = runner.invoke(
            app,
            [
                "export",
                sid,
                "--out",
                str(root / f"{sid}.jsonl"),
                "--attachments",
                str(root / "objects"),
                "--data-dir",
                str(data),
            ],
        )
        assert res.exit_code == 0, res.output
    return root


def test_the_fixture_replays_export_files_and_session_ids(recorded: Path, pytester: pytest.Pytester) -> None:
    for name in ("demo-000.jsonl", "demo-001.jsonl"):
        (pytester.path / "recorded").mkdir(exist_ok=True)
        (pytester.path / "recorded" / name).write_bytes((recorded / name).read_bytes())
    (pytester.path / "objects").symlink_to(recorded / "objects")
    pytester.makepyfile(
        test_agent=textwrap.dedent(
            """
            import pytest
            from foldline import Change

            def test_the_recorded_agent_is_identical(foldline_replay):
                report = foldline_replay("recorded/*.jsonl", attachments="objects")
                report.assert_identical()
                assert [s.session for s in report.sessions] == ["demo-000", "demo-001"]

            def test_a_session_id_from_the_configured_data_dir(foldline_replay):
                assert foldline_replay("demo-000").identical

            def test_a_new_prompt_fails_with_every_divergence(foldline_replay):
                report = foldline_replay("recorded/*.jsonl", attachments="objects", system="Be brief.")
                assert report.exit_code == 1
                with pytest.raises(AssertionError) as failed:
                    report.assert_identical()
                assert "demo-000: diverged at turn 0 step 0" in str(failed.value)
                assert "header differs in system" in str(failed.value)

            def test_a_change_object_and_the_cost(foldline_replay):
                report = foldline_replay("recorded/demo-000.jsonl", change=Change(model="claude-next"))
                d = report.sessions[0].divergence
                assert [f.path for f in d.fields] == ["config.model"]
                assert report.cost.sessions == 1
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--foldline-data-dir", str(recorded / "data"))
    result.assert_outcomes(passed=4)


def test_the_readme_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    argv = sys.argv
    sys.argv = ["replay_change.py", str(tmp_path / "data")]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(root / "examples" / "replay_change.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "unchanged: orders-1: identical (6/6 requests)" in out
    assert "new prompt: orders-2: diverged at turn 0 step 0 (seq 4): header differs in system" in out
    res = runner.invoke(
        app,
        [
            "replay",
            "--all",
            "--system-file",
            str(tmp_path / "data" / "new-prompt.txt"),
            "--data-dir",
            str(tmp_path / "data"),
        ],
    )
    assert res.exit_code == 1, res.output
