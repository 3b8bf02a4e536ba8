"""Every failure is typed and one line — never a traceback, never exit 1 for a user error.

A data dir that is a file, a new data dir whose name has a dot (``run.2024`` became a SQLite *file*), a
port already in use for ``emulator``, a binary ``--system-file``, ``--model ''`` and a corrupted database
file all ended in tracebacks with exit 1.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldline.adapters.sqlite_log import SqliteEventLog
from tests.adversarial.helpers import assert_one_line_error, demo, invoke, printable_output, run
from tests.adversarial.test_read_only import as_reader
from tests.factories import simple_log

READING = (("sessions",), ("show", "demo-000"), ("verify",), ("diff", "demo-000"), ("drops",), ("requests", "demo-000"))
WRITING = (("resume", "demo-000", "--steps", "1"), ("fork", "demo-000", "--at", "0"))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("good") / "data"
    assert demo(data, sessions=1, steps=2).code == 0
    return data


@pytest.fixture(scope="module")
def export(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "demo-000.jsonl"
    assert invoke("export", "demo-000", "-o", out, "--data-dir", good).code == 0
    return out


def test_a_data_dir_that_is_a_file(tmp_path: Path, export: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    for args in (*READING, *WRITING, ("import", export), ("demo", "--steps", "1"), ("export", "x", "-o", "o")):
        assert_one_line_error(invoke(args[0], "--data-dir", afile, *args[1:]), "ConfigError", "is a file")
    assert afile.read_text() == "mine"


def test_a_data_dir_with_a_dot_in_its_name_is_a_directory(tmp_path: Path, export: Path) -> None:
    for name in ("run.2024", "v1.2.3", "data.db.d"):
        data = tmp_path / name
        assert invoke("import", export, "--data-dir", data).code == 0
        assert data.is_dir()
        assert (data / "log.sqlite3").is_file()
        assert invoke("verify", "--data-dir", data).code == 0
    data = tmp_path / "demo.2024"
    assert demo(data, sessions=1, steps=1).code == 0
    assert (data / "log.sqlite3").is_file()


def test_a_port_in_use_for_the_emulator(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        out = run("emulator", "--port", str(port))
        assert_one_line_error(out, "ConfigError", "in use", "--port")
        out = invoke("demo", "--steps", "1", "--metrics-port", str(port), "--data-dir", tmp_path / "d")
        assert_one_line_error(out, "MetricsServerError")
    finally:
        taken.close()


def test_bad_system_files_and_models(tmp_path: Path, good: Path) -> None:
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\x00more")
    for path, needle in (
        (binary, "not UTF-8"),
        (latin, "not UTF-8"),
        (nul, "NUL"),
        (tmp_path, "cannot read"),
        (tmp_path / "missing.txt", "cannot read"),
    ):
        out = invoke("fork", "demo-000", "--at", "0", "--system-file", path, "--data-dir", good)
        assert_one_line_error(out, "InputError", needle)
    for model in ("", "   ", "m\x1b[2J", "x" * 300):
        for args in (("fork", "demo-000", "--at", "0", "--model", model), ("resume", "demo-000", "--model", model)):
            assert_one_line_error(invoke(args[0], "--data-dir", good, *args[1:]), "ConfigError", "--model")
    with SqliteEventLog(good, read_only=True) as log:
        # nothing was written by any
        assert log.sessions() == ["demo-000", "demo-approval", "demo-responses", "demo-structured", "demo-think"]


def corrupt_dirs(root: Path, good: Path) -> dict[str, Path]:
    """Data dirs whose log file is damaged in the ways a disk, a copy or a person damages it."""
    source = (good / "log.sqlite3").read_bytes()
    out: dict[str, Path] = {}

    def make(name: str, body: bytes | None = None) -> Path:
        d = root / name
        d.mkdir()
        if body is not None:
            (d / "log.sqlite3").write_bytes(body)
        out[name] = d
        return d

    make("random", bytes(range(256)) * 64)
    make("truncated", source[: len(source) // 3])
    make("zeroed-header", b"\0" * 100 + source[100:])
    flipped = bytearray(source)
    for i in range(4096, len(flipped), 97):
        flipped[i] ^= 0xFF
    make("flipped-pages", bytes(flipped))
    other = make("another-app")
    conn = sqlite3.connect(other / "log.sqlite3")
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.commit()
    conn.close()
    newer = make("newer-format", source)
    conn = sqlite3.connect(newer / "log.sqlite3")
    conn.execute("UPDATE meta SET value='7' WHERE key='format_version'")
    conn.commit()
    conn.close()
    rows = make("bad-rows", source)
    conn = sqlite3.connect(rows / "log.sqlite3")
    conn.execute("UPDATE events SET body=x'7b226e6f74223a' WHERE seq=1")  # '{"not":' — a row that is not an event
    conn.commit()
    conn.close()
    return out


#: Damage a command may not meet: flipped bytes in pages it never reads, a bad row before the one it reads.
MAY_NOT_NOTICE = {
    "flipped-pages": ("sessions", "drops", "diff", "export", "show", "import"),
    "bad-rows": ("sessions", "import"),  # the new session's rows are fine; the damaged one is not read
}


def test_a_damaged_database_is_a_typed_line_for_every_command(tmp_path: Path, good: Path, export: Path) -> None:
    for name, data in corrupt_dirs(tmp_path, good).items():
        before = (data / "log.sqlite3").read_bytes()
        for args in (*READING, *WRITING, ("import", export, "--as", "copy"), ("export", "demo-000", "-o", "x")):
            out = invoke(args[0], "--data-dir", data, *args[1:])
            if out.code == 0 and args[0] in MAY_NOT_NOTICE.get(name, ()):
                continue  # the damage lies where this command does not read
            line = assert_one_line_error(out)
            assert any(kind in line for kind in ("StoreUnavailable", "FormatError", "SessionNotFound")), (name, line)
        if name == "another-app":
            assert (data / "log.sqlite3").read_bytes() == before  # never written into
    assert_one_line_error(
        invoke("demo", "--keep", "--steps", "1", "--data-dir", tmp_path / "another-app"), "not a foldline log"
    )


def test_a_locked_database(tmp_path: Path, export: Path, good: Path) -> None:
    holder = sqlite3.connect(good / "log.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        quick = {"FOLDLINE_SQLITE_BUSY_TIMEOUT": "0.2"}
        out = invoke("import", export, "--as", "copy", "--data-dir", good, env=quick)
        assert_one_line_error(out, "StoreBusy", "locked by another writer", "Nothing was written")
        assert_one_line_error(invoke("resume", "demo-000", "--data-dir", good, env=quick), "StoreBusy")
        assert invoke("verify", "--data-dir", good).code == 0  # readers are never blocked
        assert invoke("show", "demo-000", "--data-dir", good).code == 0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with SqliteEventLog(good, read_only=True) as log:
        assert log.sessions() == ["demo-000", "demo-approval", "demo-responses", "demo-structured", "demo-think"]


def test_unreadable_inputs(tmp_path: Path, export: Path) -> None:
    data = tmp_path / "data"
    locked = tmp_path / "locked.jsonl"
    locked.write_bytes(export.read_bytes())
    locked.chmod(0)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 1000)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"sessionId":"caf\xe9"}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for path, kind in (
        (tmp_path, "InputError"),
        (tmp_path / "missing.jsonl", "InputError"),
        (junk, "ImportFailed"),
        (latin, "ImportFailed"),
        (empty, "ImportFailed"),
    ):
        assert_one_line_error(invoke("import", path, "--data-dir", data), kind)
    line = assert_one_line_error(run("import", locked, "--data-dir", data, preexec=as_reader()))
    assert "not readable" in line or "ermission denied" in line
    with SqliteEventLog(data, read_only=True) as log:
        assert log.sessions() == []


def test_usage_errors_are_one_line_too(tmp_path: Path) -> None:
    for args in (
        ("show",),
        ("show", "s", "--no-such-option"),
        ("verify", "--data-dir"),
        ("demo", "--steps", "many"),
        ("demo", "--steps", "0"),
        ("requests", "s", "--provider", "gemini", "--data-dir", tmp_path),
        ("nosuchcommand",),
        ("emulator", "--port", "70000"),
        ("show", "--no-such-\x1b[2J"),
    ):
        line = assert_one_line_error(invoke(*args), "UsageError")
        assert printable_output(line)


def test_every_command_documents_json_output() -> None:
    """Machine-readable output on every command."""
    from foldline.cli.main import app

    names = [c.name for c in app.registered_commands]
    assert len(names) >= 14
    for name in names:
        assert name is not None
        assert "--json" in invoke(name, "--help").stdout, name


VOCABULARY = st.sampled_from(
    [
        "sessions", "show", "verify", "diff", "drops", "requests", "export", "import", "fork", "config", "restore",
        "doctor", "replay",
        "--json", "--at", "--as", "--step", "--provider", "--out", "-o", "--model", "--system-file", "--attachments",
        "--all", "--live", "--export", "--tools", "--config-file",
        "demo-000", "nope", "-", "0", "-1", "99999999999999999999", "anthropic", "", "[/INST]", "\x1b[2J", "a\nb",
        "x" * 300,
    ]
)  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(VOCABULARY, min_size=1, max_size=6))
def test_no_command_line_crashes(argv: list[str], good: Path, tmp_path: Path) -> None:
    """Any combination of commands, options and hostile values ends with a known status and, on failure,
    one typed line — never a traceback."""
    data = tmp_path / "fuzz"  # a copy: a fork or an import here must not reach the other tests' log
    if not data.exists():
        shutil.copytree(good, data)
    out = invoke(*argv, "--data-dir", data)
    assert out.code in (0, 1, 2, 3, 4), out
    assert "Traceback" not in out.stderr
    if out.code == 2 and out.stderr.strip():
        assert_one_line_error(out)
    assert printable_output(out.stderr)


def test_the_log_copies_nothing_of_a_failed_import(tmp_path: Path) -> None:
    """The typed failures of the store itself roll back whole batches (the sessions stay as they were)."""
    with SqliteEventLog(tmp_path) as log:
        log.append("s", 0, simple_log(1, 1))
        assert log.sessions() == ["s"]


@pytest.mark.parametrize(
    "env",
    [
        {"FOLDLINE_ANTHROPIC_URL": "http://127.0.0.1:8089"},
        {"FOLDLINE_OPENAI_URL": "https://api.openai.com/v1"},
        {"FOLDLINE_DEEPSEEK_COMPATIBLE": "deepseek=https://api.deepseek.com"},
    ],
)
def test_demo_and_resume_refuse_a_provider_server_they_would_not_use(env: dict[str, str], tmp_path: Path) -> None:
    """`foldline config` shows the server as the provider's; the demo (and resume) answer through the built-in
    emulator, so they refuse to run rather than ignore it — one typed line, nothing written."""
    (variable,) = env
    shown = json.loads(invoke("config", "--json", env=env).stdout)
    assert any(row["env"] == variable and row["value"] == env[variable] for row in shown.values())
    data = tmp_path / "data"
    out = invoke("demo", "--sessions", "1", "--steps", "1", "--data-dir", data, env=env)
    assert_one_line_error(
        out, "ConfigError", "foldline demo answers every request with the built-in emulator", variable
    )
    assert not data.exists()
    assert demo(data, sessions=1, steps=1).code == 0
    out = invoke("resume", "demo-000", "--steps", "1", "--data-dir", data, env=env)
    assert_one_line_error(out, "ConfigError", "foldline resume", variable)
