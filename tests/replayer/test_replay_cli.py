"""`foldline replay` over the sessions `foldline demo` records: unchanged, and with each kind of change."""

from __future__ import annotations

import json
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core.events import RequestDispatch, SessionEndSeed
from foldline.demo import demo_toolset
from tests.factories import LogBuilder

runner = CliRunner()
TOOL_NAMES = [s.name for s in demo_toolset().specs()]  # lookup, word_count, checksum


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("replay-cli") / "data"
    res = runner.invoke(app, ["demo", "--data-dir", str(path), "--json"])
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture(scope="module")
def dispatches(data: Path) -> dict[str, int]:
    with SqliteEventLog(data, read_only=True) as log:
        return {sid: sum(1 for e in log.read(sid) if isinstance(e.data, RequestDispatch)) for sid in log.sessions()}


def replay(*args: str, code: int) -> dict[str, Any]:
    res = runner.invoke(app, ["replay", *args, "--json"])
    assert res.exit_code == code, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def error_line(*args: str) -> str:
    res = runner.invoke(app, ["replay", *args])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def own_requests(data: Path, sid: str) -> int:
    """The requests of a session's own loop instances (a fork child's seed holds its parent's)."""
    with SqliteEventLog(data, read_only=True) as log:
        events = log.read(sid)
    seed = max((e.seq for e in events if isinstance(e.data, SessionEndSeed)), default=-1)
    return sum(1 for e in events if isinstance(e.data, RequestDispatch) and e.seq > seed)


