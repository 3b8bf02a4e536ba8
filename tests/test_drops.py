"""Cache-read drop classification from the log alone: table tests, properties, the CLI and the counters."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from foldline.adapters.memory_log import MemoryEventLog
from foldline.adapters.metered_log import MeteredEventLog
from foldline.adapters.sqlite_log import SqliteEventLog
from foldline.cli.main import app
from foldline.core import CallConfig, make_header
from foldline.core.content import TextBlock, ToolCallBlock, Usage
from foldline.core.drops import DROP_CAUSES, DropTracker, classify_session, session_drops
from foldline.core.events import (
    AssistantMessage,
    CompactionEnd,
    CompactionStart,
    CompactionSummary,
    Envelope,
    EventData,
    ReplaceOp,
    RequestDispatch,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnStart,
    UserMessage,
)
from foldline.core.header import HeaderReason
from foldline.core.validation import LogRules
from foldline.errors import StoreUnavailable
from foldline.metrics import LoopMetrics

runner = CliRunner()
T0 = 1_700_000_000_000


class StepLog:
    """A valid session log built step by step, with chosen usage and times."""

    def __init__(self, provider: str = "anthropic", model: str = "claude-emulated") -> None:
        self.config = CallConfig(provider, model, max_tokens=512)
        self.events: list[Envelope] = []
        self.surface: list[int] = []  # seqs of the visible surface entries
        self.time = T0
        self.turn = 0
        self.calls = 0
        self.system = "You are careful."
        self._add(TurnStart(0))

    def _add(self, *datas: EventData) -> StepLog:
        for data in datas:
            seq = len(self.events)
            self.events.append(Envelope(seq, self.time, data))
            op = getattr(data, "surface_op", None)
            if op == "append":
                self.surface.append(seq)
            elif isinstance(op, ReplaceOp):
                self.surface[op.start : op.end + 1] = [seq]
        return self

    def header(self, reason: HeaderReason, system: str | None = None) -> StepLog:
        self.system = system or self.system
        return self._add(RequestHeader(make_header(self.config, self.system), reason))

    def step(
        self, read: int, write: int = 0, *, after_s: float = 1.0, tool: bool = False, answer: bool = True
    ) -> StepLog:
        """Advance the clock by ``after_s``, then one step whose response reports the given usage."""
        self.time += int(after_s * 1000)
        n = sum(1 for e in self.events if isinstance(e.data, StepStart))
        self._add(StepStart(self.turn, n), UserMessage(f"u{len(self.events)}", (TextBlock(f"q{n}"),)))
        if n == 0 and not any(isinstance(e.data, RequestHeader) for e in self.events):
            self.header("initial")
        self._add(RequestDispatch(self.turn, n, "anthropic-messages", 1, "sha256:" + "0" * 64, 100))
        if not answer:
            return self._add(StepEnd(self.turn, n))
        usage = Usage(input=20, output=5, cache_read=read, cache_write=write)
        if tool:
            call = f"call-{self.calls}"
            self.calls += 1
            block = ToolCallBlock(call, "lookup", "{}")
            self._add(AssistantMessage(f"a{len(self.events)}", (block,), usage, "tool_use"))
            self._add(ToolCall(self.turn, n, call, "lookup", "{}"), ToolResult(call, "lookup", (TextBlock("x" * 50),)))
        else:
            self._add(AssistantMessage(f"a{len(self.events)}", (TextBlock("ok"),), usage, "end_turn"))
        return self._add(StepEnd(self.turn, n))

    def trim_last_tool_result(self) -> StepLog:
        seq = max(e.seq for e in self.events if isinstance(e.data, ToolResult))
        data = self.events[seq].data
        assert isinstance(data, ToolResult)
        pos = self.surface.index(seq)
        trimmed = ToolResult(data.call_id, data.name, (TextBlock("[trimmed]"),), False, ReplaceOp(pos, pos), (seq,))
        return self._add(trimmed)

    def compact(self) -> StepLog:
        hidden = tuple(self.surface)
        end = len(hidden) - 1
        return self._add(
            CompactionStart(0, end, 500),
            CompactionSummary("summary so far", self.config.provider, self.config.model, 256, Usage(100, 20)),
            UserMessage(
                f"c{len(self.events)}", (TextBlock("summary so far"),), "compaction", ReplaceOp(0, end), hidden
            ),
            CompactionEnd(),
        )

    def fork_seed(self) -> StepLog:
        return self._add(SessionEndSeed("parent", len(self.events))).header("resume")

    def valid(self) -> list[Envelope]:
        LogRules().check_batch(self.events)  # the scenarios are real logs, not shapes the log would refuse
        return self.events


def causes_of(log: StepLog) -> list[str | None]:
    return [v.drop.cause if v.drop else None for v in classify_session("s", log.valid())]


SCENARIOS: dict[str, tuple[Callable[[StepLog], StepLog], list[str | None]]] = {
    "steady growth, cold start": (
        lambda b: b.step(0, 1000).step(1000, 80).step(1080, 90),
        ["first-request", None, None],
    ),
    "warm first request is no drop": (lambda b: b.step(900, 100).step(1000, 50), [None, None]),
    "unexplained drop": (
        lambda b: b.step(0, 1000).step(1000, 80).step(400, 700),
        ["first-request", None, "unexplained"],
    ),
    "written but not read": (lambda b: b.step(0, 1041).step(0, 1100), ["first-request", "unexplained"]),
    "reading exactly the baseline": (
        lambda b: b.step(0, 1000).step(1000, 0).step(1000, 10),
        ["first-request", None, None],
    ),
    "header change": (
        lambda b: b.step(0, 1000).header("change", "You are terse.").step(100, 950),
        ["first-request", "header-change"],
    ),
    "resume": (lambda b: b.step(0, 1000).header("resume").step(0, 1100), ["first-request", "resume"]),
    "fork seed": (lambda b: b.step(0, 1000).fork_seed().step(0, 1100), ["first-request", "resume"]),
    "compaction": (
        lambda b: b.step(0, 1200).step(1200, 100).compact().step(300, 40),
        ["first-request", None, "compaction"],
    ),
    "trim": (
        lambda b: b.step(0, 1100, tool=True).step(1100, 60).trim_last_tool_result().step(900, 300),
        ["first-request", None, "trim"],
    ),
    "ttl expired": (lambda b: b.step(0, 1000).step(0, 1000, after_s=300), ["first-request", "cache-ttl"]),
    "just inside the ttl": (lambda b: b.step(0, 1000).step(0, 1000, after_s=299.9), ["first-request", "unexplained"]),
    "cause carried over an unanswered dispatch": (
        lambda b: b.step(0, 1000).header("change", "New rules.").step(0, 0, answer=False).step(0, 1000),
        ["first-request", "header-change"],
    ),
    "cause does not outlive its step": (
        lambda b: b.step(0, 1000).header("change", "New rules.").step(0, 1000).step(0, 1000),
        ["first-request", "header-change", "unexplained"],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_drop_causes_table(name: str) -> None:
    build, expected = SCENARIOS[name]
    assert causes_of(build(StepLog())) == expected


def test_several_causes_keep_precedence_and_all_are_listed() -> None:
    log = StepLog().step(0, 1000).header("change", "Other.").step(0, 1000, after_s=600)
    [_, drop] = session_drops("s", log.valid())
    assert drop.cause == "header-change"
    assert drop.causes == ("header-change", "cache-ttl")
    assert drop.gap_seconds == 600.0
    assert drop.baseline_tokens == 1000
    assert drop.lost_tokens == 1000
    assert drop.to_json()["explained"] is True


def test_ttl_is_per_provider() -> None:
    def build() -> StepLog:
        return StepLog(provider="openai", model="gpt-emulated").step(0, 0).step(1024, 0).step(0, 0, after_s=90)

    assert causes_of(build()) == ["first-request", None, "unexplained"]
    verdicts = classify_session("s", build().valid(), ttl_seconds={"openai": 60.0})
    assert [v.drop.cause if v.drop else None for v in verdicts] == ["first-request", None, "cache-ttl"]
    assert verdicts[2].provider == "openai"
    assert verdicts[2].model == "gpt-emulated"


def test_feeding_out_of_order_is_refused() -> None:
    events = StepLog().step(0, 1000).valid()
    tracker = DropTracker("s")
    with pytest.raises(ValueError, match="expected seq 0, got 1"):
        list(tracker.feed(events[1:]))


usage_steps = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 2000), st.floats(0.0, 400.0, allow_nan=False)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(steps=usage_steps, cut=st.integers(0, 200))
def test_drops_follow_the_definition_and_do_not_depend_on_batching(
    steps: list[tuple[int, int, float]], cut: int
) -> None:
    log = StepLog()
    for read, write, gap in steps:
        log.step(read, write, after_s=gap)
    events = log.valid()
    whole = classify_session("s", events)
    tracker = DropTracker("s")
    cut = min(cut, len(events))
    pieces = list(tracker.feed(events[:cut])) + list(tracker.feed(events[cut:]))
    assert pieces == whole
    assert len(whole) == len(steps)
    for i, verdict in enumerate(whole):
        read, _, gap = steps[i]
        if i == 0:
            assert (verdict.drop is not None) == (read == 0)
            continue
        baseline = steps[i - 1][0] + steps[i - 1][1]
        assert (verdict.drop is not None) == (read < baseline)
        if verdict.drop is not None:  # no event explains anything here: only time can
            assert verdict.drop.cause == ("cache-ttl" if round(gap * 1000) >= 300_000 else "unexplained")


# ---------------------------------------------------------------------------- the CLI


def _store(tmp_path: Path, sessions: dict[str, list[Envelope]]) -> Path:
    data = tmp_path / "data"
    with SqliteEventLog(data) as log:
        for sid, events in sessions.items():
            log.append(sid, 0, events)
    return data


def test_cli_lists_every_drop_with_its_cause(tmp_path: Path) -> None:
    data = _store(
        tmp_path,
        {
            "calm": StepLog().step(0, 1000).header("change", "Other.").step(10, 990).valid(),
            "noisy": StepLog().step(0, 1000).step(1000, 10).step(5, 1000).valid(),
        },
    )
    res = runner.invoke(app, ["drops", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sessions"] == 2
    assert out["counts"] == {**dict.fromkeys(DROP_CAUSES, 0), "first-request": 2, "header-change": 1, "unexplained": 1}
    assert [(d["session"], d["cause"], d["seq"]) for d in out["drops"]] == [
        ("calm", "first-request", 4),
        ("calm", "header-change", 10),
        ("noisy", "first-request", 4),
        ("noisy", "unexplained", 14),
    ]
    unexplained = out["drops"][3]
    assert (unexplained["cache_read_tokens"], unexplained["baseline_tokens"], unexplained["lost_tokens"]) == (
        5,
        1010,
        1005,
    )

    res = runner.invoke(app, ["drops", "calm", "--data-dir", str(data), "--fail-on-unexplained"])
    assert res.exit_code == 0, res.output
    assert "header-change" in res.stdout
    res = runner.invoke(app, ["drops", "--data-dir", str(data), "--unexplained", "--fail-on-unexplained"])
    assert res.exit_code == 1
    assert "noisy" in res.stdout
    assert "calm" not in res.stdout

    res = runner.invoke(app, ["drops", "nope", "--data-dir", str(data)])
    assert res.exit_code == 2
    assert "SessionNotFound" in res.output


# ---------------------------------------------------------------------------- the counters


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_metered_log_counts_what_the_log_says() -> None:
    registry = CollectorRegistry()
    metrics = LoopMetrics(registry)
    inner = MemoryEventLog()
    events = StepLog().step(0, 1100, tool=True).step(1100, 60).trim_last_tool_result().step(5, 300).valid()
    head = 5  # the first append is split so the later batches arrive mid-session
    inner.append("s", 0, events[:head])
    log = MeteredEventLog(inner, metrics)
    for i in range(head, len(events), 3):
        log.append("s", i, events[i : i + 3])
    pm = {"provider": "anthropic", "model": "claude-emulated"}
    assert _sample(registry, "foldline_steps_total", **pm) == 3
    assert _sample(registry, "foldline_step_cache_read_tokens_total", **pm) == 1105
    assert _sample(registry, "foldline_step_cache_write_tokens_total", **pm) == 1460
    assert _sample(registry, "foldline_step_input_tokens_total", **pm) == 60
    assert _sample(registry, "foldline_step_output_tokens_total", **pm) == 15
    assert _sample(registry, "foldline_step_cache_read_ratio_count", **pm) == 3
    assert _sample(registry, "foldline_trims_total") == 1
    # the initial header was in the part appended before metering began
    assert _sample(registry, "foldline_request_header_snapshots_total", reason="initial") == 0
    assert _sample(registry, "foldline_cache_read_drops_total", cause="first-request") == 1
    assert _sample(registry, "foldline_cache_read_drops_total", cause="trim") == 1
    assert registry.get_sample_value("foldline_cache_read_drops_total", {"cause": "unexplained"}) == 0  # exported
    assert _sample(registry, "foldline_cache_read_drop_tokens_total", cause="first-request", **pm) == 1120
    assert _sample(registry, "foldline_cache_read_drop_tokens_total", cause="trim", **pm) == 1160 - 5
    assert log.read("s") == events


def test_loop_metrics_refuse_an_unknown_cause_and_a_missing_history() -> None:
    metrics = LoopMetrics(CollectorRegistry())
    with pytest.raises(ValueError, match="unknown drop cause"):
        metrics.cache_read_drop("anthropic", "m", "gremlins")
    events = StepLog().step(0, 100).valid()
    with pytest.raises(ValueError, match="no history was given"):
        metrics.observe_events("s", events[3:])


class ReadCountingLog(MemoryEventLog):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[int, int | None]] = []

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        self.reads.append((from_seq, to_seq))
        return super().read(session_id, from_seq, to_seq)


def test_two_writers_each_count_their_own_appends_and_read_only_the_gaps() -> None:
    """A loop process writes turns, a dispatcher process writes requests and answers (the distributed path)."""
    events = (
        StepLog().step(0, 1100, tool=True).step(1100, 60).header("change", "Other.").step(10, 1200).step(5, 100).valid()
    )
    inner = ReadCountingLog()
    loop_registry, dispatcher_registry = CollectorRegistry(), CollectorRegistry()
    loop_log = MeteredEventLog(inner, LoopMetrics(loop_registry))
    dispatcher_log = MeteredEventLog(inner, LoopMetrics(dispatcher_registry))

    def by_dispatcher(e: Envelope) -> bool:
        return isinstance(e.data, RequestDispatch | AssistantMessage | ToolCall)

    i = 0
    while i < len(events):
        j = i
        while j < len(events) and by_dispatcher(events[j]) == by_dispatcher(events[i]):
            j += 1
        (dispatcher_log if by_dispatcher(events[i]) else loop_log).append("s", i, events[i:j])
        i = j
    reads = list(inner.reads)
    assert inner.read("s") == events
    assert all(to is not None and to > start for start, to in reads), reads  # gaps only, never from 0 again
    # each event is read once, by the writer that did not append it (nobody reads the last batch, a step/end)
    assert sorted(seq for start, to in reads if to is not None for seq in range(start, to)) == list(range(24))
    pm = {"provider": "anthropic", "model": "claude-emulated"}
    assert _sample(dispatcher_registry, "foldline_steps_total", **pm) == 4
    assert _sample(loop_registry, "foldline_steps_total", **pm) == 0
    assert _sample(dispatcher_registry, "foldline_step_cache_read_tokens_total", **pm) == 1115
    expected = {"first-request": 1, "header-change": 1, "unexplained": 1}
    for cause in DROP_CAUSES:
        assert _sample(dispatcher_registry, "foldline_cache_read_drops_total", cause=cause) == expected.get(cause, 0)
        assert _sample(loop_registry, "foldline_cache_read_drops_total", cause=cause) == 0
    assert _sample(loop_registry, "foldline_request_header_snapshots_total", reason="initial") == 1
    assert _sample(loop_registry, "foldline_request_header_snapshots_total", reason="change") == 1
    assert _sample(dispatcher_registry, "foldline_request_header_snapshots_total", reason="change") == 0


class FlakyReadLog(MemoryEventLog):
    def __init__(self) -> None:
        super().__init__()
        self.fail_reads = 0

    def read(self, session_id: str, from_seq: int = 0, to_seq: int | None = None) -> list[Envelope]:
        if self.fail_reads:
            self.fail_reads -= 1
            raise StoreUnavailable("the broker did not answer in time")
        return super().read(session_id, from_seq, to_seq)


def test_a_metrics_failure_never_fails_a_durable_append(caplog: pytest.LogCaptureFixture) -> None:
    events = StepLog().step(0, 1000).step(1000, 100).step(1100, 5).valid()
    inner = FlakyReadLog()
    registry = CollectorRegistry()
    log = MeteredEventLog(inner, LoopMetrics(registry))
    inner.append("s", 0, events[:6])  # written by another process: the metered log must read it
    inner.fail_reads = 1
    assert log.append("s", 6, events[6:12]) == 12  # durable, though its metrics could not be derived
    assert _sample(registry, "foldline_metrics_observation_errors_total", kind="StoreUnavailable") == 1
    assert "not recorded: StoreUnavailable" in caplog.text
    assert log.append("s", 12, events[12:]) == len(events)  # re-reads the session, counts what it wrote
    pm = {"provider": "anthropic", "model": "claude-emulated"}
    assert _sample(registry, "foldline_steps_total", **pm) == 1
    assert _sample(registry, "foldline_step_cache_read_tokens_total", **pm) == 1100
    assert inner.read("s") == events
