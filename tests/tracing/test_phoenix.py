"""The spans of `foldline demo` arrive at a real trace backend (Arize Phoenix, deploy/local/phoenix.sh) with the
figures of the log: OTLP over HTTP/protobuf and over gRPC, configured by the standard variables only; and on the
distributed backend the dispatcher's spans join the loop's trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from foldline.adapters.sqlite_log import DB_NAME, SqliteEventLog
from foldline.core.events import AssistantMessage, Envelope, RequestDispatch, ToolCall, ToolResult, TurnEnd, TurnStart
from foldline.core.usage import normalize_usage
from tests.distributed.conftest import distributed_env  # noqa: F401  (the fixture)

from .conftest import Phoenix

_CLI = "from foldline.cli.main import main; main()"


def _demo(tmp_path: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`foldline demo` in a process of its own (its exit flushes the spans), with ``env`` over this one's."""
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "demo", "--data-dir", str(tmp_path / "data"), "--json", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _otel(project: str, **more: str) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}", **more}


def _check_against_the_log(events_by_session: dict[str, list[Envelope]], spans: list[dict[str, Any]]) -> None:
    paused = {
        sid
        for sid, events in events_by_session.items()
        if sum(isinstance(e.data, TurnStart) for e in events) > sum(isinstance(e.data, TurnEnd) for e in events)
    }
    chats = {
        (s["attributes"]["gen_ai.conversation.id"], s["attributes"]["foldline.response.seq"]): s
        for s in spans
        if s["name"].startswith("chat ")
    }
    turns = {s["context"]["span_id"]: s for s in spans if s["name"] == "invoke_agent"}
    answered = 0
    for sid, events in events_by_session.items():
        dispatch: Envelope | None = None
        for e in events:
            if isinstance(e.data, RequestDispatch):
                dispatch = e
            elif isinstance(e.data, AssistantMessage) and e.data.usage is not None and dispatch is not None:
                span = chats[(sid, e.seq)]
                a = span["attributes"]
                usage = normalize_usage(e.data.usage)
                assert isinstance(dispatch.data, RequestDispatch)
                assert a["gen_ai.usage.input_tokens"] == usage.prompt
                assert a["gen_ai.usage.cache_read.input_tokens"] == e.data.usage.cache_read
                assert a["gen_ai.usage.cache_creation.input_tokens"] == e.data.usage.cache_write
                assert a["gen_ai.usage.output_tokens"] == e.data.usage.output
                assert a["gen_ai.response.id"] == e.data.provider_message_id
                assert a["foldline.seq"] == dispatch.seq
                assert a["foldline.request.digest"] == dispatch.data.digest
                assert span["parent_id"] in turns or sid in paused
                answered += 1
                dispatch = None
    assert answered == len(chats)
    # a tool runs (a span) once called, unless it waits for an approval: demo-approval's call has no result yet
    ran = {e.data.call_id for evs in events_by_session.values() for e in evs if isinstance(e.data, ToolResult)}
    calls = sum(
        1 for evs in events_by_session.values() for e in evs if isinstance(e.data, ToolCall) and e.data.call_id in ran
    )
    assert sum(1 for s in spans if s["name"].startswith("execute_tool ")) == calls


def _events(tmp_path: Path, sessions: list[str]) -> dict[str, list[Envelope]]:
    with SqliteEventLog(tmp_path / "data" / DB_NAME, read_only=True) as log:
        return {sid: log.read(sid) for sid in sessions}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_demos_spans_arrive_with_the_token_counts_of_the_log(
    phoenix: Phoenix, tmp_path: Path, protocol: str
) -> None:
    project = f"foldline-test-{uuid.uuid4().hex[:10]}"
    endpoint = phoenix.url if protocol == "http/protobuf" else phoenix.grpc
    env = _otel(project, OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    out = _demo(tmp_path, env, "--sessions", "2", "--steps", "4")
    sessions = [s["id"] for s in out["sessions"]]
    events = _events(tmp_path, sessions)
    # one chat span per request the log dispatched (demo-approval's paused step was sent: its answer waits)
    steps = sum(isinstance(e.data, RequestDispatch) for evs in events.values() for e in evs)
    assert steps >= sum(len(s["steps"]) for s in out["sessions"])
    # a turn's span ends with the turn: demo-approval's turn is still open (paused on an approval), so its span is not
    # exported yet and its chat spans have no parent to be found
    turns = sum(isinstance(e.data, TurnEnd) for evs in events.values() for e in evs)

    def complete(found: list[dict[str, Any]]) -> bool:  # every chat span and every turn's span has arrived
        kinds = Counter(s["name"].split(" ")[0] for s in found)
        return kinds["chat"] >= steps and kinds["invoke_agent"] >= turns

    spans = phoenix.wait_for(project, steps, until=complete)
    names = Counter(s["name"].split(" ")[0] for s in spans)
    assert names["chat"] == steps
    assert names["invoke_agent"] >= len(sessions)
    _check_against_the_log(events, spans)
    # Phoenix reads the GenAI attributes as an LLM span; nothing of the conversation is on a span by default
    assert all(s["span_kind"] == "LLM" for s in spans if s["name"].startswith("chat "))
    assert not any("gen_ai.input.messages" in s["attributes"] for s in spans)


@pytest.mark.kafka
@pytest.mark.redis
@pytest.mark.s3
def test_a_dispatchers_spans_join_the_loops_trace(
    phoenix: Phoenix,
    tmp_path: Path,
    distributed_env: dict[str, str],  # noqa: F811
) -> None:
    """Loop, projector and dispatcher in processes of their own: the step's hand-over carries the trace."""
    project = f"foldline-test-{uuid.uuid4().hex[:10]}"
    env = _otel(project, OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.url)
    args = ("--backend", "distributed", "--sessions", "1", "--steps", "3", "--dispatchers", "1")
    out = _demo(tmp_path, env, *args)
    steps = sum(len(s["steps"]) for s in out["sessions"])
    spans = phoenix.wait_for(project, 3 * steps + 1)
    by_id = {s["context"]["span_id"]: s for s in spans}
    dispatched = [s for s in spans if s["name"] in ("foldline.dispatch.prepare", "foldline.dispatch.send")]
    assert len(dispatched) >= 2 * steps
    for span in dispatched:
        parent = by_id[span["parent_id"]]
        assert parent["name"].startswith("chat ")
        assert parent["context"]["trace_id"] == span["context"]["trace_id"]
        assert parent["attributes"]["gen_ai.conversation.id"] == span["attributes"]["gen_ai.conversation.id"]
    assert any(s["name"] == "foldline.projector.apply" for s in spans)
    send = next(s for s in dispatched if s["name"] == "foldline.dispatch.send")
    assert (
        send["attributes"]["foldline.request.digest"]
        == by_id[send["parent_id"]]["attributes"]["foldline.request.digest"]
    )
