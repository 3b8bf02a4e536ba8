"""Log content is printed as literal text by every command: never read as markup, control characters escaped.

``show`` used to drop ``[demo-000]`` from the demo's own user message (Rich markup), an id or message
holding ``[/INST]``-like text crashed ``show``, ``diff``, ``drops``, ``resume`` and ``fork`` (after
``resume``/``fork`` had written), and escape sequences in content (clear screen, window title) reached
the terminal raw.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.output import escape_controls
from foldline.core import (
    AssistantMessage,
    CallConfig,
    RequestHeader,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    make_header,
)
from foldline.core.events import AttachmentQuarantine, EventData
from tests.adversarial.helpers import cli_env, demo, invoke, printable_output
from tests.factories import env

MARKUP = ["[/INST]", "[/]", "[bold red]", "[link=https://x.example]", "[demo-000]", "\\[x]", "[[", "]]", "[/bold"]
CONTROLS = ["\x1b[2J", "\x1b]0;owned\x07", "\x1b[31m", "\x00", "\x07", "\r", "\n", "\t", "\x9b1m", "\u202e", "\u2028"]
hostile_text = st.lists(
    st.one_of(st.sampled_from(MARKUP), st.sampled_from(CONTROLS), st.text(max_size=8)), min_size=1, max_size=8
).map("".join)
hostile_id = st.lists(st.sampled_from([*MARKUP, "a", "-", "é", " "]), min_size=1, max_size=6).map("".join)


def hostile_log(text: str) -> list[EventData]:
    """One turn with ``text`` in every place a log holds free text."""
    header = make_header(CallConfig("anthropic", "m"), f"system {text}")
    return [
        RequestHeader(header, "initial"),
        TurnStart(0),
        StepStart(0, 0),
        UserMessage("u3", (TextBlock(f"[demo-000] {text}"),)),
        AssistantMessage("a4", (TextBlock(text), ToolCallBlock("c1", "read", f'{{"q":{json.dumps(text)}}}')), Usage()),
        ToolCall(0, 0, "c1", "read", f'{{"q":{json.dumps(text)}}}'),
        ToolResult("c1", "read", (TextBlock(text),), is_error=True),
        StepEnd(0, 0),
        AttachmentQuarantine("sha256:" + "0" * 64, f"failure {text}", "recovery"),
        TurnEnd(0, "error"),
        RequestHeader(make_header(CallConfig("anthropic", "m"), f"system two {text}"), "resume"),
    ]


def write(data: Path, session: str, datas: list[EventData]) -> None:
    with SqliteEventLog(data) as log:
        log.append(session, 0, [env(i, d) for i, d in enumerate(datas)])


def test_the_demo_transcript_keeps_its_brackets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert demo(data, sessions=1, steps=2).code == 0
    out = invoke("show", "demo-000", "--data-dir", data)
    assert out.code == 0
    assert "(user) [demo-000] " in out.stdout


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=hostile_text, session=hostile_id)
def test_every_command_prints_hostile_text_literally(
    tmp_path_factory: pytest.TempPathFactory, text: str, session: str
) -> None:
    data = tmp_path_factory.mktemp("hostile")
    write(data, session, hostile_log(text))
    (data / "prompt.txt").write_text(f"system {text}")
    shown = escape_controls(text)
    for args in (
        ("show", "--", session),
        ("show", "--json", "--", session),
        ("diff", "--", session),
        ("drops",),
        ("verify",),
        ("sessions",),
        ("verify", "--json", "--", session),
        ("replay", "--system-file", data / "prompt.txt", "--", session),  # nothing dispatched: one typed line
    ):
        out = invoke(args[0], "--data-dir", data, *args[1:])
        assert out.code in ((2,) if args[0] == "replay" else (0, 3)), (args, out.stderr)  # 3: the quarantined step
        assert printable_output(out.stdout), (args, out.stdout)
        assert printable_output(out.stderr), (args, out.stderr)
    transcript = invoke("show", "--data-dir", data, "--", session).stdout
    assert escape_controls(session) in transcript
    assert f"(user) [demo-000] {shown}"[:60] in transcript
    assert f"ERROR: {shown}"[:40] in transcript
    assert f"failure {shown}"[:40] in transcript
    events = [
        json.loads(line) for line in invoke("show", "--json", "--data-dir", data, "--", session).stdout.splitlines()
    ]
    assert events[3]["data"]["content"][0]["text"] == f"[demo-000] {text}"  # --json: the events themselves
    # diff compares the system prompt line by line: what a line break splits is on the next line
    first_line = escape_controls(f"system two {text}".splitlines()[0])
    diff = invoke("diff", "--data-dir", data, "--", session).stdout
    assert " ".join(f"+{first_line}"[:40].split()) in " ".join(diff.split())


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session=hostile_id, child=hostile_id)
def test_resume_and_fork_of_markup_ids_write_and_print(
    tmp_path_factory: pytest.TempPathFactory, session: str, child: str
) -> None:
    data = tmp_path_factory.mktemp("ids")
    assert invoke("demo", "--sessions", "1", "--steps", "2", "--data-dir", data, "--json").code == 0
    source = data / "demo.jsonl"
    assert invoke("export", "demo-000", "-o", source, "--data-dir", data).code == 0
    assert invoke("import", source, "--as", session, "--data-dir", data).code == 0
    out = invoke("resume", "--steps", "1", "--data-dir", data, "--", session)
    assert out.code == 0, out.stderr
    assert f"resumed {escape_controls(session)}" in out.stdout
    if child == session:
        return
    at = next(e.seq for e in SqliteEventLog(data, read_only=True).read(session) if isinstance(e.data, StepEnd))
    out = invoke("fork", "--at", str(at), "--as", child, "--data-dir", data, "--", session)
    assert out.code == 0, out.stderr
    assert f"→ {escape_controls(child)}" in out.stdout
    assert invoke("diff", "--data-dir", data, "--", child).code == 0
    assert invoke("drops", "--data-dir", data).code == 0


def test_error_messages_quote_hostile_input_escaped(tmp_path: Path) -> None:
    out = invoke("show", "x\x1b]0;owned\x07", "--data-dir", tmp_path)
    assert out.code == 2
    assert printable_output(out.stderr)
    assert "\\x1b" in out.stderr or "U+001B" in out.stderr
    out = invoke("show", "[bold red]nope[/]", "--data-dir", tmp_path)
    assert out.code == 2
    assert "'[bold red]nope[/]' not found" in " ".join(out.stderr.split())


_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # the colours Rich itself writes on a terminal


def on_a_terminal(*args: str | Path) -> bytes:
    """What a terminal receives from the command (its stdout and stderr on a pseudo-terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "foldline.cli", *map(str, args)],
        stdout=slave,
        stderr=slave,
        env=cli_env(TERM="xterm-256color", COLUMNS="100"),
    )
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(master)
    return b"".join(chunks)