def test_the_demo_sessions_replay_identically_without_a_change(data: Path, dispatches: dict[str, int]) -> None:
    out = replay("--all", "--data-dir", str(data), code=0)
    assert out["status"] == "identical"
    sessions = {s["session"]: s for s in out["sessions"]}
    assert (
        sorted(sessions)
        == sorted(dispatches)
        == [
            "demo-000",
            "demo-001",
            "demo-002",
            "demo-003",
            "demo-approval",
            "demo-responses",
            "demo-structured",
            "demo-think",
        ]
    )
    for sid, s in sessions.items():
        assert s["status"] == "identical"
        assert s["divergence"] is None
        assert s["identical"] == s["requests"] == own_requests(data, sid) > 0
    assert sessions["demo-003"]["parent"] == "demo-000"
    assert out["cost"]["cacheWriteTokens"] == 0
    res = runner.invoke(app, ["replay", "demo-000", "demo-001", "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    assert "✓ demo-000  identical: 24/24 requests" in res.stdout
    assert "status: identical (exit 0)" in res.stdout


def test_a_changed_system_prompt_diverges_every_session_at_its_first_request_in_system(
    data: Path, tmp_path: Path
) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You are a terse research agent. Use the tools.")
    out = replay("--all", "--system-file", str(prompt), "--data-dir", str(data), code=1)
    assert out["status"] == "diverged"
    for s in out["sessions"]:
        d = s["divergence"]
        assert s["status"] == "diverged"
        assert s["identical"] == 0
        assert (d["request"], d["kind"], [f["path"] for f in d["fields"]]) == (0, "header", ["system"]), s["session"]
        assert d["fields"][0]["new"] == "You are a terse research agent. Use the tools."
        assert d["systemDiff"][-1] == "+You are a terse research agent. Use the tools."
        assert d["byte"]["offset"] > 0
        assert d["cause"] == "change"
        assert 0 < d["cost"]["prefix"]["share"] < 1  # the tools before the system prompt stay cacheable
        assert d["cost"]["prefix"]["stopsAt"] == "system"
    fork = next(s for s in out["sessions"] if s["session"] == "demo-003")
    assert fork["divergence"]["turn"] > 0  # its first own step, after the seed from demo-000
    assert fork["divergence"]["cost"]["cacheWriteTokens"] > 0  # it read its parent's prefix from the cache
    assert out["cost"]["cacheWriteTokens"] == sum(s["divergence"]["cost"]["cacheWriteTokens"] for s in out["sessions"])


def test_a_changed_tool_description_diverges_in_that_tool(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "changed_tools.py").write_text(
        textwrap.dedent(
            """
            from foldline.core.header import ToolSpec
            from foldline.demo import demo_toolset
            from foldline.loop import Toolset

            def toolset() -> Toolset:
                demo = demo_toolset()
                out = Toolset()
                for spec in demo.specs():
                    if spec.name == "word_count":
                        spec = ToolSpec(spec.name, "Count the words of a text.", spec.input_schema)
                    out.add(lambda **kw: "", spec)
                return out
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    out = replay("--all", "--tools", "changed_tools:toolset", "--data-dir", str(data), code=1)
    i = TOOL_NAMES.index("word_count")
    for s in out["sessions"]:
        d = s["divergence"]
        paths = [f["path"] for f in d["fields"]]
        # demo-approval also offers publish_note (tools[3]), which the changed toolset leaves out
        extra = ["tools[3]"] if s["session"] == "demo-approval" else []
        assert (d["request"], paths) == (0, [f"tools[{i}].description", *extra]), s["session"]
        assert d["toolsChanged"][0] == "word_count"
        assert d["fields"][0]["new"] == "Count the words of a text."
        assert d["cost"]["prefix"]["stopsAt"] == f"tools[{i}]"


def test_a_model_change_diverges_in_config_model(data: Path) -> None:
    out = replay("--all", "--model", "claude-next", "--data-dir", str(data), code=1)
    for s in out["sessions"]:
        d = s["divergence"]
        assert (d["request"], [f["path"] for f in d["fields"]]) == (0, ["config.model"]), s["session"]
        assert d["fields"][0]["new"] == "claude-next"
        assert d["cost"]["prefix"]["share"] == 0  # a cache belongs to one model
        assert d["cost"]["prefix"]["stopsAt"] == "config.model"


def test_a_config_file_changes_the_fields_it_names(data: Path, tmp_path: Path) -> None:
    toml = tmp_path / "config.toml"
    toml.write_text("maxTokens = 300\ntemperature = 0.5\n")
    out = replay("demo-002", "--config-file", str(toml), "--data-dir", str(data), code=1)
    d = out["sessions"][0]["divergence"]
    assert [f["path"] for f in d["fields"]] == ["config.maxTokens", "config.temperature"]
    assert [(f["old"], f["new"]) for f in d["fields"]] == [(512, 300), (None, 0.5)]
    same = tmp_path / "same.json"
    same.write_text('{"maxTokens": 512}')
    assert replay("demo-002", "--config-file", str(same), "--data-dir", str(data), code=0)["status"] == "identical"


def test_junit_and_text_reports(data: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Be brief.")
    junit = tmp_path / "replay.xml"
    res = runner.invoke(
        app, ["replay", "--all", "--system-file", str(prompt), "--junit", str(junit), "--data-dir", str(data)]
    )
    assert res.exit_code == 1, res.output
    assert "✗ demo-000  diverged at request 0 of 24: turn 0 step 0" in res.stdout
    assert "header differs in system" in res.stdout
    assert "status: diverged (exit 1)" in res.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("8", "8", "0")
    failures = [c.find("failure") for c in suite.iter("testcase")]
    assert all(f is not None and "system" in (f.get("message") or "") for f in failures)
    res = runner.invoke(app, ["replay", "--all", "--junit", str(junit), "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("8", "0")


def test_export_files_replay_with_their_attachments(data: Path, tmp_path: Path) -> None:
    export, objects = tmp_path / "demo-001.jsonl", tmp_path / "objects"
    res = runner.invoke(
        app, ["export", "demo-001", "--out", str(export), "--attachments", str(objects), "--data-dir", str(data)]
    )
    assert res.exit_code == 0, res.output
    nowhere = tmp_path / "no-data-dir"  # an export needs no data directory
    out = replay("--export", str(export), "--attachments", str(objects), "--data-dir", str(nowhere), code=0)
    assert [(s["session"], s["origin"], s["status"]) for s in out["sessions"]] == [
        ("demo-001", str(export), "identical")
    ]
    assert not nowhere.exists()
    # live into another data directory: the child's seed carries the image, which comes along into its store
    other = tmp_path / "other"
    live = ["--model", "claude-next", "--live", "--tools", "foldline.demo:demo_toolset", "--as", "imaged"]
    out = replay("--export", str(export), "--attachments", str(objects), *live, "--data-dir", str(other), code=1)
    assert out["sessions"][0]["live"]["written"] is True
    assert runner.invoke(app, ["verify", "imaged", "--data-dir", str(other)]).exit_code == 0
    line = error_line("--export", str(export), "--data-dir", str(nowhere))  # its image is not at hand
    assert line.startswith("error: ReplayError: session 'demo-001': at turn 0 step 0 the changed agent failed: ")
    assert "AttachmentNotFound" in line


def test_bad_input_is_one_typed_line(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a session with no dispatch records
    plain = tmp_path / "plain"
    with SqliteEventLog(plain) as log:
        log.append("plain", 0, LogBuilder().header().turn(0, "hi").events, lease=log.acquire("plain"))
    line = error_line("plain", "--data-dir", str(plain))
    assert line.startswith("error: NothingToReplay: session 'plain': it holds no request/dispatch record")
    # --all skips it, and fails when nothing else is left
    assert error_line("--all", "--data-dir", str(plain)).startswith("error: NothingToReplay: no session of the log")
    # an export from a newer format version
    export = tmp_path / "demo-002.jsonl"
    assert runner.invoke(app, ["export", "demo-002", "--out", str(export), "--data-dir", str(data)]).exit_code == 0
    head, rest = export.read_bytes().split(b"\n", 1)
    newer = tmp_path / "newer.jsonl"
    newer.write_bytes(head.replace(b'"formatVersion":0', b'"formatVersion":1') + b"\n" + rest)
    line = error_line("--export", str(newer))
    assert line.startswith(f"error: InputError: export {newer}: line 1: bad export header: formatVersion 1")
    # a tools module that fails to import
    (tmp_path / "broken_tools.py").write_text("raise RuntimeError('the tools need a database')\n")
    monkeypatch.chdir(tmp_path)
    line = error_line("demo-000", "--tools", "broken_tools:toolset", "--data-dir", str(data))
    assert line == (
        "error: InvalidChange: --tools broken_tools:toolset: module 'broken_tools' failed to import: "
        "RuntimeError: the tools need a database"
    )
    assert "is a int, not a Toolset" in error_line(
        "demo-000", "--tools", "textwrap:TextWrapper.__init__.__code__.co_argcount", "--data-dir", str(data)
    )
    # a config file with unknown keys, or not JSON
    bad = tmp_path / "bad.json"
    bad.write_text('{"maxTokens": 10, "max_tokens": 10, "topP": 1}')
    line = error_line("demo-000", "--config-file", str(bad), "--data-dir", str(data))
    assert line.startswith(
        f"error: InvalidChange: --config-file {bad} names unknown call-config field(s) max_tokens, topP"
    )
    bad.write_text("{")
    assert "is not valid JSON" in error_line("demo-000", "--config-file", str(bad), "--data-dir", str(data))
    # usage
    assert "name sessions to replay" in error_line("--data-dir", str(data))
    assert "add --live" in error_line("demo-000", "--as", "x", "--data-dir", str(data))
    assert "SessionNotFound" in error_line("nope", "--data-dir", str(data))


def test_live_goes_on_past_the_divergence_as_a_fork_child(data: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("You are a terse research agent. Use the tools.")
    args = ["--system-file", str(prompt), "--live", "--tools", "foldline.demo:demo_toolset"]
    out = replay("demo-002", *args, "--data-dir", str(data), code=1)
    live = out["sessions"][0]["live"]
    assert (live["child"], live["parent"], live["written"]) == ("demo-002.replay", "demo-002", False)
    assert live["steps"] > 0
    assert live["verified"] == live["checked"] == live["steps"]
    with SqliteEventLog(data, read_only=True) as log:
        assert "demo-002.replay" not in log.sessions()  # in memory only
    # --as writes the child into the log: lineage to the parent, every request verified
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    out = replay("demo-002", *args, "--as", "demo-002-terse", "--data-dir", str(copy), code=1)
    assert out["sessions"][0]["live"]["written"] is True
    res = runner.invoke(app, ["diff", "demo-002-terse", "--data-dir", str(copy), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["lineage"]["parentId"] == "demo-002"
    assert runner.invoke(app, ["verify", "demo-002-terse", "--data-dir", str(copy)]).exit_code == 0
    assert "SessionExists" in error_line("demo-002", *args, "--as", "demo-002-terse", "--data-dir", str(copy))
    # going on live needs the agent's tools: the model calls them
    line = error_line("demo-002", "--system-file", str(prompt), "--live", "--data-dir", str(data))
    assert line.startswith("error: InvalidChange: going on live runs the tools the model calls")


def test_hostile_text_in_a_change_and_a_log_is_printed_literally(data: Path, tmp_path: Path) -> None:
    from tests.adversarial.helpers import printable_output

    hostile = "Be \x1b[2Jterse\u202e\x07 and \x9b31m quick.\nSecond line\r\x00."
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(hostile.replace("\x00", "").encode())
    res = runner.invoke(app, ["replay", "demo-000", "--system-file", str(prompt), "--data-dir", str(data)])
    assert res.exit_code == 1, res.output
    assert printable_output(res.stdout), res.stdout
    assert "terse\\u202e" in res.stdout  # the body's bytes around the difference, escaped
    res = runner.invoke(app, ["replay", "demo-000", "--system-file", str(prompt), "--data-dir", str(data), "--json"])
    assert res.exit_code == 1, res.output
    assert printable_output(res.stdout)
    fields = json.loads(res.stdout)["sessions"][0]["divergence"]["fields"]
    assert fields[0]["new"] == hostile.replace("\x00", "")  # the JSON value is the text itself
