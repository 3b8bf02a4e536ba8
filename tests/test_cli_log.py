"""``foldline sessions | export | import`` through the real typer app, with exit codes and FOLDLINE_DATA_DIR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core import encode_event
from tests.factories import simple_log


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("FOLDLINE_DATA_DIR", raising=False)
    monkeypatch.delenv("FOLDLINE_BACKEND", raising=False)
    return CliRunner()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    with SqliteEventLog(d) as log:
        log.append("alpha", 0, simple_log(2, 2))
        log.append("beta", 0, simple_log(1, 1))
    return d


def one_line(text: str) -> str:
    return " ".join(text.split())


def run(runner: CliRunner, *args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def test_sessions_table_and_json(runner: CliRunner, data: Path) -> None:
    result = run(runner, "sessions", "--data-dir", data)
    assert result.exit_code == 0, result.output
    assert "alpha" in result.stdout
    assert "beta" in result.stdout
    alpha, beta = simple_log(2, 2), simple_log(1, 1)
    result = run(runner, "sessions", "--data-dir", data, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {
            "id": "alpha",
            "events": len(alpha),
            "lastEventTime": alpha[-1].time,
            "lastEventAt": "2023-11-14T22:13:20.022Z",
            "parent": None,  # no lineage: neither a fork nor a sub-agent
            "children": [],
        },
        {
            "id": "beta",
            "events": len(beta),
            "lastEventTime": beta[-1].time,
            "lastEventAt": "2023-11-14T22:13:20.006Z",
            "parent": None,  # no lineage: neither a fork nor a sub-agent
            "children": [],
        },
    ]


def test_sessions_reads_the_data_dir_from_the_environment(
    runner: CliRunner, data: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FOLDLINE_DATA_DIR", str(data))
    result = run(runner, "sessions", "--json")
    assert result.exit_code == 0, result.output
    assert [row["id"] for row in json.loads(result.stdout)] == ["alpha", "beta"]
    # --data-dir wins over the environment
    empty = tmp_path / "empty"
    result = run(runner, "sessions", "--json", "--data-dir", empty)
    assert json.loads(result.stdout) == []
    assert not empty.exists()  # listing does not create a data directory


def test_sessions_defaults_to_foldline_data_in_the_working_directory(
    runner: CliRunner, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(data.parent)
    data.rename(data.parent / "foldline-data")
    result = run(runner, "sessions", "--json")
    assert [row["id"] for row in json.loads(result.stdout)] == ["alpha", "beta"]


def test_export_then_import_as_new_id_round_trips(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "alpha.jsonl"
    result = run(runner, "export", "alpha", "--out", out, "--data-dir", data)
    assert result.exit_code == 0, result.output
    assert "exported 23 events of 'alpha'" in result.stdout
    lines = out.read_bytes().split(b"\n")
    assert lines[1:-1] == [encode_event(e) for e in simple_log(2, 2)]
    assert lines[-1] == b""

    result = run(runner, "import", out, "--as", "gamma", "--data-dir", data)
    assert result.exit_code == 0, result.output
    assert "imported 23 events as session 'gamma'" in result.stdout
    with SqliteEventLog(data) as log:
        assert log.sessions() == ["alpha", "beta", "gamma"]
        assert log.read("gamma") == simple_log(2, 2)

    again = tmp_path / "gamma.jsonl"
    assert run(runner, "export", "gamma", "-o", again, "--data-dir", data).exit_code == 0
    assert again.read_bytes().split(b"\n", 1)[1] == out.read_bytes().split(b"\n", 1)[1]


def test_import_into_another_data_dir_via_the_environment(
    runner: CliRunner, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "beta.jsonl"
    assert run(runner, "export", "beta", "--out", out, "--data-dir", data).exit_code == 0
    other = tmp_path / "other"
    monkeypatch.setenv("FOLDLINE_DATA_DIR", str(other))
    result = run(runner, "import", out)
    assert result.exit_code == 0, result.output
    with SqliteEventLog(other) as log:
        assert log.sessions() == ["beta"]


def test_export_to_stdout(runner: CliRunner, data: Path) -> None:
    result = run(runner, "export", "beta", "--out", "-", "--data-dir", data)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [encode_event(e).decode() for e in simple_log(1, 1)]
    assert "exported 7 events" in result.stderr


def test_import_from_stdin(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "beta.jsonl"
    assert run(runner, "export", "beta", "--out", out, "--data-dir", data).exit_code == 0
    result = runner.invoke(app, ["import", "-", "--as", "delta", "--data-dir", str(data)], input=out.read_bytes())
    assert result.exit_code == 0, result.output
    assert "as session 'delta'" in result.stdout


def test_exporting_an_unknown_session_exits_2_and_writes_no_file(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "nope.jsonl"
    result = run(runner, "export", "nope", "--out", out, "--data-dir", data)
    assert result.exit_code == 2
    assert "SessionNotFound" in result.stderr
    assert "'nope' not found" in one_line(result.stderr)
    assert list(tmp_path.glob("*.jsonl")) == []
    assert list(tmp_path.glob(".nope.jsonl.*")) == []


def test_importing_a_bad_file_exits_2_naming_the_line(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "alpha.jsonl"
    assert run(runner, "export", "alpha", "--out", out, "--data-dir", data).exit_code == 0
    lines = out.read_bytes().split(b"\n")
    lines[7] = lines[7][:-3]  # break line 8
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines))
    result = run(runner, "import", bad, "--as", "broken", "--data-dir", data)
    assert result.exit_code == 2
    message = one_line(result.stderr)
    assert "ImportFailed: line 8:" in message
    assert "malformed JSON" in message
    assert "Nothing was imported" in message
    with SqliteEventLog(data) as log:
        assert log.sessions() == ["alpha", "beta"]


def test_importing_over_an_existing_session_exits_2(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "alpha.jsonl"
    assert run(runner, "export", "alpha", "--out", out, "--data-dir", data).exit_code == 0
    result = run(runner, "import", out, "--data-dir", data)
    assert result.exit_code == 2
    assert "SessionExists" in result.stderr
    assert "--as NEW_ID" in one_line(result.stderr)


def test_file_and_usage_errors_exit_2(runner: CliRunner, data: Path, tmp_path: Path) -> None:
    result = run(runner, "import", tmp_path / "missing.jsonl", "--data-dir", data)
    assert result.exit_code == 2
    assert "cannot read" in result.stderr
    result = run(runner, "export", "alpha", "--out", tmp_path / "no-such-dir" / "x.jsonl", "--data-dir", data)
    assert result.exit_code == 2
    assert "cannot write" in result.stderr
    result = run(runner, "export", "alpha", "--data-dir", data)  # --out is required
    assert result.exit_code == 2