def test_a_terminal_gets_no_escape_sequence_from_the_log(tmp_path: Path) -> None:
    text = "clear\x1b[2J title\x1b]0;owned\x07 bell\x07 rtl\u202eevil csi\x9b31m"
    write(tmp_path, "s", hostile_log(text))
    for args in (("show", "s"), ("diff", "s"), ("verify",), ("sessions",)):
        raw = _SGR.sub(b"", on_a_terminal(*args, "--data-dir", tmp_path))
        text_out = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
        assert printable_output(text_out), (args, text_out)
        if args[0] == "show":
            assert "clear\\x1b[2J title\\x1b]0;owned\\x07" in text_out


def test_requests_escapes_what_a_terminal_acts_on_and_json_keeps_the_exact_body(tmp_path: Path) -> None:
    """`requests` prints each wire body as the same JSON value with a right-to-left override (and every other
    character a terminal acts on that JSON may leave raw) escaped, as `show` does; `--json` keeps the body's
    value and digest exact."""
    import asyncio

    from foldline.core.codec import digest_bytes
    from foldline.loop import Agent, AgentOptions
    from foldline.providers.emulated import emulated_provider

    text = "rtl\u202eevil del\x7f csi\x9b31m line\u2028sep"
    with SqliteEventLog(tmp_path) as log:
        agent = Agent(
            "s", log, emulated_provider("anthropic"), AgentOptions(CallConfig("anthropic", "m", max_tokens=64))
        )
        asyncio.run(agent.run_turn(text))
        sent = agent.provider.serializer.serialize(agent.last_request, None) if agent.last_request else b""
    assert text.encode() in sent  # the wire body holds the characters raw: they are the model's input
    human = invoke("requests", "s", "--data-dir", tmp_path)
    assert human.code == 0, human.stderr
    assert printable_output(human.stdout)
    assert "rtl\\u202eevil" in human.stdout
    assert [json.loads(line) for line in human.stdout.splitlines()] == [json.loads(sent)]
    rows = [json.loads(line) for line in invoke("requests", "s", "--json", "--data-dir", tmp_path).stdout.splitlines()]
    assert [r["body"] for r in rows] == [json.loads(sent)]
    assert rows[0]["digest"] == rows[0]["recordedDigest"] == digest_bytes(sent)
